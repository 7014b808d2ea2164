"""Triton kernels of RMSNorm: y = x / sqrt(mean(x^2) + eps) * (offset + w).

Two shapes of kernel: a row tile that holds whole rows in registers (n_cols <= BLOCK_N,
one pass over memory), and looped kernels for rows longer than one block.

The same kernels serve the fused residual add of pre-norm blocks (ops/add_rms_norm.py):
HAS_RESIDUAL makes the forward normalize h = x + residual and write h too, and HAS_DH
makes the backward add the gradient dh already flowing into h from the residual stream.
Compiled away when off, so plain RMSNorm pays nothing for them.

The sum of squares is taken in one reduction; a row whose sum overflows or underflows is
summed again over x / p, p a power of two near its largest |x| (norm_scale.py), so y is
right wherever it is representable, bit for bit the scaled formula's.
"""

import triton
import triton.language as tl

from speedlight.kernels.norm_scale import _pow2_scale, _rms_rstd
from speedlight.kernels.row_tile import _load_chunk, _load_tile, _row_block, _row_chunk


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr,
    n_rows, n_cols, stride_xm, stride_xn, stride_rm, stride_rn, stride_ym,
    eps, offset,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, STORE_RSTD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """y[m] = x[m] * rstd[m] * (offset + w), rstd[m] = 1 / sqrt(mean(x[m]^2) + eps).

    x_ptr [n_rows, n_cols] (strides stride_xm, stride_xn), w_ptr [n_cols],
    y_ptr [n_rows, n_cols] (row stride stride_ym, unit column stride), rstd_ptr [n_rows] fp32.
    BLOCK_N >= n_cols: whole rows sit in registers, so x is read once. Persistent: program p
    takes the tiles of BLOCK_M rows p, p + P, p + 2P, ... (P programs in the grid) and loads
    w once for all of them. STAGES: the depth of the tile loop's software pipeline (on
    NVIDIA, cp.async copies into STAGES - 1 shared-memory buffers: STAGES - 2 tiles stay
    in flight while one is reduced); 1 is a plain loop.
    HAS_RESIDUAL: res_ptr [n_rows, n_cols] (strides stride_rm, stride_rn) is added to x,
    the sum rounded to h_ptr's dtype is stored in h_ptr (laid out as y_ptr) and normalized;
    False removes both pointers. HAS_WEIGHT=False removes the weight load;
    STORE_RSTD=False the store of rstd (inference: no backward will read it).
    """
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    cols = offs_n.to(tl.int64)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32) + offset
    for tile in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), n_programs, num_stages=STAGES):
        offs_m, mask_m, mask, rows = _row_block(tile * BLOCK_M, n_rows, mask_n, BLOCK_M)
        x = _load_tile(x_ptr, rows, cols, stride_xm, stride_xn, mask)
        if HAS_RESIDUAL:
            res = _load_tile(res_ptr, rows, cols, stride_rm, stride_rn, mask)
            # normalize the h that is stored, rounded as the residual stream holds it
            h = (x + res).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + rows[:, None] * stride_ym + cols[None, :], h, mask=mask)
            x = h.to(tl.float32)
        # [BM, BN] -> [BM]: one reduction, but for a tile with an extreme row
        rstd = _rms_rstd(x, mask_m, n_cols, eps)
        y = x * rstd[:, None]
        if HAS_WEIGHT:
            y = y * w[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
        if STORE_RSTD:
            tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _rms_norm_fwd_looped_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr,
    n_cols, stride_xm, stride_xn, stride_rm, stride_rn, stride_ym,
    eps, offset,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, STORE_RSTD: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The same formula for rows longer than BLOCK_N: one row per program, a first loop
    accumulates sum((x / p)^2) in fp32 lanes, rescaling them (exactly, by powers of two)
    whenever a block raises the running max and with it p, as online softmax does; a
    second loop re-reads the row (from L2) and writes y.
    With HAS_RESIDUAL the first loop writes h and the second re-reads h (one read of x and
    residual each; a barrier makes the program's own stores of h visible to all its lanes).

    Pointers as in _rms_norm_fwd_kernel; the grid is (n_rows,).
    """
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_ym
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    max_abs = tl.full([], 0.0, tl.float32)
    p, inv_p = _pow2_scale(max_abs, eps)  # acc holds sum((x / p)^2)
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        if HAS_RESIDUAL:
            res = _load_chunk(res_ptr, row, cols, stride_rm, stride_rn, mask_n)
            h = (x + res).to(h_ptr.dtype.element_ty)
            tl.store(h_ptr + row * stride_ym + cols, h, mask=mask_n)
            x = h.to(tl.float32)
        # [BN] -> scalar: a larger max moves acc to the new scale (a power of two, exact)
        max_abs = tl.maximum(max_abs, tl.max(tl.abs(x), axis=0))
        p_new, inv_p_new = _pow2_scale(max_abs, eps)
        ratio = p * inv_p_new  # <= 1; may underflow to 0, dropping what is negligible
        xs = x * inv_p_new
        acc = acc * (ratio * ratio) + xs * xs
        p, inv_p = p_new, inv_p_new
    # [BN] -> scalar
    rstd = inv_p / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps * inv_p * inv_p)
    if HAS_RESIDUAL:
        tl.debug_barrier()
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        if HAS_RESIDUAL:
            x = _load_chunk(h_ptr, row, cols, stride_ym, 1, mask_n)
        else:
            x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        y = x * rstd
        if HAS_WEIGHT:
            w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            y = y * (w + offset)
        tl.store(y_row + offs_n, y.to(y_ptr.dtype.element_ty), mask=mask_n)
    if STORE_RSTD:
        tl.store(rstd_ptr + row, rstd)


# Backward. With r = rstd, xhat = x * r, w' = offset + w and y = xhat * w':
#   dxhat = dy * w'
#   dx    = r * (dxhat - xhat * c),   c = mean_j(dxhat_j * xhat_j)   (one scalar per row)
#   dw    = sum_rows(dy * xhat)
# With HAS_DH, x is the residual stream h = x_in + residual and dh (the gradient reaching
# h from later blocks) is added: dx_in = dresidual = dx + dh.
# dw is reduced without atomics: each program sums the rows it takes into one row of
# dw_partial [n_programs, n_cols] (fp32); row_tile._column_sum_kernel sums those rows and
# casts them to w's dtype in one launch after.

@triton.jit
def _rms_norm_bwd_tile(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, c_ptr, dh_ptr, dx_ptr, dw_partial_ptr,
    n_rows, n_cols,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dhm, stride_dhn, stride_dxm,
    offset, pid_m, n_programs_m, offs_n,
    SPLIT_ROW: tl.constexpr, HAS_DH: tl.constexpr, HAS_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """dx and dw_partial[pid_m, offs_n] for the row tiles of program pid_m (tiles pid_m,
    pid_m + n_programs_m, ...), columns offs_n [BN].

    The body both backward kernels share (pointers as in _rms_norm_bwd_kernel).
    SPLIT_ROW=False: offs_n covers the whole row and c = mean(dxhat * xhat) is reduced in
    registers; c_ptr is not read. SPLIT_ROW=True: c comes from c_ptr [n_rows] fp32
    (_rms_norm_bwd_row_dot_kernel). STAGES as in _rms_norm_fwd_kernel.
    """
    mask_n = offs_n < n_cols
    cols = offs_n.to(tl.int64)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for tile in tl.range(pid_m, tl.cdiv(n_rows, BLOCK_M), n_programs_m, num_stages=STAGES):
        offs_m, mask_m, mask, rows = _row_block(tile * BLOCK_M, n_rows, mask_n, BLOCK_M)
        dy = _load_tile(dy_ptr, rows, cols, stride_dym, stride_dyn, mask)
        x = _load_tile(x_ptr, rows, cols, stride_xm, stride_xn, mask)
        r = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
        xhat = x * r[:, None]
        if HAS_WEIGHT:
            dxhat = dy * w[None, :]
            # [BM, BN] -> [BN]
            dw_acc += tl.sum(dy * xhat, axis=0)
        else:
            dxhat = dy
        if SPLIT_ROW:
            c = tl.load(c_ptr + offs_m, mask=mask_m, other=0.0)
        else:
            # [BM, BN] -> [BM]
            c = tl.sum(dxhat * xhat, axis=1) / n_cols
        dx = (dxhat - xhat * c[:, None]) * r[:, None]
        if HAS_DH:
            dx += _load_tile(dh_ptr, rows, cols, stride_dhm, stride_dhn, mask)
        tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
    if HAS_WEIGHT:
        tl.store(dw_partial_ptr + pid_m.to(tl.int64) * n_cols + offs_n, dw_acc, mask=mask_n)


@triton.jit
def _rms_norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, dh_ptr, dx_ptr, dw_partial_ptr,
    n_rows, n_cols,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dhm, stride_dhn, stride_dxm,
    offset,
    HAS_DH: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """dx and this program's share of dw for whole rows held in registers.

    dy_ptr, x_ptr [n_rows, n_cols] (own strides), w_ptr [n_cols], rstd_ptr [n_rows] fp32,
    dx_ptr [n_rows, n_cols] (row stride stride_dxm, unit column stride),
    dw_partial_ptr [n_programs, n_cols] fp32. Persistent: program p takes the tiles of
    BLOCK_M rows p, p + P, ... (P programs), pipelined STAGES deep (_rms_norm_fwd_kernel).
    HAS_DH: dh_ptr [n_rows, n_cols] (strides stride_dhm, stride_dhn) is added to dx;
    False removes it. HAS_WEIGHT=False drops w and dw.
    """
    _rms_norm_bwd_tile(
        dy_ptr, x_ptr, w_ptr, rstd_ptr, rstd_ptr, dh_ptr, dx_ptr, dw_partial_ptr,
        n_rows, n_cols,
        stride_dym, stride_dyn, stride_xm, stride_xn, stride_dhm, stride_dhn, stride_dxm,
        offset, tl.program_id(0), tl.num_programs(0), tl.arange(0, BLOCK_N),
        False, HAS_DH, HAS_WEIGHT, BLOCK_M, BLOCK_N, STAGES,
    )


@triton.jit
def _rms_norm_bwd_row_dot_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, c_ptr,
    n_cols, stride_dym, stride_dyn, stride_xm, stride_xn,
    offset,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """c[m] = mean_j(dy[m, j] * w'[j] * x[m, j] * rstd[m]) for rows longer than BLOCK_N.

    dy_ptr, x_ptr [n_rows, n_cols], w_ptr [n_cols], rstd_ptr, c_ptr [n_rows] fp32;
    the grid is (n_rows,).
    """
    row = tl.program_id(0).to(tl.int64)
    r = tl.load(rstd_ptr + row)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs_n, mask_n, cols = _row_chunk(start, n_cols, BLOCK_N)
        dy = _load_chunk(dy_ptr, row, cols, stride_dym, stride_dyn, mask_n)
        x = _load_chunk(x_ptr, row, cols, stride_xm, stride_xn, mask_n)
        if HAS_WEIGHT:
            dy = dy * (tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32) + offset)
        acc += dy * (x * r)  # xhat first: dy * x alone overflows for |x| ~ 1e30
    # [BN] -> scalar
    tl.store(c_ptr + row, tl.sum(acc, axis=0) / n_cols)


@triton.jit
def _rms_norm_bwd_dx_kernel(
    dy_ptr, x_ptr, w_ptr, rstd_ptr, c_ptr, dh_ptr, dx_ptr, dw_partial_ptr,
    n_rows, n_cols,
    stride_dym, stride_dyn, stride_xm, stride_xn, stride_dhm, stride_dhn, stride_dxm,
    offset,
    HAS_DH: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dx and partial dw for rows longer than one block, once c is known.

    The grid is (n_programs, cdiv(n_cols, BLOCK_N)): program (p, q) covers the row tiles
    p, p + n_programs, ... and columns [q * BLOCK_N, (q + 1) * BLOCK_N), and writes
    dw_partial[p, those columns]. Pointers and HAS_DH as in _rms_norm_bwd_kernel, plus
    c_ptr [n_rows] fp32.
    """
    _rms_norm_bwd_tile(
        dy_ptr, x_ptr, w_ptr, rstd_ptr, c_ptr, dh_ptr, dx_ptr, dw_partial_ptr,
        n_rows, n_cols,
        stride_dym, stride_dyn, stride_xm, stride_xn, stride_dhm, stride_dhn, stride_dxm,
        offset, tl.program_id(0), tl.num_programs(0),
        tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N),
        True, HAS_DH, HAS_WEIGHT, BLOCK_M, BLOCK_N, 1,
    )
