"""Attention forward (FlashAttention-2 style) and the combine of a split key range.

    o = softmax(cap(q k^T * scale)) v,   lse = log(sum_j exp(cap(q k^T * scale)_j))

per query row over the keys it sees, with an online softmax over key blocks: fp32 running
max m and sum l in base 2, the output accumulated in fp32 and divided by l once at the
end. The key loop runs the boundary blocks (the mask) and then the interior blocks (no
mask; see common.py). m starts at FLOOR, not -inf, so no step tests for a row that saw
nothing yet. A row that sees no key (or only -inf scores) gets o = 0 and lse = -inf. A row
whose softmax is NaN (a NaN among the scores it sees, or a +inf: exp(inf - inf)) gets o =
NaN and lse = NaN (+inf for a +inf score), as float64 does: l is then NaN, which no test
of "saw a key" may take for 0.
"""

import triton
import triton.language as tl

from speedlight.kernels.attention.common import (FLOOR, LOG2E, _block, _blocks, _capped,
                                                 _edge_start, _guarded, _keys_seen,
                                                 _load_rows, _nonfinite_products, _operand,
                                                 _program, _seen, _sequence)


@triton.jit
def _load_kv(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn,
             MASKED: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """(k^T [BLOCK_D, BLOCK_N], v [BLOCK_N, BLOCK_D]) of keys start_n + [0, BLOCK_N): by
    the tensor descriptors k_src, v_src with TMA (rows past the sequence are zeros), else
    from the sequence's first rows k_src, v_src by pointer, masked past seq_k only in a
    boundary block (MASKED); fp32 when UPCAST."""
    if TMA:
        k_t = tl.trans(k_src.load([start_n, 0]))  # [BN, D] -> [D, BN]
        v = v_src.load([start_n, 0])
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_k = mask_d[:, None]
        mask_v = mask_d[None, :]
        if MASKED:
            mask_k &= offs_n[None, :] < seq_k
            mask_v &= offs_n[:, None] < seq_k
        k_t = tl.load(k_src + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
                      mask=mask_k, other=0.0)
        v = tl.load(v_src + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
                    mask=mask_v, other=0.0)
    if UPCAST:
        k_t = k_t.to(tl.float32)
        v = v.to(tl.float32)
    return k_t, v


@triton.jit
def _fwd_exponent(qk, m_i, start_n, lo_r, hi_r, sm_scale, softcap, MASKED: tl.constexpr,
                  FOLD: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr):
    """(e, m): the exponents p = exp2(e) of a score tile qk = q k^T against the running
    max, and the max after it (base-2 units). MASKED: a boundary block (row r sees keys
    [lo_r, hi_r)), hidden scores -inf. FOLD: e is one FFMA, qk * (scale * log2 e) - m,
    the max taken over qk and scaled once per row (a positive scale, no softcap); else the
    base-2 scores are made first, s = cap(qk * scale) * log2 e, and e = s - m (a scale
    <= 0, whose scaled max is not the max of qk scaled, and a softcap). Either way e
    rounds as the backward's recomputation (_exponent) does."""
    if MASKED:
        seen = _seen(lo_r, hi_r, start_n + tl.arange(0, BLOCK_N))
    if FOLD:
        c = sm_scale * LOG2E
        if MASKED:
            qk = tl.where(seen, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * c)
        e = qk * c - m_new[:, None]
    else:
        if SOFTCAP:
            s = _capped(qk, sm_scale, softcap, SOFTCAP)[0] * LOG2E
        else:
            s = qk * (sm_scale * LOG2E)
        if MASKED:
            s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        e = s - m_new[:, None]
    return e, m_new


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_src, v_src, v_rows, start_n, seq_k, lo_r, hi_r, offs_d,
               mask_d, stride_kn, stride_vn, sm_scale, softcap,
               MASKED: tl.constexpr, SAFE: tl.constexpr, FOLD: tl.constexpr,
               SOFTCAP: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
               PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """One step of the online softmax over keys start_n + [0, BLOCK_N): (acc, l, m, faults)
    after it. MASKED: a boundary block, whose NaN and inf of v are counted in faults (and,
    SAFE, left out of p @ v for _fwd_faults to add); else every pair is visible and
    faults is 0."""
    k_t, v = _load_kv(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn,
                      MASKED, TMA, UPCAST, BLOCK_N)
    qk = tl.dot(q, k_t, input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
    e, m_new = _fwd_exponent(qk, m_i, start_n, lo_r, hi_r, sm_scale, softcap, MASKED, FOLD,
                             SOFTCAP, BLOCK_N)
    p = tl.exp2(e)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    faults = 0
    if MASKED:
        v, faults = _guarded(v, SAFE)
    p_lo = _operand(p, v_rows.dtype.element_ty, UPCAST)  # p as the GPU's dot sees it
    # [BM, BN] @ [BN, D] -> [BM, D]
    acc = tl.dot(p_lo, v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, l_i, m_new, faults


@triton.jit
def _fwd_faults(acc, m_i, q, k_src, v_src, v_rows, start_n, seq_k, lo_r, hi_r, offs_d, mask_d,
                stride_kn, stride_vn, sm_scale, softcap, FOLD: tl.constexpr,
                SOFTCAP: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc plus the products of p and the NaN and inf of v at the visible pairs of boundary
    block start_n, which _fwd_block left out; p recomputed against the final max m_i (its
    zeros, signs and NaN are what the products need)."""
    k_t, v = _load_kv(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn,
                      True, TMA, UPCAST, BLOCK_N)
    qk = tl.dot(q, k_t, input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
    e, _ = _fwd_exponent(qk, m_i, start_n, lo_r, hi_r, sm_scale, softcap, True, FOLD, SOFTCAP,
                         BLOCK_N)
    p_lo = _operand(tl.exp2(e), v_rows.dtype.element_ty, UPCAST)
    return _nonfinite_products(acc, p_lo, _seen(lo_r, hi_r, start_n + tl.arange(0, BLOCK_N)), v)


@triton.jit
def _fwd_program(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, pid_m, pid_b, pid_h, pid_s, q_start, k_start,
    seq_q, seq_k, group, head_dim, sm_scale, softcap, left, right, split_span,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
    stride_vn, stride_ob, stride_oh, stride_om, stride_os, stride_lb, stride_lh, stride_lm,
    stride_ls,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, FOLD: tl.constexpr, SPLIT: tl.constexpr,
    SAFE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """o and lse of query block pid_m of (batch pid_b, q head pid_h), split pid_s, of a
    sequence starting at rows q_start / k_start, seq_q / seq_k long (pid_m * BLOCK_M <
    seq_q); the boundary blocks' faults (NaN and inf of v) counted, returned. SAFE: exact
    whatever they hold (the fault kernel's pass); else a fault there may spread to rows
    that cannot see it, which the count hands to the fault kernel."""
    m_lo = pid_m * BLOCK_M
    offs_m, mask_m = _block(m_lo, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    pid_kv = pid_h // group

    q = _load_rows(q_ptr, pid_b, pid_h, (q_start + offs_m).to(tl.int64), offs_d,
                   mask_m[:, None] & mask_d[None, :], stride_qb, stride_qh, stride_qm, UPCAST)
    k_first = tl.full([], 0, tl.int64) + k_start
    k_rows = k_ptr + pid_b.to(tl.int64) * stride_kb + pid_kv.to(tl.int64) * stride_kh \
        + k_first * stride_kn  # this sequence's first key of the kv head
    v_rows = v_ptr + pid_b.to(tl.int64) * stride_vb + pid_kv.to(tl.int64) * stride_vh \
        + k_first * stride_vn
    # boundary blocks are read in halves (EDGE_N keys): the mask's tiles beside the scores'
    # would make a 128-key block spill; the interior blocks, unmasked, take BLOCK_N whole
    EDGE_N: tl.constexpr = BLOCK_N // 2
    if TMA:  # descriptors over this sequence's rows (at least one row), per block size
        k_src = tl.make_tensor_descriptor(k_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                          strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                          strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
        k_edge = tl.make_tensor_descriptor(k_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                           strides=[stride_kn, 1], block_shape=[EDGE_N, BLOCK_D])
        v_edge = tl.make_tensor_descriptor(v_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                           strides=[stride_vn, 1], block_shape=[EDGE_N, BLOCK_D])
    else:
        k_src = k_rows
        v_src = v_rows
        k_edge = k_rows
        v_edge = v_rows

    # the keys each row sees; the block's union [lo, hi) and the keys all its rows see
    lo_r, hi_r = _keys_seen(offs_m, seq_q, seq_k, left, right, WINDOW)
    lo, in_hi = _keys_seen(m_lo, seq_q, seq_k, left, right, WINDOW)
    in_lo, hi = _keys_seen(tl.minimum(m_lo + BLOCK_M, seq_q) - 1, seq_q, seq_k, left, right,
                           WINDOW)
    if SPLIT:
        lo = tl.maximum(lo, pid_s * split_span)
        hi = tl.minimum(hi, (pid_s + 1) * split_span)
    first, n_head, n_edge, mid_lo, mid_hi = _blocks(lo, hi, in_lo, in_hi, BLOCK_N)

    faults = tl.zeros([], tl.int32)
    m_i = tl.full([BLOCK_M], FLOOR, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for e in range(0, 2 * n_edge):  # boundary blocks, in halves: the mask
        acc, l_i, m_i, n_bad = _fwd_block(
            acc, l_i, m_i, q, k_edge, v_edge, v_rows,
            _edge_start(e // 2, first, n_head, mid_lo, mid_hi, BLOCK_N) + (e % 2) * EDGE_N,
            seq_k, lo_r, hi_r, offs_d, mask_d, stride_kn, stride_vn, sm_scale, softcap, True,
            SAFE, FOLD, SOFTCAP, TMA, UPCAST, PRECISION, EDGE_N)
        faults += n_bad
    for start_n in range(mid_lo, mid_hi, BLOCK_N):  # interior blocks: no mask
        acc, l_i, m_i, _ = _fwd_block(
            acc, l_i, m_i, q, k_src, v_src, v_rows, start_n, seq_k, lo_r, hi_r, offs_d, mask_d,
            stride_kn, stride_vn, sm_scale, softcap, False, SAFE, FOLD, SOFTCAP, TMA, UPCAST,
            PRECISION, BLOCK_N)
    if SAFE:
        if faults > 0:  # v's NaN and inf in the boundary blocks, at the visible pairs
            for e in range(0, 2 * n_edge):
                acc = _fwd_faults(
                    acc, m_i, q, k_edge, v_edge, v_rows,
                    _edge_start(e // 2, first, n_head, mid_lo, mid_hi, BLOCK_N)
                    + (e % 2) * EDGE_N, seq_k, lo_r, hi_r, offs_d, mask_d, stride_kn,
                    stride_vn, sm_scale, softcap, FOLD, SOFTCAP, TMA, UPCAST, PRECISION, EDGE_N)

    none = l_i == 0.0  # saw no key (a NaN l, a NaN softmax, is not none)
    acc = acc / tl.where(none, 1.0, l_i)[:, None]
    lse = tl.where(none, float("-inf"),
                   tl.where(m_i == float("inf"), float("inf"),
                            (m_i + tl.log2(tl.where(none, 1.0, l_i))) / LOG2E))
    o_ptrs = (o_ptr + pid_s.to(tl.int64) * stride_os + pid_b.to(tl.int64) * stride_ob
              + pid_h.to(tl.int64) * stride_oh + (q_start + offs_m[:, None]).to(tl.int64) * stride_om
              + offs_d[None, :])
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    lse_ptrs = (lse_ptr + pid_s.to(tl.int64) * stride_ls + pid_b.to(tl.int64) * stride_lb
                + pid_h.to(tl.int64) * stride_lh + (q_start + offs_m).to(tl.int64) * stride_lm)
    tl.store(lse_ptrs, lse, mask=mask_m)
    return faults


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, faults_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
    seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap, left, right,
    split_span,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, stride_os,
    stride_lb, stride_lh, stride_lm, stride_ls,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, FOLD: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One block of BLOCK_M query rows of one (batch, q head) against its visible keys.

    grid (m_blocks * batch * heads_q, splits), m_blocks = cdiv(max seq_q, BLOCK_M): one
    flat first axis (batch * heads can pass CUDA's 65535 limit on the second), query
    blocks major and in descending order (the causal mask's heaviest first), heads fastest
    (a GQA group's q heads side by side on its K/V). q, o [batch, heads_q, seq_q,
    head_dim] and k, v [batch, heads_q // group, seq_k, head_dim] by their strides (last
    dim contiguous); packed [total, heads, head_dim] with VARLEN (batch strides 0, rows
    offset by cu_q / cu_k, int32 [batch + 1], each sequence clamped into total_q /
    total_k rows and cut at seq_q / seq_k: see _sequence). lse fp32 [batch, heads_q, seq_q].
    q head h reads kv head h // group (GQA without copies). faults int32 [batch, heads_q,
    m_blocks, splits], every entry written: the NaN and inf of v in the program's
    boundary blocks, whose programs _attention_fwd_faults_kernel redoes.
    SPLIT: program pid_s takes keys [pid_s * split_span, (pid_s + 1) * split_span) only and
    writes its normalised fp32 partial o and lse at split stride stride_os / stride_ls, for
    _attention_combine_kernel; else o is the output (input dtype).
    Constexprs: VARLEN reads cu_seqlens; WINDOW compiles the window tests in (causal is
    right = 0); SOFTCAP applies softcap * tanh(s / softcap); FOLD folds the scale into the
    exponent's FFMA (a positive scale, no softcap: _fwd_exponent); UPCAST turns bf16 tiles
    to fp32 before tl.dot (the interpreter's bf16 dot is wrong; products of bf16 are exact
    in fp32); PRECISION "ieee" keeps fp32 products exact (no TF32); TMA loads the K and V
    tiles through tensor descriptors made on the device for this program's sequence and kv
    head ([seq_k, head_dim] at row stride stride_kn / stride_vn: the hardware fills rows past
    the sequence and columns past head_dim with zeros, so no tile reads another sequence's
    or head's values), else by pointer (cp.async on sm_80+); BLOCK_D is head_dim rounded
    up to a power of two, the rest masked.
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q, True)
    pid_s = tl.program_id(1)
    flag = faults_ptr + ((pid_b * heads_q + pid_h) * m_blocks + pid_m) * tl.num_programs(1) + pid_s
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                                total_k, VARLEN)
    if pid_m * BLOCK_M >= seq_q:
        tl.store(flag, 0)
        return
    faults = _fwd_program(
        q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, pid_m, pid_b, pid_h, pid_s, q_start, k_start,
        seq_q, seq_k, group, head_dim, sm_scale, softcap, left, right, split_span,
        stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
        stride_vn, stride_ob, stride_oh, stride_om, stride_os, stride_lb, stride_lh, stride_lm,
        stride_ls, WINDOW, SOFTCAP, FOLD, SPLIT, False, UPCAST, PRECISION, TMA, BLOCK_M,
        BLOCK_N, BLOCK_D)
    tl.store(flag, faults)


@triton.jit
def _attention_fwd_faults_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, faults_ptr, cu_q_ptr, cu_k_ptr, m_blocks, splits,
    main_block, main_blocks, seq_q, seq_k, total_q, total_k, batch, heads_q, group, head_dim,
    sm_scale, softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_lb, stride_lh, stride_lm,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, FOLD: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """o and lse, exact, of the query blocks whose forward program counted a fault, after
    the forward (_attention_fwd_kernel and the combine: a NaN or inf of v in a boundary
    block; the Gluon forward: a NaN or inf in a consumer's o); a program with none reads
    one count per split and moves on.

    grid (at most one wave,): each program takes blocks of BLOCK_M query rows pid, pid +
    grid, ... of the m_blocks x batch x heads_q of this sizing; the forward's blocks of
    main_block rows (a multiple of BLOCK_M) have their counts in faults int32 [batch,
    heads_q, main_blocks, splits] (main_blocks * main_block >= max seq_q). Layouts as
    _attention_fwd_kernel's.
    """
    for work in range(tl.program_id(0), m_blocks * batch * heads_q, tl.num_programs(0)):
        pid_m = work % m_blocks
        pid_h = (work // m_blocks) % heads_q
        pid_b = work // (m_blocks * heads_q)
        flags = faults_ptr + ((pid_b * heads_q + pid_h) * main_blocks
                              + pid_m * BLOCK_M // main_block) * splits
        faults = 0
        for s in range(0, splits):
            faults += tl.load(flags + s)
        if faults > 0:
            q_start, k_start, n_q, n_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k,
                                                  total_q, total_k, VARLEN)
            if pid_m * BLOCK_M < n_q:
                _fwd_program(
                    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, pid_m, pid_b, pid_h, pid_m * 0, q_start,
                    k_start, n_q, n_k, group, head_dim, sm_scale, softcap, left, right, 0,
                    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb,
                    stride_vh, stride_vn, stride_ob, stride_oh, stride_om, 0, stride_lb,
                    stride_lh, stride_lm, 0, WINDOW, SOFTCAP, FOLD, False, True, UPCAST,
                    PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D)


@triton.jit
def _attention_combine_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, rows, heads_q, seq_q, head_dim, n_splits,
    stride_pb, stride_ph, stride_pm, stride_ps,
    stride_plb, stride_plh, stride_plm, stride_pls,
    stride_ob, stride_oh, stride_om,
    stride_lb, stride_lh, stride_lm,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """o = sum_s exp(lse_s - lse) o_s, lse = log(sum_s exp(lse_s)) over the splits of one
    query row; splits that saw no key carry lse_s = -inf and add nothing.

    grid (batch * heads_q * seq_q,). part_o fp32 [splits, batch, heads_q, seq_q,
    head_dim] and part_lse fp32 [splits, batch, heads_q, seq_q] by their strides (a
    packed varlen tensor as batch 1); o and lse are the outputs. BLOCK_S is n_splits
    rounded up to a power of two, BLOCK_D head_dim.
    """
    pid = tl.program_id(0)
    pid_m = pid % seq_q
    pid_h = (pid // seq_q) % heads_q
    pid_b = pid // (seq_q * heads_q)
    offs_s, mask_s = _block(0, n_splits, BLOCK_S)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    lse_s = tl.load(part_lse_ptr + pid_b.to(tl.int64) * stride_plb + pid_h.to(tl.int64) * stride_plh
                    + pid_m.to(tl.int64) * stride_plm + offs_s.to(tl.int64) * stride_pls,
                    mask=mask_s, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_safe)  # [BLOCK_S]
    total = tl.sum(w, 0)
    o_s = tl.load(part_o_ptr + pid_b.to(tl.int64) * stride_pb + pid_h.to(tl.int64) * stride_ph
                  + pid_m.to(tl.int64) * stride_pm + offs_s[:, None].to(tl.int64) * stride_ps
                  + offs_d[None, :], mask=mask_s[:, None] & mask_d[None, :], other=0.0)
    none = total == 0.0  # no split saw a key (a NaN total, a NaN softmax, is not none)
    o = tl.sum(o_s * w[:, None], 0) / tl.where(none, 1.0, total)  # [BS, D] -> [D]
    lse = tl.where(none, float("-inf"),
                   tl.where(m == float("inf"), float("inf"),
                            m_safe + tl.log(tl.where(none, 1.0, total))))
    tl.store(o_ptr + pid_b.to(tl.int64) * stride_ob + pid_h.to(tl.int64) * stride_oh
             + pid_m.to(tl.int64) * stride_om + offs_d, o.to(o_ptr.dtype.element_ty), mask=mask_d)
    tl.store(lse_ptr + pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh
             + pid_m.to(tl.int64) * stride_lm, lse)
