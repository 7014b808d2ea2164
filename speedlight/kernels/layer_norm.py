"""Triton kernels of LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b, var biased.

A row tile holds whole rows in registers (n_cols <= BLOCK_N: one read of x, the variance
taken around the mean already in registers, so no E[x^2] - E[x]^2 cancellation); looped
kernels take rows longer than one block in three sweeps (sum, centered sum of squares,
write), the last two from L2. A row whose centred sum of squares overflows or underflows
(or whose sum does) has its mean and variance taken of x / p, p a power of two near its
largest |x| (norm_scale.py), so y is right wherever it is representable; other rows take
two reductions, bit for bit the scaled formula.
"""

import triton
import triton.language as tl

from speedlight.kernels.norm_scale import SUM_MAX, SUM_MIN, _pow2_scale
from speedlight.kernels.row_tile import _load_chunk, _load_tile, _row_block, _row_chunk


@triton.jit
def _rounded_product(a, b):
    """a * b rounded to fp32 once, never contracted into a later add: an FMA with a zero
    addend is the product rounded, and a compiler fuses only a multiply into an add."""
    return tl.fma(a, b, 0.0)


@triton.jit
def _layer_norm_stats_scaled(x, mask, n_cols, eps):
    """(mean [BM], rstd [BM], xc [BM, BN], r [BM]) of a fp32 tile x (masked lanes 0) with
    y = xc * r * w + b: the mean and variance of x / p (xc = x / p - mean / p, r = rstd * p),
    three reductions (the max, the mean, the centred sum of squares), right for any x."""
    # [BM, BN] -> [BM]: the scale p, then the mean and variance of x / p
    p, inv_p = _pow2_scale(tl.max(tl.abs(x), axis=1), eps)
    # x / p rounded once, as dxhat in the backward: at hidden 1 the mean is x / p
    # itself, and `x / p - mean` is 0 (exact scaling, but for subnormal x / p)
    xs = _rounded_product(x, inv_p[:, None])
    mean_s = tl.sum(xs, axis=1) / n_cols
    xc = tl.where(mask, xs - mean_s[:, None], 0.0)
    # [BM, BN] -> [BM]
    var_s = tl.sum(xc * xc, axis=1) / n_cols
    rstd_s = 1.0 / tl.sqrt(var_s + eps * inv_p * inv_p)  # = rstd * p
    return mean_s * p, rstd_s * inv_p, xc, rstd_s


@triton.jit
def _layer_norm_stats(x, mask, mask_m, n_cols, eps):
    """_layer_norm_stats_scaled's four values, bit for bit, from two reductions (the mean,
    the centred sum of squares) on the common path; the scaled form only when a row of the
    tile needs it (its centred sum of squares outside [SUM_MIN, SUM_MAX], or NaN: a sum of x
    that overflowed makes it NaN). Where the scaled form is not needed, x / p - mean / p
    and every statistic are the unscaled ones times powers of two, exactly."""
    # [BM, BN] -> [BM]
    mean = tl.sum(x, axis=1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    # [BM, BN] -> [BM]
    sum_sq = tl.sum(xc * xc, axis=1)
    unsafe = tl.where(mask_m & ((sum_sq < SUM_MIN) | (sum_sq > SUM_MAX) | (sum_sq != sum_sq)),
                      1, 0)
    # [BM] -> scalar: one branch for the whole tile
    if tl.max(unsafe, axis=0) != 0:
        mean, rstd, xc, r = _layer_norm_stats_scaled(x, mask, n_cols, eps)
    else:
        rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
        r = rstd
    return mean, rstd, xc, r


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, stride_xm, stride_xn, stride_ym,
    eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """y[m] = (x[m] - mean[m]) * rstd[m] * w + b, rstd[m] = 1 / sqrt(var(x[m]) + eps).

    x_ptr [n_rows, n_cols] (strides stride_xm, stride_xn), w_ptr, b_ptr [n_cols],
    y_ptr [n_rows, n_cols] (row stride stride_ym, unit column stride),
    mean_ptr, rstd_ptr [n_rows] fp32. BLOCK_N >= n_cols: whole rows in registers, so x is
    read once. Persistent: program p takes the tiles of BLOCK_M rows p, p + P, p + 2P, ...
    (P programs in the grid) and loads w and b once for all of them; STAGES: the depth of
    the tile loop's software pipeline (rms_norm._rms_norm_fwd_kernel).
    HAS_WEIGHT / HAS_BIAS = False remove the load of w / b; STORE_STATS=False the stores
    of mean and rstd (inference: no backward will read them).
    """
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    cols = offs_n.to(tl.int64)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    for tile in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), n_programs, num_stages=STAGES):
        offs_m, mask_m, mask, rows = _row_block(tile * BLOCK_M, n_rows, mask_n, BLOCK_M)
        x = _load_tile(x_ptr, rows, cols, stride_xm, stride_xn, mask)
        # [BM, BN] -> [BM]: two reductions, but extreme rows (three, over x / p)
        mean, rstd, xc, r = _layer_norm_stats(x, mask, mask_m, n_cols, eps)
        if STORE_STATS:
            tl.store(mean_ptr + offs_m, mean, mask=mask_m)
            tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)
        y = xc * r[:, None]
        if HAS_WEIGHT:
            y = y * w[None, :]
        if HAS_BIAS:
            y = y + b[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_fwd_looped_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_cols, stride_xm, stride_xn, stride_ym,
    eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The same formula for rows longer than BLOCK_N, one row per program: a sweep for the
    mean and the scale p (the running max rescales the lanes' sum of x / p by powers of two,
    exactly, as online softmax does), one for the centered sum of squares of x / p, one to
    write y (fp32 lanes throughout).

    Pointers as in _layer_norm_fwd_kernel; the grid is (n_rows,).
    """
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_ym
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    max_abs = tl.full([], 0.0, tl.float32)
    p, inv_p = _pow2_scale(max_abs, eps)  # acc holds sum(x / p)
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        # [BN] -> scalar: a larger max moves acc to the new scale (a power of two, exact)
        max_abs = tl.maximum(max_abs, tl.max(tl.abs(x), axis=0))
        p_new, inv_p_new = _pow2_scale(max_abs, eps)
        acc = acc * (p * inv_p_new) + x * inv_p_new
        p, inv_p = p_new, inv_p_new
    # [BN] -> scalar
    mean_s = tl.sum(acc, axis=0) / n_cols
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        xc = tl.where(mask_n, x * inv_p - mean_s, 0.0)
        acc += xc * xc
    # [BN] -> scalar
    rstd = inv_p / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps * inv_p * inv_p)
    mean = mean_s * p
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        y = (x - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(y_row + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)
    if STORE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


# Backward. With r = rstd, xhat = (x - mean) * r and y = xhat * w + b:
#   dxhat = dy * w
#   dx    = r * (dxhat - c1 - xhat * c2),  c1 = mean_j(dxhat_j), c2 = mean_j(dxhat_j * xhat_j)
#   dw    = sum_rows(dy * xhat),           db = sum_rows(dy)
# (c1 is the gradient through the mean, c2 through the variance.) dw and db are reduced
# without atomics: each program sums the rows it takes into one row of
# dw_partial / db_partial [n_programs, n_cols] (fp32), and row_tile._column_sum_kernel sums
# those rows and casts them in one launch after.
# dxhat is rounded once and that value is both summed into c1 and used in dx: were the
# product contracted into `dxhat - c1` (an FMA, as the GPU's compiler does with a multiply
# feeding a subtraction), dx would carry dy * w's rounding error where the terms cancel
# exactly (hidden 1: dx = 0 exactly, 4.7e-6 on an H200 before). inspect's rounding-leak
# finding names such an FFMA; tests/inspect/test_findings.py holds these kernels to none.


@triton.jit
def _layer_norm_bwd_row_dot_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, c1_ptr, c2_ptr,
    n_cols, stride_dym, stride_dyn, stride_xm, stride_xn,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """c1[m] = mean_j(dxhat[m, j]) and c2[m] = mean_j(dxhat[m, j] * xhat[m, j]) for rows
    longer than BLOCK_N.

    dy_ptr, x_ptr [n_rows, n_cols], w_ptr [n_cols], mean_ptr, rstd_ptr, c1_ptr, c2_ptr
    [n_rows] fp32; the grid is (n_rows,).
    """
    row = tl.program_id(0).to(tl.int64)
    mean = tl.load(mean_ptr + row)
    r = tl.load(rstd_ptr + row)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        dxhat = _load_chunk(dy_ptr, row, cols, stride_dym, stride_dyn, mask_n)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        if HAS_WEIGHT:
            dxhat = _rounded_product(dxhat,
                                     tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32))
        acc1 += dxhat
        acc2 += dxhat * tl.where(mask_n, (x - mean) * r, 0.0)
    # [BN] -> scalar
    tl.store(c1_ptr + row, tl.sum(acc1, axis=0) / n_cols)
    tl.store(c2_ptr + row, tl.sum(acc2, axis=0) / n_cols)


@triton.jit
def _layer_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr, c1_ptr, c2_ptr,
    dx_ptr, dw_partial_ptr, db_partial_ptr,
    n_rows, n_cols,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dxm,
    SPLIT_ROW: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """dx and this program's share of dw and db.

    dy_ptr, x_ptr [n_rows, n_cols] (own strides), w_ptr [n_cols], mean_ptr, rstd_ptr,
    c1_ptr, c2_ptr [n_rows] fp32, dx_ptr [n_rows, n_cols] (row stride stride_dxm, unit
    column stride), dw_partial_ptr, db_partial_ptr [n_programs, n_cols] fp32.
    The grid is (n_programs, n_column_blocks): program (p, q) covers the tiles of BLOCK_M
    rows p, p + n_programs, ... and columns [q * BLOCK_N, (q + 1) * BLOCK_N), and writes the
    partials of row p for those columns; STAGES: the depth of the tile loop's software
    pipeline (rms_norm._rms_norm_fwd_kernel).
    SPLIT_ROW=False: BLOCK_N >= n_cols, one column block; c1 and c2 are reduced from the
    rows in registers and c1_ptr, c2_ptr are not read. SPLIT_ROW=True: rows longer than a
    block; c1, c2 come from _layer_norm_bwd_row_dot_kernel.
    HAS_WEIGHT=False drops w and dw; HAS_BIAS=False drops db.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    cols = offs_n.to(tl.int64)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for tile in tl.range(pid_m, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0),
                         num_stages=STAGES):
        offs_m, mask_m, mask, rows = _row_block(tile * BLOCK_M, n_rows, mask_n, BLOCK_M)
        dy = _load_tile(dy_ptr, rows, cols, stride_dym, stride_dyn, mask)
        x = _load_tile(x_ptr, rows, cols, stride_xm, stride_xn, mask)
        mean = tl.load(mean_ptr + offs_m, mask=mask_m, other=0.0)
        r = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * r[:, None], 0.0)
        if HAS_WEIGHT:
            dxhat = _rounded_product(dy, w[None, :])
            # [BM, BN] -> [BN]
            dw_acc += tl.sum(dy * xhat, axis=0)
        else:
            dxhat = dy
        if HAS_BIAS:
            # [BM, BN] -> [BN]
            db_acc += tl.sum(dy, axis=0)
        if SPLIT_ROW:
            c1 = tl.load(c1_ptr + offs_m, mask=mask_m, other=0.0)
            c2 = tl.load(c2_ptr + offs_m, mask=mask_m, other=0.0)
        else:
            # [BM, BN] -> [BM]
            c1 = tl.sum(dxhat, axis=1) / n_cols
            c2 = tl.sum(dxhat * xhat, axis=1) / n_cols
        dx = (dxhat - c1[:, None] - xhat * c2[:, None]) * r[:, None]
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
    partial = pid_m.to(tl.int64) * n_cols + offs_n
    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + partial, dw_acc, mask=mask_n)
    if HAS_BIAS:
        tl.store(db_partial_ptr + partial, db_acc, mask=mask_n)
