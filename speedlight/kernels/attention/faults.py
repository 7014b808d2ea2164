"""Attention's faults where the mask hides them, as SDPA's math backend has them.

The math backend adds the mask to the dense score matrix and multiplies dense matrices, so
a pair a row cannot see still carries a fault: its score minus inf is NaN when the score
is NaN or +inf (the row's softmax is then NaN), and its zero probability (or zero score
gradient) times a non-finite value, upstream gradient or operand is NaN. The flash kernels
never visit hidden pairs. These kernels run after them, only when the mask hides some key
(launch_fwd / launch_bwd decide that from the shapes), and each program returns at once
unless `flag` (fp32 [1], the sum of the inputs' sums: NaN or +-inf when any input holds a
non-finite value) says a fault exists. A program that goes on walks every pair of its rows
or keys and writes NaN over the outputs the math backend makes NaN, nothing else.

    o_id   NaN if a hidden key j has s_ij NaN or +inf (lse_i too), or v_jd non-finite
    dq_id  NaN if a hidden key j has dp_ij = do_i . v_j non-finite, or row i's delta or lse
           non-finite, or k_jd non-finite
    dk_jd  NaN if a hidden row i has dp_ij, delta_i or lse_i non-finite, or q_id non-finite
    dv_jd  NaN if a hidden row i has do_id non-finite

(A row whose lse is NaN or +inf already has NaN at every key's dk and dv: the main
backward's flags.) Finite inputs whose hidden scores overflow are not caught: the flag is
finite then.
"""

import triton
import triton.language as tl

from speedlight.kernels.attention.common import (_any_per_row, _block, _hidden, _hits,
                                                 _load_cols, _load_rows, _nonfinite, _program,
                                                 _scores, _sequence)


@triton.jit
def _store_nan(base, rows, offs_d, stride_row, nan, mask_rows, mask_d):
    """NaN into the [len(rows), BLOCK_D] tile of one head (base: its first element, int64
    row indices `rows`) where `nan` holds and the row and column exist; nothing else."""
    tl.store(base + rows[:, None] * stride_row + offs_d[None, :],
             tl.where(nan, float("nan"), 0.0).to(base.dtype.element_ty),
             mask=nan & mask_rows[:, None] & mask_d[None, :])


@triton.jit
def _query_tile(cu_q_ptr, cu_k_ptr, m_blocks, heads_q, seq_q, seq_k, total_q, total_k,
                head_dim, VARLEN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(first row m_lo, batch entry, q head, first key row, seq_q, seq_k, offs_m, mask_m,
    offs_d, mask_d, int64 query rows) of this program's BLOCK_M query rows; a block past
    its sequence has m_lo >= seq_q."""
    pid_m, pid_b, pid_h = _program(tl.program_id(0), m_blocks, heads_q)
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    offs_m, mask_m = _block(pid_m * BLOCK_M, seq_q, BLOCK_M)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    return (pid_m * BLOCK_M, pid_b, pid_h, k_start, seq_q, seq_k, offs_m, mask_m, offs_d,
            mask_d, (q_start + offs_m).to(tl.int64))


@triton.jit
def _attention_fwd_faults_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, flag_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
    seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_lb, stride_lh, stride_lm,
    VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """NaN over o and lse of BLOCK_M query rows of one (batch, q head) where a hidden key
    makes them NaN. Grid and layouts as _attention_fwd_kernel's (one split)."""
    if tl.load(flag_ptr) * 0.0 == 0.0:  # every input finite
        return
    m_lo, pid_b, pid_h, k_start, seq_q, seq_k, offs_m, mask_m, offs_d, mask_d, rows_q = \
        _query_tile(cu_q_ptr, cu_k_ptr, m_blocks, heads_q, seq_q, seq_k, total_q, total_k,
                    head_dim, VARLEN, BLOCK_M, BLOCK_D)
    if m_lo >= seq_q:
        return
    q = _load_rows(q_ptr, pid_b, pid_h, rows_q, offs_d, mask_m[:, None] & mask_d[None, :],
                   stride_qb, stride_qh, stride_qm, UPCAST)
    pid_kv = pid_h // group
    k_base = k_ptr + pid_b.to(tl.int64) * stride_kb + pid_kv.to(tl.int64) * stride_kh
    row_nan = tl.zeros([BLOCK_M], tl.int1)
    col_nan = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, seq_k, BLOCK_N):
        offs_n, mask_n = _block(start_n, seq_k, BLOCK_N)
        rows_k = (k_start + offs_n).to(tl.int64)
        k_t = _load_cols(k_base, rows_k, offs_d, mask_d[:, None] & mask_n[None, :], stride_kn,
                         UPCAST)
        v = _load_rows(v_ptr, pid_b, pid_kv, rows_k, offs_d, mask_n[:, None] & mask_d[None, :],
                       stride_vb, stride_vh, stride_vn, UPCAST)
        s, _ = _scores(q, k_t, sm_scale, softcap, SOFTCAP, PRECISION)  # [BM, BN]
        hid = _hidden(offs_m[:, None], offs_n[None, :], seq_q, seq_k, left, right)
        row_nan |= _any_per_row(hid & ((s != s) | (s == float("inf"))))
        col_nan += _hits(hid, _nonfinite(v))  # [BM, BN] @ [BN, D] -> [BM, D]
    _store_nan(o_ptr + pid_b.to(tl.int64) * stride_ob + pid_h.to(tl.int64) * stride_oh,
               rows_q, offs_d, stride_om, row_nan[:, None] | (col_nan > 0), mask_m, mask_d)
    tl.store(lse_ptr + pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh
             + rows_q * stride_lm, tl.full([BLOCK_M], float("nan"), tl.float32),
             mask=row_nan & mask_m)


@triton.jit
def _attention_bwd_dq_faults_kernel(
    k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, flag_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
    seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, left, right,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm,
    VARLEN: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """NaN over dq of BLOCK_M query rows of one (batch, q head) where a hidden key makes
    it NaN. Grid and layouts as _attention_bwd_dq_kernel's."""
    if tl.load(flag_ptr) * 0.0 == 0.0:  # every input finite
        return
    m_lo, pid_b, pid_h, k_start, seq_q, seq_k, offs_m, mask_m, offs_d, mask_d, rows_q = \
        _query_tile(cu_q_ptr, cu_k_ptr, m_blocks, heads_q, seq_q, seq_k, total_q, total_k,
                    head_dim, VARLEN, BLOCK_M, BLOCK_D)
    if m_lo >= seq_q:
        return
    do = _load_rows(do_ptr, pid_b, pid_h, rows_q, offs_d, mask_m[:, None] & mask_d[None, :],
                    stride_db, stride_dh, stride_dm, UPCAST)
    l_offs = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh + rows_q * stride_lm
    lse = tl.load(lse_ptr + l_offs, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + l_offs, mask=mask_m, other=0.0)
    rows_bad = (lse != lse) | _nonfinite(delta)
    pid_kv = pid_h // group
    v_base = v_ptr + pid_b.to(tl.int64) * stride_vb + pid_kv.to(tl.int64) * stride_vh
    row_nan = tl.zeros([BLOCK_M], tl.int1)
    col_nan = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, seq_k, BLOCK_N):
        offs_n, mask_n = _block(start_n, seq_k, BLOCK_N)
        rows_k = (k_start + offs_n).to(tl.int64)
        k = _load_rows(k_ptr, pid_b, pid_kv, rows_k, offs_d, mask_n[:, None] & mask_d[None, :],
                       stride_kb, stride_kh, stride_kn, UPCAST)
        v_t = _load_cols(v_base, rows_k, offs_d, mask_d[:, None] & mask_n[None, :], stride_vn,
                         UPCAST)
        dp = tl.dot(do, v_t, input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
        hid = _hidden(offs_m[:, None], offs_n[None, :], seq_q, seq_k, left, right)
        row_nan |= _any_per_row(hid & (_nonfinite(dp) | rows_bad[:, None]))
        col_nan += _hits(hid, _nonfinite(k))  # [BM, BN] @ [BN, D] -> [BM, D]
    _store_nan(dq_ptr + pid_b.to(tl.int64) * stride_dqb + pid_h.to(tl.int64) * stride_dqh,
               rows_q, offs_d, stride_dqm, row_nan[:, None] | (col_nan > 0), mask_m, mask_d)


@triton.jit
def _attention_bwd_dkdv_faults_kernel(
    q_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, flag_ptr, cu_q_ptr, cu_k_ptr,
    n_blocks, seq_q, seq_k, total_q, total_k, heads_kv, group, head_dim, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    VARLEN: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """NaN over dk and dv of BLOCK_N keys of one (batch, kv head) where a hidden row of
    the group's q heads makes them NaN. Grid and layouts as _attention_bwd_dkdv_kernel's."""
    if tl.load(flag_ptr) * 0.0 == 0.0:  # every input finite
        return
    pid_n, pid_b, pid_kv = _program(tl.program_id(0), n_blocks, heads_kv)
    q_start, k_start, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q,
                                               total_k, VARLEN)
    if pid_n * BLOCK_N >= seq_k:
        return
    offs_n, mask_n = _block(pid_n * BLOCK_N, seq_k, BLOCK_N)
    offs_d, mask_d = _block(0, head_dim, BLOCK_D)
    mask_nd = mask_n[:, None] & mask_d[None, :]
    rows_k = (k_start + offs_n).to(tl.int64)
    v = _load_rows(v_ptr, pid_b, pid_kv, rows_k, offs_d, mask_nd, stride_vb, stride_vh,
                   stride_vn, UPCAST)
    key_nan = tl.zeros([BLOCK_N], tl.int1)
    dk_nan = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_nan = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for g in range(0, group):
        pid_h = pid_kv * group + g
        l_base = pid_b.to(tl.int64) * stride_lb + pid_h.to(tl.int64) * stride_lh
        for start_m in range(0, seq_q, BLOCK_M):
            offs_m, mask_m = _block(start_m, seq_q, BLOCK_M)
            rows_q = (q_start + offs_m).to(tl.int64)
            mask_md = mask_m[:, None] & mask_d[None, :]
            q = _load_rows(q_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_qb, stride_qh,
                           stride_qm, UPCAST)
            do = _load_rows(do_ptr, pid_b, pid_h, rows_q, offs_d, mask_md, stride_db,
                            stride_dh, stride_dm, UPCAST)
            lse = tl.load(lse_ptr + l_base + rows_q * stride_lm, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptr + l_base + rows_q * stride_lm, mask=mask_m, other=0.0)
            # [BN, D] @ [D, BM] -> [BN, BM]
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            hid_t = _hidden(offs_m[None, :], offs_n[:, None], seq_q, seq_k, left, right)
            rows_bad = (lse != lse) | _nonfinite(delta)
            key_nan |= _any_per_row(hid_t & (_nonfinite(dp_t) | rows_bad[None, :]))
            dk_nan += _hits(hid_t, _nonfinite(q))  # [BN, BM] @ [BM, D] -> [BN, D]
            dv_nan += _hits(hid_t, _nonfinite(do))
    _store_nan(dk_ptr + pid_b.to(tl.int64) * stride_dkb + pid_kv.to(tl.int64) * stride_dkh,
               rows_k, offs_d, stride_dkn, key_nan[:, None] | (dk_nan > 0), mask_n, mask_d)
    _store_nan(dv_ptr + pid_b.to(tl.int64) * stride_dvb + pid_kv.to(tl.int64) * stride_dvh,
               rows_k, offs_d, stride_dvn, dv_nan > 0, mask_n, mask_d)
