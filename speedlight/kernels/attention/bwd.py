"""Attention backward: delta, then dk and dv per key block, then dq per query block.

With u = q k^T * scale, s = cap(u) (u without a softcap), p = exp(s - lse), o = p v and
upstream gradients do (and dlse when the log-sum-exp was an output too):

    dv    = p^T do
    dp    = do v^T
    ds    = p * (dp - delta),   delta_i = sum_d do_id o_id - dlse_i
    du    = ds * cap'(u),       cap'(u) = 1 - tanh^2(u / c)
    dq    = du k * scale,       dk = du^T q * scale

(d lse_i / d s_ij = p_ij, so an upstream dlse only shifts delta.) Each kernel recomputes p
from q, k and the saved fp32 lse; masked pairs and rows that saw no key (lse = -inf) get
p = 0. A row whose softmax is NaN (lse = NaN, or +inf: torch's softmax subtracts the
+inf max) has p = NaN at every key, masked ones included, as the math backend's softmax
of that row: dq of the row and dk, dv of every key of its (batch, kv head) are NaN. The
delta kernel writes one flag per block of rows (0, or NaN when a row's lse is NaN or
+inf) and the dk/dv kernel adds its group's flags to every key, so the NaN reaches keys
the row's window never visits. A row whose do holds a NaN or inf gets delta NaN (the math
backend's ds is NaN at every key of it). Other faults at pairs the mask hides are
faults.py's, launched after these kernels. dk and dv of a kv head sum over its group
of q heads inside one program, and dq is its own pass over keys: no atomics, the same
bits on every run.
"""

import triton
import triton.language as tl

from speedlight.kernels.attention.common import (LOG2E, _any_per_row, _block, _dscores,
                                                 _key_range, _load_cols, _load_rows,
                                                 _nonfinite, _operand, _probs, _program,
                                                 _query_range, _sequence)


@triton.jit
def _attention_bwd_delta_kernel(
    o_ptr, do_ptr, lse_ptr, dlse_ptr, delta_ptr, nan_ptr, cu_q_ptr, m_blocks, seq_q, total_q,
    heads_q, head_dim,
    stride_ob, stride_oh, stride_om,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """delta = rowsum(do * o) - dlse, fp32, for BLOCK_M query rows of one (batch, head),
    and the block's NaN flag: 0, or NaN when the lse of one of its rows is NaN or +inf.

    grid (m_blocks * batch * heads_q,), m_blocks = cdiv(max seq_q, BLOCK_M). o, do [batch,
    heads_q, seq_q, head_dim] by their strides (packed [total, heads, head_dim] with VARLEN); lse,
    dlse and delta fp32 [batch, heads_q, seq_q] at the lse strides; nan fp32 [batch, heads_q,
    m_blocks] contiguous, every entry written. HAS_DLSE reads dlse.
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q)
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
    # a non-finite upstream gradient: the math backend's sum_j p_ij dp_ij is NaN (an inf dp
    # at every key, of either sign, or times a hidden key's zero p), so is every ds_ij
    delta = tl.where(_any_per_row(_nonfinite(do)), float("nan"), delta)
    lse_offs = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh + rows * stride_lm
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + lse_offs, mask=mask_m, other=0.0)
    tl.store(delta_ptr + lse_offs, delta, mask=mask_m)
    lse = tl.load(lse_ptr + lse_offs, mask=mask_m, other=0.0)
    # [BM] -> one, a sum keeping NaN: a NaN lse, or +inf (torch's softmax of a row with a
    # +inf score, its max subtracted, is NaN at every key)
    flag = tl.sum(tl.where((lse != lse) | (lse == float("inf")), float("nan"), 0.0), 0)
    tl.store(nan_ptr + (pid_b.to(tl.int64) * heads_q + pid_h) * m_blocks + pid_m, flag)


@triton.jit
def _attention_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, nan_ptr, dk_ptr, dv_ptr, cu_q_ptr, cu_k_ptr,
    n_blocks, nan_blocks, seq_q, seq_k, total_q, total_k, heads_kv, group, head_dim, sm_scale,
    softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """dk and dv of BLOCK_N keys of one (batch, kv head), summed over the group's q heads
    and every query block that sees them; tiles computed transposed ([BN, BM]). The NaN
    flags of the group's heads (nan fp32 [batch, heads_q, nan_blocks], read BLOCK_F at a
    time) are added to every key: a row whose softmax is NaN makes all of dk and dv NaN.

    grid (n_blocks * batch * heads_kv,), n_blocks = cdiv(max seq_k, BLOCK_N). q, do [batch, heads_kv * group,
    seq_q, head_dim], k, v, dk, dv [batch, heads_kv, seq_k, head_dim] by their strides
    (packed with VARLEN); lse and delta fp32 [batch, heads_q, seq_q] at the lse strides.
    Constexprs as in _attention_fwd_kernel.
    """
    pid_n, pid_b, pid_kv = _program(tl.program_id(0), n_blocks, heads_kv)
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    n_lo = pid_n * BLOCK_N
    if n_lo >= seq_k:
        return
    offs_n, mask_n = _block(n_lo, seq_k, BLOCK_N)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    mask_nd = mask_n[:, None] & mask_d[None, :]
    rows_k = (k_start + offs_n).to(tl.int64)
    k = _load_rows(k_ptr, pid_b, pid_kv, rows_k, offs_d, mask_nd, stride_kb, stride_kh,
                   stride_kn, UPCAST)
    v = _load_rows(v_ptr, pid_b, pid_kv, rows_k, offs_d, mask_nd, stride_vb, stride_vh,
                   stride_vn, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo, hi = _query_range(n_lo, tl.minimum(n_lo + BLOCK_N, seq_k), seq_q, seq_k, left, right,
                          BLOCK_M)
    nan = 0.0
    for g in range(0, group):
        pid_h = (pid_kv * group + g).to(tl.int64)
        nan_base = nan_ptr + (pid_b.to(tl.int64) * (heads_kv * group) + pid_h) * nan_blocks
        for f0 in range(0, nan_blocks, BLOCK_F):
            offs_f, mask_f = _block(f0, nan_blocks, BLOCK_F)
            nan += tl.sum(tl.load(nan_base + offs_f, mask=mask_f, other=0.0), 0)
        q_base = q_ptr + pid_b.to(tl.int64) * stride_qb + pid_h * stride_qh
        do_base = do_ptr + pid_b.to(tl.int64) * stride_db + pid_h * stride_dh
        l_base = pid_b.to(tl.int64) * stride_lb + pid_h * stride_lh
        for start_m in range(lo, hi, BLOCK_M):
            offs_m, mask_m = _block(start_m, hi, BLOCK_M)
            rows_q = (q_start + offs_m).to(tl.int64)
            mask_dm = mask_d[:, None] & mask_m[None, :]
            q_t = _load_cols(q_base, rows_q, offs_d, mask_dm, stride_qm, UPCAST)
            do_t = _load_cols(do_base, rows_q, offs_d, mask_dm, stride_dm, UPCAST)
            lse = tl.load(lse_ptr + l_base + rows_q * stride_lm, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptr + l_base + rows_q * stride_lm, mask=mask_m, other=0.0)
            lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # no key: p = 0
            # [BN, D] @ [D, BM] -> [BN, BM]
            p_t, dcap_t = _probs(k, q_t, offs_m[None, :], offs_n[:, None], mask_m[None, :],
                                 lse2[None, :], seq_q, seq_k, left, right, sm_scale, softcap,
                                 WINDOW, SOFTCAP, PRECISION)
            p_lo = _operand(p_t, do_ptr.dtype.element_ty, UPCAST)
            # [BN, BM] @ [BM, D] -> [BN, D]
            dv += tl.dot(p_lo, tl.trans(do_t), input_precision=PRECISION)
            dp_t = tl.dot(v, do_t, input_precision=PRECISION)  # [BN, D] @ [D, BM] -> [BN, BM]
            ds_lo = _dscores(p_t, dp_t, delta[None, :], dcap_t, q_ptr.dtype.element_ty,
                             SOFTCAP, UPCAST)
            # [BN, BM] @ [BM, D] -> [BN, D]
            dk += tl.dot(ds_lo, tl.trans(q_t), input_precision=PRECISION)
    dk = dk * sm_scale + nan
    dv += nan
    tl.store(dk_ptr + pid_b.to(tl.int64) * stride_dkb + pid_kv.to(tl.int64) * stride_dkh
             + rows_k[:, None] * stride_dkn + offs_d[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=mask_nd)
    tl.store(dv_ptr + pid_b.to(tl.int64) * stride_dvb + pid_kv.to(tl.int64) * stride_dvh
             + rows_k[:, None] * stride_dvn + offs_d[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=mask_nd)


@triton.jit
def _attention_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_q_ptr, cu_k_ptr,
    m_blocks, seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap,
    left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm,
    VARLEN: tl.constexpr, WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq of BLOCK_M query rows of one (batch, q head) over the keys they see.

    grid (m_blocks * batch * heads_q,). Shapes as in _attention_bwd_dkdv_kernel;
    dq has q's shape. Constexprs as in _attention_fwd_kernel.
    """
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q)
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    m_lo = pid_m * BLOCK_M
    if m_lo >= seq_q:
        return
    offs_m, mask_m = _block(m_lo, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    mask_md = mask_m[:, None] & mask_d[None, :]
    rows_q = (q_start + offs_m).to(tl.int64)
    q = _load_rows(q_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_qb, stride_qh,
                   stride_qm, UPCAST)
    do = _load_rows(do_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_db, stride_dh,
                    stride_dm, UPCAST)
    l_offs = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh + rows_q * stride_lm
    lse = tl.load(lse_ptr + l_offs, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + l_offs, mask=mask_m, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # no key: p = 0
    pid_kv = (pid_h // group).to(tl.int64)
    k_base = k_ptr + pid_b.to(tl.int64) * stride_kb + pid_kv * stride_kh
    v_base = v_ptr + pid_b.to(tl.int64) * stride_vb + pid_kv * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = _key_range(m_lo, tl.minimum(m_lo + BLOCK_M, seq_q), seq_q, seq_k, left, right,
                        BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n, mask_n = _block(start_n, hi, BLOCK_N)
        rows_k = (k_start + offs_n).to(tl.int64)
        mask_dn = mask_d[:, None] & mask_n[None, :]
        k_t = _load_cols(k_base, rows_k, offs_d, mask_dn, stride_kn, UPCAST)
        v_t = _load_cols(v_base, rows_k, offs_d, mask_dn, stride_vn, UPCAST)
        # [BM, D] @ [D, BN] -> [BM, BN]
        p, dcap = _probs(q, k_t, offs_m[:, None], offs_n[None, :], mask_n[None, :],
                         lse2[:, None], seq_q, seq_k, left, right, sm_scale, softcap,
                         WINDOW, SOFTCAP, PRECISION)
        dp = tl.dot(do, v_t, input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
        ds_lo = _dscores(p, dp, delta[:, None], dcap, k_ptr.dtype.element_ty, SOFTCAP, UPCAST)
        # [BM, BN] @ [BN, D] -> [BM, D]
        dq += tl.dot(ds_lo, tl.trans(k_t), input_precision=PRECISION)
    dq *= sm_scale
    tl.store(dq_ptr + pid_b.to(tl.int64) * stride_dqb + pid_h.to(tl.int64) * stride_dqh
             + rows_q[:, None] * stride_dqm + offs_d[None, :], dq.to(dq_ptr.dtype.element_ty),
             mask=mask_md)
