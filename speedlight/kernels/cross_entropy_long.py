"""Cross-entropy's Triton kernels for rows too long for one register tile (vocab above
ops/cross_entropy_launch.py's MAX_FUSED_N): the looped forward, and the split pair for few
long rows. The math, the row addressing, the extras and the handling of targets are
kernels/cross_entropy.py's (whose helpers these kernels share):

  fwd looped   a first loop computes the online (max, sum of exp, sum of c) over BLOCK_N
               chunks, a second re-reads the row and writes the gradient.
  split pair   each row is cut into spans, one program per span; a stats kernel writes
               each span's (max, sum exp, sum c), a finish kernel combines them, writes the
               loss (span 0) and its span of the gradient.
"""

import triton
import triton.language as tl

from speedlight.kernels.cross_entropy import (
    _grad_scale,
    _grad_tile,
    _load_class_weights,
    _load_logits,
    _merge_argmax,
    _merge_stats,
    _row_loss,
    _row_offsets,
    _row_targets,
    _store_extras,
    _store_row_loss,
    _target_logit,
    _target_weight,
)


@triton.jit
def _span_stats(x_rows, mask_m, t, start, end, n_cols, stride_v, softcap, weight_ptr,
                HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, EXTRAS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(max, sum exp(c - max), the same without column t, sum w_j c_j, argmax, first NaN
    column) per row over columns [start, end), BLOCK_N at a time (the last two tracked
    only with EXTRAS)."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    d_rest = tl.zeros([BLOCK_M], tl.float32)
    sc = tl.zeros([BLOCK_M], tl.float32)
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK_M], 2147483647, tl.int32)
    nan_idx = tl.full([BLOCK_M], 2147483647, tl.int32)
    for s in range(start, end, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        mask = mask_m[:, None] & (cols < end)[None, :]
        x, c, _ = _load_logits(x_rows, cols, mask, stride_v, softcap, HAS_SOFTCAP)
        w = _load_class_weights(weight_ptr, cols, n_cols, HAS_WEIGHT)
        m, d, d_rest, sc = _merge_stats(m, d, d_rest, sc, c, w, cols, t, mask, HAS_WEIGHT)
        if EXTRAS:
            best, best_idx, nan_idx = _merge_argmax(best, best_idx, nan_idx, x, cols, mask)
    return m, d, d_rest, sc, best_idx, nan_idx


@triton.jit
def _span_grad(x_rows, dx_rows, mask_m, start, end, stride_xv, stride_dv, t, valid, bad,
               m, log_d, p_t_minus_1, coef, w_t, gscale, weight_ptr, n_cols, label_smoothing,
               softcap, HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Write dloss/dx over columns [start, end), re-reading the logits BLOCK_N at a time."""
    for s in range(start, end, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        mask = mask_m[:, None] & (cols < end)[None, :]
        _, c, dc = _load_logits(x_rows, cols, mask, stride_xv, softcap, HAS_SOFTCAP)
        w = _load_class_weights(weight_ptr, cols, n_cols, HAS_WEIGHT)
        g = _grad_tile(c, dc, w, cols, t, valid, bad, m, log_d, p_t_minus_1, coef, w_t, gscale,
                       n_cols, label_smoothing, HAS_SOFTCAP, HAS_WEIGHT)
        tl.store(dx_rows[:, None] + cols[None, :].to(tl.int64) * stride_dv,
                 g.to(dx_rows.dtype.element_ty), mask=mask)


@triton.jit
def _cross_entropy_fwd_looped_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr, weight_ptr, w_sum_ptr, z_ptr, correct_ptr, pred_ptr,
    grad_scale_ptr, n_rows, n_cols, seq,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv, stride_gs,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    EXTRAS: tl.constexpr, GRAD_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """As _cross_entropy_fwd_kernel for rows longer than BLOCK_N: a first loop computes the
    online (max, sum of exp, sum of c, argmax) over BLOCK_N chunks, a second re-reads the
    row and writes the gradient. Pointers and constexprs as there."""
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    w_t, w_sum = _target_weight(weight_ptr, w_sum_ptr, t, valid, HAS_WEIGHT)
    m, d, d_rest, sc, best_idx, nan_idx = _span_stats(
        x_rows, mask_m, t, 0, n_cols, n_cols, stride_xv, softcap, weight_ptr, HAS_SOFTCAP,
        HAS_WEIGHT, EXTRAS, BLOCK_M, BLOCK_N)
    log_d, coef, z_row = _store_row_loss(x_rows, t, valid, bad, m, d, sc, w_t, w_sum, loss_ptr,
                                         offs_m, mask_m, n_cols, stride_xv, label_smoothing,
                                         z_loss, softcap, HAS_SOFTCAP, HAS_WEIGHT)
    if EXTRAS:
        _store_extras(best_idx, nan_idx, t, valid, z_row, z_ptr, correct_ptr, pred_ptr, offs_m,
                      mask_m)
    if COMPUTE_GRAD:
        gscale = _grad_scale(grad_scale_ptr, offs_m, mask_m, stride_gs, GRAD_SCALE)
        _span_grad(x_rows, dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds), mask_m,
                   0, n_cols, stride_xv, stride_dv, t, valid, bad, m, log_d, -d_rest / d,
                   coef, w_t, gscale, weight_ptr, n_cols, label_smoothing, softcap,
                   HAS_SOFTCAP, HAS_WEIGHT, BLOCK_N)


@triton.jit
def _cross_entropy_split_stats_kernel(
    x_ptr, target_ptr, weight_ptr, stats_ptr, n_cols, seq, span, n_splits,
    stride_xb, stride_xs, stride_xv, stride_t, ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """(max, sum exp(c - max), the same without the target, sum w_j c_j, c[t]) of span q
    of row r into stats_ptr[:, r, q] ([5, rows, n_splits] fp32; c[t] is the row's, written
    by span 0); the grid is (rows, n_splits). The target logit is read here, before the
    finish kernel may overwrite it with the in-place gradient. weight_ptr [n_cols]."""
    row = tl.program_id(0)
    q = tl.program_id(1)
    offs_m = row + tl.arange(0, 1)
    mask_m = offs_m >= 0
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, _ = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    start = q * span
    m, d, d_rest, sc, _, _ = _span_stats(x_rows, mask_m, t, start,
                                         tl.minimum(start + span, n_cols), n_cols, stride_xv,
                                         softcap, weight_ptr, HAS_SOFTCAP, HAS_WEIGHT, False,
                                         1, BLOCK_N)
    n_stats = tl.num_programs(0).to(tl.int64) * n_splits
    at = row.to(tl.int64) * n_splits + q + tl.arange(0, 1)
    tl.store(stats_ptr + at, m)
    tl.store(stats_ptr + n_stats + at, d)
    tl.store(stats_ptr + 2 * n_stats + at, d_rest)
    tl.store(stats_ptr + 3 * n_stats + at, sc)
    if q == 0:
        x_t = _target_logit(x_rows, t, valid, stride_xv, softcap, HAS_SOFTCAP)
        tl.store(stats_ptr + 4 * n_stats + at, x_t)


@triton.jit
def _cross_entropy_split_finish_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr, weight_ptr, w_sum_ptr, stats_ptr, grad_scale_ptr,
    n_cols, seq, span, n_splits,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv, stride_gs,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    GRAD_SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Combine the n_splits statistics of row r; span 0 writes loss[r], span q writes
    dx[r] over its columns (when COMPUTE_GRAD). Pointers as in _cross_entropy_fwd_kernel
    plus stats_ptr [5, rows, n_splits]; the grid is (rows, n_splits or 1). (No extras: the
    host takes the looped kernel when they are asked for.)"""
    row = tl.program_id(0)
    q = tl.program_id(1)
    offs_m = row + tl.arange(0, 1)
    mask_m = offs_m >= 0
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    w_t, w_sum = _target_weight(weight_ptr, w_sum_ptr, t, valid, HAS_WEIGHT)

    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < n_splits
    n_stats = tl.num_programs(0).to(tl.int64) * n_splits
    at = row.to(tl.int64) * n_splits + offs_s
    ms = tl.load(stats_ptr + at, mask=mask_s, other=float("-inf"))
    ds = tl.load(stats_ptr + n_stats + at, mask=mask_s, other=0.0)
    d_rests = tl.load(stats_ptr + 2 * n_stats + at, mask=mask_s, other=0.0)
    scs = tl.load(stats_ptr + 3 * n_stats + at, mask=mask_s, other=0.0)
    # [BS] -> scalars, then [1] like the row statistics of the other kernels. (Reduced from
    # a [1, BS] tile they would carry its layout, and the compiler would convert the
    # gradient tile to it through shared memory.)
    m = tl.max(ms, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    scale = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m_safe))
    one = tl.zeros([1], tl.float32)
    d = tl.sum(ds * scale, axis=0) + one
    d_rest = tl.sum(d_rests * scale, axis=0) + one
    sc = tl.sum(scs, axis=0) + one
    m = m + one
    x_t = tl.load(stats_ptr + 4 * n_stats + row.to(tl.int64) * n_splits + tl.arange(0, 1))

    loss, log_d, coef, _ = _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing,
                                     z_loss, w_t, w_sum, HAS_WEIGHT)
    tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=q == 0)

    if COMPUTE_GRAD:
        start = q * span
        gscale = _grad_scale(grad_scale_ptr, offs_m, mask_m, stride_gs, GRAD_SCALE)
        _span_grad(x_rows, dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds), mask_m,
                   start, tl.minimum(start + span, n_cols), stride_xv, stride_dv, t, valid, bad,
                   m, log_d, -d_rest / d, coef, w_t, gscale, weight_ptr, n_cols,
                   label_smoothing, softcap, HAS_SOFTCAP, HAS_WEIGHT, BLOCK_N)
