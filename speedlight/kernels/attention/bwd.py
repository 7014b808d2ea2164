"""Attention backward: delta, then dk and dv per key block, then dq per query block.

With u = q k^T * scale, s = cap(u) (u without a softcap), p = exp(s - lse) over the keys
a row sees (0 elsewhere), o = p v and upstream gradients do (and dlse when the
log-sum-exp was an output too):

    dv    = p^T do
    dp    = do v^T
    ds    = p * (dp - delta),   delta_i = sum_d do_id o_id - dlse_i
    du    = ds * cap'(u),       cap'(u) = 1 - tanh^2(u / c)
    dq    = du k * scale,       dk = du^T q * scale

(d lse_i / d s_ij = p_ij, so an upstream dlse only shifts delta.) Each kernel recomputes p
from q, k and the base-2 lse the delta kernel writes, p = exp2(qk * scale * log2 e -
lse2): one FFMA per score. lse2 is +inf for a row that saw no key (p = 0) and NaN for a
row whose lse is NaN or +inf: its softmax is NaN at every key it sees (torch's softmax
subtracts a +inf max), so are dq of the row and dk, dv of those keys. A row whose do
holds a NaN or inf gets delta NaN (the reference's ds is NaN at every key it sees). The
key (query) loops split into boundary and interior blocks as the forward's (common.py):
hidden pairs get p = 0 and ds = 0 by selection, and a hidden NaN or inf of q, do or k
stays out of the products (_finite_part, then a fault pass after the loops adds the
visible ones), so nothing hidden reaches a gradient. dk and dv of a kv head sum
over its group of q heads inside one program, and dq is its own pass over keys: no
atomics, the same bits on every run.
"""

import triton
import triton.language as tl

from speedlight.kernels.attention.common import (LOG2E, _block, _blocks, _edge_start,
                                                 _exponent, _guarded, _keys_seen,
                                                 _load_rows, _nonfinite,
                                                 _nonfinite_products, _operand, _program,
                                                 _rows_seeing, _seen, _sequence)


@triton.jit
def _attention_bwd_delta_kernel(
    o_ptr, do_ptr, lse_ptr, dlse_ptr, delta_ptr, lse2_ptr, cu_q_ptr, m_blocks, seq_q, total_q,
    heads_q, head_dim,
    stride_ob, stride_oh, stride_om,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """delta = rowsum(do * o) - dlse and lse2 = lse * log2(e), fp32, for BLOCK_M query
    rows of one (batch, head); lse2 is +inf where lse is -inf (no key seen) and NaN where
    it is NaN or +inf.

    grid (m_blocks * batch * heads_q,), m_blocks = cdiv(max seq_q, BLOCK_M). o, do [batch,
    heads_q, seq_q, head_dim] by their strides (packed [total, heads, head_dim] with
    VARLEN); lse, dlse, delta and lse2 fp32 [batch, heads_q, seq_q] at the lse strides.
    HAS_DLSE reads dlse.
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q, False)
    q_start, _, seq_q, _ = _sequence(cu_q_ptr, cu_q_ptr, pid_b, seq_q, seq_q, total_q, total_q,
                                     VARLEN)
    offs_m, mask_m = _block(pid_m * BLOCK_M, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    mask = mask_m[:, None] & mask_d[None, :]
    rows = (q_start + offs_m).to(tl.int64)
    o = _load_rows(o_ptr, pid_b, pid_h, rows, offs_d, mask, stride_ob, stride_oh, stride_om,
                   False)
    do = _load_rows(do_ptr, pid_b, pid_h, rows, offs_d, mask, stride_db, stride_dh, stride_dm,
                    False)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # [BM, D] -> [BM]
    # a non-finite upstream gradient: sum_j p_ij dp_ij is NaN (an inf dp at every key
    # seen, of either sign, or inf times a zero p), so is every ds_ij of the row
    delta = tl.where(tl.max(_nonfinite(do).to(tl.int32), 1) > 0, float("nan"), delta)
    lse_offs = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh + rows * stride_lm
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + lse_offs, mask=mask_m, other=0.0)
    tl.store(delta_ptr + lse_offs, delta, mask=mask_m)
    lse = tl.load(lse_ptr + lse_offs, mask=mask_m, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"),
                    tl.where(lse == float("inf"), float("nan"), lse * LOG2E))
    tl.store(lse2_ptr + lse_offs, lse2, mask=mask_m)


@triton.jit
def _dkdv_tiles(q_src, do_src, l_rows, pid_h, start_m, seq_q, lse2_ptr, delta_ptr, offs_d,
                mask_d, stride_qm, stride_dm, stride_lm, MASKED: tl.constexpr,
                TMA: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """(q, do [BLOCK_M, BLOCK_D], lse2, delta [BLOCK_M]) of query rows start_m + [0,
    BLOCK_M) of q head pid_h: by the descriptors q_src, do_src over the sequence's [heads,
    seq_q, head_dim] (zeros past it) with TMA, else from the head's first rows q_src,
    do_src by pointer, masked past seq_q in a boundary block (MASKED) only; lse2 and delta
    from offset l_rows on; fp32 when UPCAST."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    l_offs = offs_m * stride_lm  # lse2, delta: our own buffers, row stride 1
    if TMA:
        q = q_src.load([pid_h, start_m, 0]).reshape([BLOCK_M, BLOCK_D])
        do = do_src.load([pid_h, start_m, 0]).reshape([BLOCK_M, BLOCK_D])
    else:
        mask_md = mask_d[None, :]
        if MASKED:
            mask_md &= offs_m[:, None] < seq_q
        rows = offs_m[:, None].to(tl.int64)
        q = tl.load(q_src + rows * stride_qm + offs_d[None, :], mask=mask_md, other=0.0)
        do = tl.load(do_src + rows * stride_dm + offs_d[None, :], mask=mask_md, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse2_rows, delta_rows = lse2_ptr + l_rows, delta_ptr + l_rows
    if MASKED:
        lse2 = tl.load(lse2_rows + l_offs, mask=offs_m < seq_q, other=0.0)
        delta = tl.load(delta_rows + l_offs, mask=offs_m < seq_q, other=0.0)
    else:
        lse2 = tl.load(lse2_rows + l_offs)
        delta = tl.load(delta_rows + l_offs)
    return q, do, lse2, delta


@triton.jit
def _dkdv_probs(k, v, q, do, lse2, delta, lo_k, hi_k, start_m, sm_scale, softcap,
                MASKED: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """(p^T, ds^T) [BN, BM] of one block, both 0 at the hidden pairs (MASKED: key j seen by
    rows [lo_k[j], hi_k[j]))."""
    qk_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # [BN, D] @ [D, BM] -> [BN, BM]
    x_t, dcap_t = _exponent(qk_t, lse2[None, :], sm_scale, softcap, SOFTCAP)
    p_t = tl.exp2(x_t)
    dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # [BN, D] @ [D, BM] -> [BN, BM]
    ds_t = p_t * (dp_t - delta[None, :])
    if SOFTCAP:
        ds_t *= dcap_t
    if MASKED:
        seen_t = _seen(lo_k, hi_k, start_m + tl.arange(0, BLOCK_M))
        p_t = tl.where(seen_t, p_t, 0.0)
        ds_t = tl.where(seen_t, ds_t, 0.0)
    return p_t, ds_t


@triton.jit
def _dkdv_block(dk, dv, k, v, q_ptr, q_src, do_src, l_rows, pid_h, start_m, seq_q, lse2_ptr,
                delta_ptr, lo_k, hi_k, offs_d, mask_d, stride_qm, stride_dm, stride_lm,
                sm_scale, softcap, MASKED: tl.constexpr, SAFE: tl.constexpr,
                SOFTCAP: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(dk, dv, faults) after query rows start_m + [0, BLOCK_M) of q head pid_h (tiles
    transposed, [BN, BM]; q_ptr: for its dtype). MASKED: a boundary block. SAFE: its NaN and
    inf of q and do are counted in faults and left out of the dk and dv products, for
    _dkdv_faults to add; else faults counts the rows that may hold one (lse2 NaN or +inf:
    a row whose scores hold a NaN or inf, or that sees no key; delta NaN: a fault in do),
    read from the row vectors at no cost. Not MASKED: every pair is visible and every row
    below seq_q, faults 0."""
    q, do, lse2, delta = _dkdv_tiles(q_src, do_src, l_rows, pid_h, start_m, seq_q, lse2_ptr,
                                     delta_ptr, offs_d, mask_d, stride_qm, stride_dm, stride_lm,
                                     MASKED, TMA, UPCAST, BLOCK_M, BLOCK_D)
    p_t, ds_t = _dkdv_probs(k, v, q, do, lse2, delta, lo_k, hi_k, start_m, sm_scale, softcap,
                            MASKED, SOFTCAP, PRECISION, BLOCK_M)
    faults = 0
    if MASKED:
        if SAFE:
            do, do_bad = _guarded(do, SAFE)
            q, q_bad = _guarded(q, SAFE)
            faults = do_bad + q_bad
        else:  # a NaN or inf of q's row makes its lse2 NaN or +inf, of do's its delta NaN
            suspect = (lse2 != lse2) | (lse2 == float("inf")) | _nonfinite(delta)
            faults = tl.sum(suspect.to(tl.int32), 0)
    p_lo = _operand(p_t, q_ptr.dtype.element_ty, UPCAST)
    dv = tl.dot(p_lo, do, dv, input_precision=PRECISION)  # [BN, BM] @ [BM, D] -> [BN, D]
    ds_lo = _operand(ds_t, q_ptr.dtype.element_ty, UPCAST)
    dk = tl.dot(ds_lo, q, dk, input_precision=PRECISION)  # [BN, BM] @ [BM, D] -> [BN, D]
    return dk, dv, faults


@triton.jit
def _dkdv_faults(dk, dv, k, v, q_ptr, q_src, do_src, l_rows, pid_h, start_m, seq_q, lse2_ptr,
                 delta_ptr, lo_k, hi_k, offs_d, mask_d, stride_qm, stride_dm, stride_lm,
                 sm_scale, softcap, SOFTCAP: tl.constexpr, TMA: tl.constexpr,
                 UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """dk and dv plus the products of ds and p with the NaN and inf of q and do at the
    visible pairs of boundary block start_m, which _dkdv_block left out."""
    q, do, lse2, delta = _dkdv_tiles(q_src, do_src, l_rows, pid_h, start_m, seq_q, lse2_ptr,
                                     delta_ptr, offs_d, mask_d, stride_qm, stride_dm, stride_lm,
                                     True, TMA, UPCAST, BLOCK_M, BLOCK_D)
    p_t, ds_t = _dkdv_probs(k, v, q, do, lse2, delta, lo_k, hi_k, start_m, sm_scale, softcap,
                            True, SOFTCAP, PRECISION, BLOCK_M)
    seen_t = _seen(lo_k, hi_k, start_m + tl.arange(0, BLOCK_M))
    dv = _nonfinite_products(dv, _operand(p_t, q_ptr.dtype.element_ty, UPCAST), seen_t, do)
    dk = _nonfinite_products(dk, _operand(ds_t, q_ptr.dtype.element_ty, UPCAST), seen_t, q)
    return dk, dv


@triton.jit
def _dkdv_program(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, pid_n, pid_b, pid_kv,
    q_start, k_start, seq_q, seq_k, heads_kv, group, head_dim, sm_scale, softcap, left,
    right,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
    stride_vn, stride_db, stride_dh, stride_dm, stride_lb, stride_lh, stride_lm, stride_dkb,
    stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SAFE: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk and dv of key block pid_n of (batch pid_b, kv head pid_kv) of a sequence starting
    at rows q_start / k_start, seq_q / seq_k long (pid_n * BLOCK_N < seq_k); the boundary
    blocks' faults (NaN and inf of q and do) counted, returned. SAFE: exact whatever they
    hold (the fault kernel's pass), as _fwd_program."""
    n_lo = pid_n * BLOCK_N
    offs_n, mask_n = _block(n_lo, seq_k, BLOCK_N)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    rows_k = (k_start + offs_n).to(tl.int64)
    k = _load_rows(k_ptr, pid_b, pid_kv, rows_k, offs_d, mask_n[:, None] & mask_d[None, :],
                   stride_kb, stride_kh, stride_kn, UPCAST)
    v = _load_rows(v_ptr, pid_b, pid_kv, rows_k, offs_d, mask_n[:, None] & mask_d[None, :],
                   stride_vb, stride_vh, stride_vn, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # the rows each key is seen by; the block's union [lo, hi) and the rows seeing all keys
    lo_k, hi_k = _rows_seeing(offs_n, seq_q, seq_k, left, right, WINDOW)
    lo, in_hi = _rows_seeing(n_lo, seq_q, seq_k, left, right, WINDOW)
    in_lo, hi = _rows_seeing(tl.minimum(n_lo + BLOCK_N, seq_k) - 1, seq_q, seq_k, left, right,
                             WINDOW)
    first, n_head, n_edge, mid_lo, mid_hi = _blocks(lo, hi, in_lo, in_hi, BLOCK_M)
    q_first = tl.full([], 0, tl.int64) + q_start
    q_seq = q_ptr + pid_b.to(tl.int64) * stride_qb + q_first * stride_qm  # the sequence's rows
    do_seq = do_ptr + pid_b.to(tl.int64) * stride_db + q_first * stride_dm
    l_seq = pid_b.to(tl.int64) * stride_lb + q_first * stride_lm
    if TMA:  # [heads, seq_q, head_dim] of the sequence: rows past it read as zeros
        q_src = tl.make_tensor_descriptor(q_seq, shape=[heads_kv * group, tl.maximum(seq_q, 1),
                                                        head_dim],
                                          strides=[stride_qh, stride_qm, 1],
                                          block_shape=[1, BLOCK_M, BLOCK_D])
        do_src = tl.make_tensor_descriptor(do_seq, shape=[heads_kv * group,
                                                          tl.maximum(seq_q, 1), head_dim],
                                           strides=[stride_dh, stride_dm, 1],
                                           block_shape=[1, BLOCK_M, BLOCK_D])
    faults = tl.zeros([], tl.int32)
    # the group's q heads times the boundary query blocks (the mask), head by head, in one
    # loop (no head loop around it: nothing per head lives through it), then times the
    # interior ones (no mask); each loop carries its head and block, wrapping to the next
    # head at the last block
    pid_h = pid_kv * group
    e = pid_n * 0
    for _ in range(0, group * n_edge):  # boundary query blocks of each q head: the mask
        if not TMA:
            q_src = q_seq + pid_h.to(tl.int64) * stride_qh
            do_src = do_seq + pid_h.to(tl.int64) * stride_dh
        dk, dv, n_bad = _dkdv_block(
            dk, dv, k, v, q_ptr, q_src, do_src, l_seq + pid_h.to(tl.int64) * stride_lh, pid_h,
            _edge_start(e, first, n_head, mid_lo, mid_hi, BLOCK_M), seq_q, lse2_ptr,
            delta_ptr, lo_k, hi_k, offs_d, mask_d, stride_qm, stride_dm, stride_lm, sm_scale,
            softcap, True, SAFE, SOFTCAP, TMA, UPCAST, PRECISION, BLOCK_M, BLOCK_D)
        faults += n_bad
        e += 1
        pid_h += (e == n_edge).to(tl.int32)
        e = tl.where(e == n_edge, 0, e)
    pid_h = pid_kv * group
    start_m = mid_lo
    for _ in range(0, group * ((mid_hi - mid_lo) // BLOCK_M)):  # interior: no mask
        if not TMA:
            q_src = q_seq + pid_h.to(tl.int64) * stride_qh
            do_src = do_seq + pid_h.to(tl.int64) * stride_dh
        dk, dv, _ = _dkdv_block(
            dk, dv, k, v, q_ptr, q_src, do_src, l_seq + pid_h.to(tl.int64) * stride_lh, pid_h,
            start_m, seq_q, lse2_ptr, delta_ptr, lo_k, hi_k, offs_d, mask_d, stride_qm,
            stride_dm, stride_lm, sm_scale, softcap, False, SAFE, SOFTCAP, TMA, UPCAST,
            PRECISION, BLOCK_M, BLOCK_D)
        start_m += BLOCK_M
        pid_h += (start_m == mid_hi).to(tl.int32)
        start_m = tl.where(start_m == mid_hi, mid_lo, start_m)
    if SAFE:
        if faults > 0:  # q's and do's NaN and inf in the boundary blocks, at visible pairs
            for g in range(0, group):
                pid_h = pid_kv * group + g
                if not TMA:
                    q_src = q_seq + pid_h.to(tl.int64) * stride_qh
                    do_src = do_seq + pid_h.to(tl.int64) * stride_dh
                for e in range(0, n_edge):
                    dk, dv = _dkdv_faults(
                        dk, dv, k, v, q_ptr, q_src, do_src,
                        l_seq + pid_h.to(tl.int64) * stride_lh, pid_h,
                        _edge_start(e, first, n_head, mid_lo, mid_hi, BLOCK_M), seq_q,
                        lse2_ptr, delta_ptr, lo_k, hi_k, offs_d, mask_d, stride_qm, stride_dm,
                        stride_lm, sm_scale, softcap, SOFTCAP, TMA, UPCAST, PRECISION, BLOCK_M,
                        BLOCK_D)
    dk *= sm_scale
    # the stores' addresses made here, from the block's first key and int32 offsets within
    # it, so none of the loads' address tiles lives through the loops
    first_key = tl.full([], 0, tl.int64) + k_start + n_lo
    local = tl.arange(0, BLOCK_N)[:, None]
    mask = (local < seq_k - n_lo) & mask_d[None, :]
    tl.store(dk_ptr + pid_b.to(tl.int64) * stride_dkb + pid_kv.to(tl.int64) * stride_dkh
             + first_key * stride_dkn + (local * stride_dkn + offs_d[None, :]),
             dk.to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + pid_b.to(tl.int64) * stride_dvb + pid_kv.to(tl.int64) * stride_dvh
             + first_key * stride_dvn + (local * stride_dvn + offs_d[None, :]),
             dv.to(dv_ptr.dtype.element_ty), mask=mask)
    return faults


@triton.jit
def _attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, faults_ptr, cu_q_ptr,
    cu_k_ptr, n_blocks, seq_q, seq_k, total_q, total_k, heads_kv, group, head_dim, sm_scale,
    softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk and dv of BLOCK_N keys of one (batch, kv head), summed over the group's q heads
    and every query block that sees them: for each q head, the boundary query blocks (the
    mask) and then the interior ones (none); tiles computed transposed ([BN, BM]).

    grid (n_blocks * batch * heads_kv,), n_blocks = cdiv(max seq_k, BLOCK_N), key blocks
    major and ascending (the causal mask's heaviest first). q, do [batch, heads_kv *
    group, seq_q, head_dim], k, v, dk, dv [batch, heads_kv, seq_k, head_dim] by their
    strides (packed with VARLEN); lse2 and delta fp32 [batch, heads_q, seq_q] at the lse
    strides. faults int32 [batch, heads_kv, n_blocks], every entry written: the NaN and
    inf of q and do in the program's boundary blocks (_attention_bwd_faults_kernel redoes
    those programs). Constexprs as in _attention_fwd_kernel; TMA loads the q and do tiles
    through descriptors over the sequence's [heads_q, seq_q, head_dim].
    """
    pid_n, pid_b, pid_kv = _program(tl.program_id(0), n_blocks, heads_kv, False)
    flag = faults_ptr + (pid_b * heads_kv + pid_kv) * n_blocks + pid_n
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    if pid_n * BLOCK_N >= seq_k:
        tl.store(flag, 0)
        return
    faults = _dkdv_program(
        q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, pid_n, pid_b, pid_kv,
        q_start, k_start, seq_q, seq_k, heads_kv, group, head_dim, sm_scale, softcap, left,
        right, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb,
        stride_vh, stride_vn, stride_db, stride_dh, stride_dm, stride_lb, stride_lh, stride_lm,
        stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn, WINDOW, SOFTCAP,
        False, UPCAST, PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D)
    tl.store(flag, faults)


@triton.jit
def _dq_tiles(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn,
              MASKED: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """(k, v) [BLOCK_N, BLOCK_D] of keys start_n + [0, BLOCK_N): by the descriptors k_src,
    v_src over the sequence's keys of the kv head with TMA (zeros past them), else from
    its first rows k_src, v_src by pointer, masked past seq_k in a boundary block only."""
    if TMA:
        k = k_src.load([start_n, 0])
        v = v_src.load([start_n, 0])
    else:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        mask_nd = mask_d[None, :]
        if MASKED:
            mask_nd &= offs_n[:, None] < seq_k
        rows = offs_n[:, None].to(tl.int64)
        k = tl.load(k_src + rows * stride_kn + offs_d[None, :], mask=mask_nd, other=0.0)
        v = tl.load(v_src + rows * stride_vn + offs_d[None, :], mask=mask_nd, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _dq_scores(q, do, k, v, lse2, delta, lo_r, hi_r, start_n, sm_scale, softcap,
               MASKED: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """ds [BM, BN] of one block, 0 at the hidden pairs (MASKED: row r sees keys
    [lo_r[r], hi_r[r]))."""
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
    x, dcap = _exponent(qk, lse2[:, None], sm_scale, softcap, SOFTCAP)
    p = tl.exp2(x)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds *= dcap
    if MASKED:
        ds = tl.where(_seen(lo_r, hi_r, start_n + tl.arange(0, BLOCK_N)), ds, 0.0)
    return ds


@triton.jit
def _dq_block(dq, q, do, lse2, delta, k_ptr, k_src, v_src, start_n, seq_k, lo_r, hi_r, offs_d,
              mask_d, stride_kn, stride_vn, sm_scale, softcap,
              MASKED: tl.constexpr, SAFE: tl.constexpr, SOFTCAP: tl.constexpr,
              TMA: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
              BLOCK_N: tl.constexpr):
    """(dq, faults) after keys start_n + [0, BLOCK_N) (k_ptr: for its dtype). MASKED: a
    boundary block, whose NaN and inf of k are counted in faults (and, SAFE, left out of
    the dq product for _dq_faults to add); else every pair is visible and every key below
    seq_k, faults 0."""
    k, v = _dq_tiles(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn,
                     MASKED, TMA, UPCAST, BLOCK_N)
    ds = _dq_scores(q, do, k, v, lse2, delta, lo_r, hi_r, start_n, sm_scale, softcap, MASKED,
                    SOFTCAP, PRECISION, BLOCK_N)
    faults = 0
    if MASKED:
        k, faults = _guarded(k, SAFE)
    ds_lo = _operand(ds, k_ptr.dtype.element_ty, UPCAST)
    dq = tl.dot(ds_lo, k, dq, input_precision=PRECISION)  # [BM, BN] @ [BN, D] -> [BM, D]
    return dq, faults


@triton.jit
def _dq_faults(dq, q, do, lse2, delta, k_src, v_src, start_n, seq_k, lo_r, hi_r, offs_d,
               mask_d, stride_kn, stride_vn, sm_scale, softcap, k_ptr,
               SOFTCAP: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
               PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """dq plus the products of ds and the NaN and inf of k at the visible pairs of boundary
    block start_n, which _dq_block left out."""
    k, v = _dq_tiles(k_src, v_src, start_n, seq_k, offs_d, mask_d, stride_kn, stride_vn, True,
                     TMA, UPCAST, BLOCK_N)
    ds = _dq_scores(q, do, k, v, lse2, delta, lo_r, hi_r, start_n, sm_scale, softcap, True,
                    SOFTCAP, PRECISION, BLOCK_N)
    return _nonfinite_products(dq, _operand(ds, k_ptr.dtype.element_ty, UPCAST),
                               _seen(lo_r, hi_r, start_n + tl.arange(0, BLOCK_N)), k)


@triton.jit
def _dq_program(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr, pid_m, pid_b, pid_h, q_start,
    k_start, seq_q, seq_k, group, head_dim, sm_scale, softcap, left, right,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
    stride_vn, stride_db, stride_dh, stride_dm, stride_lb, stride_lh, stride_lm, stride_dqb,
    stride_dqh, stride_dqm,
    WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, SAFE: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq of query block pid_m of (batch pid_b, q head pid_h) of a sequence starting at rows
    q_start / k_start, seq_q / seq_k long (pid_m * BLOCK_M < seq_q); the boundary blocks'
    faults (NaN and inf of k) counted, returned. SAFE: exact whatever they hold."""
    m_lo = pid_m * BLOCK_M
    offs_m, mask_m = _block(m_lo, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    mask_md = mask_m[:, None] & mask_d[None, :]
    rows_q = (q_start + offs_m).to(tl.int64)
    q = _load_rows(q_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_qb, stride_qh,
                   stride_qm, UPCAST)
    do = _load_rows(do_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_db, stride_dh,
                    stride_dm, UPCAST)
    l_offs = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh + rows_q * stride_lm
    lse2 = tl.load(lse2_ptr + l_offs, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + l_offs, mask=mask_m, other=0.0)
    pid_kv = (pid_h // group).to(tl.int64)
    k_first = tl.full([], 0, tl.int64) + k_start
    k_rows = k_ptr + pid_b.to(tl.int64) * stride_kb + pid_kv * stride_kh + k_first * stride_kn
    v_rows = v_ptr + pid_b.to(tl.int64) * stride_vb + pid_kv * stride_vh + k_first * stride_vn
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo_r, hi_r = _keys_seen(offs_m, seq_q, seq_k, left, right, WINDOW)
    lo, in_hi = _keys_seen(m_lo, seq_q, seq_k, left, right, WINDOW)
    in_lo, hi = _keys_seen(tl.minimum(m_lo + BLOCK_M, seq_q) - 1, seq_q, seq_k, left, right,
                           WINDOW)
    first, n_head, n_edge, mid_lo, mid_hi = _blocks(lo, hi, in_lo, in_hi, BLOCK_N)
    if TMA:  # the sequence's keys of the kv head: rows past them read as zeros
        k_src = tl.make_tensor_descriptor(k_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                          strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_rows, shape=[tl.maximum(seq_k, 1), head_dim],
                                          strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
    else:
        k_src = k_rows
        v_src = v_rows
    faults = tl.zeros([], tl.int32)
    for e in range(0, n_edge):  # boundary key blocks: the mask
        dq, n_bad = _dq_block(dq, q, do, lse2, delta, k_ptr, k_src, v_src,
                              _edge_start(e, first, n_head, mid_lo, mid_hi, BLOCK_N), seq_k, lo_r,
                              hi_r, offs_d, mask_d, stride_kn, stride_vn, sm_scale, softcap, True,
                              SAFE, SOFTCAP, TMA, UPCAST, PRECISION, BLOCK_N)
        faults += n_bad
    for start_n in range(mid_lo, mid_hi, BLOCK_N):  # interior key blocks: no mask
        dq, _ = _dq_block(dq, q, do, lse2, delta, k_ptr, k_src, v_src, start_n, seq_k, lo_r,
                          hi_r, offs_d, mask_d, stride_kn, stride_vn, sm_scale, softcap, False,
                          SAFE, SOFTCAP, TMA, UPCAST, PRECISION, BLOCK_N)
    if SAFE:
        if faults > 0:  # k's NaN and inf in the boundary blocks, at the visible pairs
            for e in range(0, n_edge):
                dq = _dq_faults(dq, q, do, lse2, delta, k_src, v_src,
                                _edge_start(e, first, n_head, mid_lo, mid_hi, BLOCK_N), seq_k,
                                lo_r, hi_r, offs_d, mask_d, stride_kn, stride_vn, sm_scale,
                                softcap, k_ptr, SOFTCAP, TMA, UPCAST, PRECISION, BLOCK_N)
    dq *= sm_scale
    tl.store(dq_ptr + pid_b.to(tl.int64) * stride_dqb + pid_h.to(tl.int64) * stride_dqh
             + rows_q[:, None] * stride_dqm + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=mask_md)
    return faults


@triton.jit
def _attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr, faults_ptr, cu_q_ptr, cu_k_ptr,
    m_blocks, seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap,
    left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq of BLOCK_M query rows of one (batch, q head) over the keys they see: the
    boundary key blocks, then the interior ones.

    grid (m_blocks * batch * heads_q,), ordered as the forward's. Shapes as in
    _attention_bwd_dkdv_kernel; dq has q's shape; faults int32 [batch, heads_q, m_blocks]
    (the NaN and inf of k in the program's boundary blocks). Constexprs as in
    _attention_fwd_kernel (TMA: the k and v tiles by descriptors, as the forward's).
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q, True)
    flag = faults_ptr + (pid_b * heads_q + pid_h) * m_blocks + pid_m
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    if pid_m * BLOCK_M >= seq_q:
        tl.store(flag, 0)
        return
    faults = _dq_program(
        q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr, pid_m, pid_b, pid_h, q_start,
        k_start, seq_q, seq_k, group, head_dim, sm_scale, softcap, left, right, stride_qb,
        stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
        stride_db, stride_dh, stride_dm, stride_lb, stride_lh, stride_lm, stride_dqb, stride_dqh,
        stride_dqm, WINDOW, SOFTCAP, False, UPCAST, PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D)
    tl.store(flag, faults)


@triton.jit
def _attention_bwd_faults_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr, dk_ptr, dv_ptr, kv_faults_ptr,
    q_faults_ptr, cu_q_ptr, cu_k_ptr, n_blocks, kv_main_block, m_blocks, q_main_block, seq_q,
    seq_k, total_q, total_k, batch, heads_kv, group, head_dim, sm_scale, softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk, dv and dq, exact, of the blocks whose backward program counted a fault (a NaN or
    inf of q, do or k in a boundary block), after the dk/dv and dq kernels; a program with
    none reads one flag and moves on.

    grid (at most one wave,): each program takes work items pid, pid + grid, ...: first
    the n_blocks x batch x heads_kv key blocks of BLOCK_N keys (dk, dv), then the m_blocks
    x batch x heads_q query blocks of BLOCK_M rows (dq). The main kernels' blocks of
    kv_main_block keys and q_main_block rows (multiples of BLOCK_N and BLOCK_M) have their
    faults in kv_faults [batch, heads_kv, .] and q_faults [batch, heads_q, .] int32.
    Layouts as the main kernels'.
    """
    heads_q = heads_kv * group
    kv_work = n_blocks * batch * heads_kv
    kv_main = (n_blocks * BLOCK_N + kv_main_block - 1) // kv_main_block
    q_main = (m_blocks * BLOCK_M + q_main_block - 1) // q_main_block
    for work in range(tl.program_id(0), kv_work + m_blocks * batch * heads_q,
                      tl.num_programs(0)):
        if work < kv_work:
            blk = work % n_blocks
            pid_kv = (work // n_blocks) % heads_kv
            pid_b = work // (n_blocks * heads_kv)
            faults = tl.load(kv_faults_ptr + (pid_b * heads_kv + pid_kv) * kv_main
                             + blk * BLOCK_N // kv_main_block)
            if faults > 0:
                q_start, k_start, n_q, n_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k,
                                                      total_q, total_k, VARLEN)
                if blk * BLOCK_N < n_k:
                    _dkdv_program(
                        q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr, blk,
                        pid_b, pid_kv, q_start, k_start, n_q, n_k, heads_kv, group, head_dim,
                        sm_scale, softcap, left, right, stride_qb, stride_qh, stride_qm,
                        stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
                        stride_db, stride_dh, stride_dm, stride_lb, stride_lh, stride_lm,
                        stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
                        WINDOW, SOFTCAP, True, UPCAST, PRECISION, TMA, BLOCK_M, BLOCK_N,
                        BLOCK_D)
        else:
            item = work - kv_work
            blk = item % m_blocks
            pid_h = (item // m_blocks) % heads_q
            pid_b = item // (m_blocks * heads_q)
            faults = tl.load(q_faults_ptr + (pid_b * heads_q + pid_h) * q_main
                             + blk * BLOCK_M // q_main_block)
            if faults > 0:
                q_start, k_start, n_q, n_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k,
                                                      total_q, total_k, VARLEN)
                if blk * BLOCK_M < n_q:
                    _dq_program(
                        q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr, blk, pid_b,
                        pid_h, q_start, k_start, n_q, n_k, group, head_dim, sm_scale, softcap,
                        left, right, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh,
                        stride_kn, stride_vb, stride_vh, stride_vn, stride_db, stride_dh,
                        stride_dm, stride_lb, stride_lh, stride_lm, stride_dqb, stride_dqh,
                        stride_dqm, WINDOW, SOFTCAP, True, UPCAST, PRECISION, TMA, BLOCK_M,
                        BLOCK_N, BLOCK_D)
