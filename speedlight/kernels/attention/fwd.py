"""Attention forward (FlashAttention-2 style) and the combine of a split key range.

    o = softmax(cap(q k^T * scale) + mask) v,   lse = log(sum_j exp(cap(q k^T * scale)_j))

per query row, with an online softmax over key blocks: fp32 running max m and sum l in
base 2, the output accumulated in fp32 and divided by l once at the end. A row that sees
no key gets o = 0 and lse = -inf. A row whose softmax is NaN (a NaN among the scores it
sees, or a +inf: exp(inf - inf)) gets o = NaN and lse = NaN (+inf for a +inf score), as
float64 does: l is then NaN, which no test of "saw a key" may take for 0. Faults at keys
a row cannot see reach it through faults.py, launched after this kernel.
"""

import triton
import triton.language as tl

from speedlight.kernels.attention.common import (LOG2E, _block, _key_range, _load_rows,
                                                 _operand, _program, _scores, _sequence,
                                                 _visible)


@triton.jit
def _attention_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
    seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap, left, right,
    split_span,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, stride_os,
    stride_lb, stride_lh, stride_lm, stride_ls,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One block of BLOCK_M query rows of one (batch, q head) against its visible keys.

    grid (m_blocks * batch * heads_q, splits), m_blocks = cdiv(max seq_q, BLOCK_M): one
    flat first axis (batch * heads can pass CUDA's 65535 limit on the second), the query
    blocks of one head consecutive so they share its K/V in L2. q, o [batch, heads_q, seq_q,
    head_dim] and k, v [batch, heads_q // group, seq_k, head_dim] by their strides (last
    dim contiguous); packed [total, heads, head_dim] with VARLEN (batch strides 0, rows
    offset by cu_q / cu_k, int32 [batch + 1], each sequence clamped into total_q /
    total_k rows and cut at seq_q / seq_k: see _sequence). lse fp32 [batch, heads_q, seq_q].
    q head h reads kv head h // group (GQA without copies).
    SPLIT: program pid_s takes keys [pid_s * split_span, (pid_s + 1) * split_span) only and
    writes its normalised fp32 partial o and lse at split stride stride_os / stride_ls, for
    _attention_combine_kernel; else o is the output (input dtype).
    Constexprs: VARLEN reads cu_seqlens; WINDOW compiles the window tests in (causal is
    right = 0); SOFTCAP applies softcap * tanh(s / softcap); UPCAST turns bf16 tiles to fp32
    before tl.dot (the interpreter's bf16 dot is wrong; products of bf16 are exact in fp32);
    PRECISION "ieee" keeps fp32 products exact (no TF32); TMA loads the K and V tiles
    through tensor descriptors made on the device for this program's sequence and kv head
    ([seq_k, head_dim] at row stride stride_kn / stride_vn: the hardware fills rows past
    the sequence and columns past head_dim with zeros, so no tile reads another sequence's
    or head's values), else by pointer (cp.async on sm_80+); BLOCK_D is head_dim rounded
    up to a power of two, the rest masked.
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q)
    pid_s = tl.program_id(1)
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                                total_k, VARLEN)
    m_lo = pid_m * BLOCK_M
    if m_lo >= seq_q:
        return
    offs_m, mask_m = _block(m_lo, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    pid_kv = pid_h // group

    q = _load_rows(q_ptr, pid_b, pid_h, (q_start + offs_m).to(tl.int64), offs_d,
                   mask_m[:, None] & mask_d[None, :], stride_qb, stride_qh, stride_qm, UPCAST)
    k_base = k_ptr + pid_b.to(tl.int64) * stride_kb + pid_kv.to(tl.int64) * stride_kh
    v_base = v_ptr + pid_b.to(tl.int64) * stride_vb + pid_kv.to(tl.int64) * stride_vh
    if TMA:  # one descriptor per operand over this sequence's rows (at least one row)
        k_first = tl.full([], 0, tl.int64) + k_start
        k_desc = tl.make_tensor_descriptor(k_base + k_first * stride_kn,
                                           shape=[tl.maximum(seq_k, 1), head_dim],
                                           strides=[stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(v_base + k_first * stride_vn,
                                           shape=[tl.maximum(seq_k, 1), head_dim],
                                           strides=[stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])

    lo, hi = _key_range(m_lo, tl.minimum(m_lo + BLOCK_M, seq_q), seq_q, seq_k, left, right,
                        BLOCK_N)
    if SPLIT:
        lo = tl.maximum(lo, pid_s * split_span)
        hi = tl.minimum(hi, (pid_s + 1) * split_span)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, mask_n = _block(start_n, hi, BLOCK_N)
        if TMA:
            k_t = tl.trans(k_desc.load([start_n, 0]))  # [BN, D] -> [D, BN]
            v = v_desc.load([start_n, 0])
        else:
            rows_k = (k_start + offs_n).to(tl.int64)
            k_t = tl.load(k_base + rows_k[None, :] * stride_kn + offs_d[:, None],
                          mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            v = tl.load(v_base + rows_k[:, None] * stride_vn + offs_d[None, :],
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        if UPCAST:
            k_t = k_t.to(tl.float32)
            v = v.to(tl.float32)
        s, _ = _scores(q, k_t, sm_scale, softcap, SOFTCAP, PRECISION)
        s = tl.where(_visible(offs_m[:, None], offs_n[None, :], seq_q, seq_k, left, right, WINDOW)
                     & mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        p_lo = _operand(p, v_ptr.dtype.element_ty, UPCAST)  # p as the GPU's dot sees it
        # [BM, BN] @ [BN, D] -> [BM, D]
        acc = acc * alpha[:, None] + tl.dot(p_lo, v, input_precision=PRECISION)
        m_i = m_new

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
