"""Triton kernels of softmax over the last dim: y = exp(x - max(x)) / sum(exp(x - max(x))).

Three shapes of kernel:
  row tile   whole rows in registers, one pass over memory (n_cols <= BLOCK_N);
  looped     one long row per program: an online pass for (max, sum), then a second
             pass that re-reads the row (from L2) and writes y;
  split      few long rows: each row is cut into n_splits spans, one program per span;
             a stats kernel writes each span's (max, sum), a second kernel combines them
             and writes its span. It keeps every SM busy when rows are too few to.
"""

import triton
import triton.language as tl

_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e))


@triton.jit
def _online_max_sum(x_row, start, end, stride_n, BLOCK_N: tl.constexpr):
    """(max, sum of exp(x - max)) over x_row[start:end], one pass, fp32.

    Each lane keeps its own running (m, d); the lanes are combined at the end. A lane
    that has seen only -inf keeps m = -inf and d = 0 (never inf - inf).
    """
    m = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    d = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(start, end, BLOCK_N):
        offs_n = s + tl.arange(0, BLOCK_N)
        x = tl.load(x_row + offs_n.to(tl.int64) * stride_n, mask=offs_n < end,
                    other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        dead = m_new == float("-inf")
        alpha = tl.where(dead, 1.0, tl.exp2((m - m_new) * _LOG2E))
        p = tl.where(dead, 0.0, tl.exp2((x - m_new) * _LOG2E))
        d = d * alpha + p
        m = m_new
    # [BN] -> scalar
    m_row = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp2((m - m_row) * _LOG2E))
    d_row = tl.sum(d * scale, axis=0)
    return m_row, d_row


@triton.jit
def _softmax_fwd_kernel(
    x_ptr, y_ptr, n_rows, n_cols,
    stride_xm, stride_xn, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y[m] = softmax(x[m]) for rows that fit one block.

    x_ptr, y_ptr [n_rows, n_cols] with their own strides; BLOCK_M rows per program;
    BLOCK_N >= n_cols, so x is read once and y written once.
    """
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < n_rows
    mask = mask_m[:, None] & (offs_n < n_cols)[None, :]
    rows = offs_m.to(tl.int64)
    cols = offs_n.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask,
                other=float("-inf")).to(tl.float32)
    # [BM, BN] -> [BM]; rows beyond n_rows get max 0 and sum 1: no inf - inf, no 0 / 0.
    m = tl.where(mask_m, tl.max(x, axis=1), 0.0)
    e = tl.exp2((x - m[:, None]) * _LOG2E)
    s = tl.where(mask_m, tl.sum(e, axis=1), 1.0)
    y = e / s[:, None]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn,
             y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_looped_kernel(
    x_ptr, y_ptr, n_cols,
    stride_xm, stride_xn, stride_ym, stride_yn,
    BLOCK_N: tl.constexpr,
):
    """softmax of one long row per program (grid (n_rows,)); pointers as above."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    y_row = y_ptr + row * stride_ym
    m, d = _online_max_sum(x_row, 0, n_cols, stride_xn, BLOCK_N)
    for s in range(0, n_cols, BLOCK_N):
        offs_n = s + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_cols
        cols = offs_n.to(tl.int64)
        x = tl.load(x_row + cols * stride_xn, mask=mask_n, other=float("-inf")).to(tl.float32)
        y = tl.exp2((x - m) * _LOG2E) / d
        tl.store(y_row + cols * stride_yn, y.to(y_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _softmax_fwd_split_stats_kernel(
    x_ptr, m_ptr, d_ptr, n_cols, span,
    stride_xm, stride_xn, n_splits,
    BLOCK_N: tl.constexpr,
):
    """(max, sum exp) of span q of row m into m_ptr[m, q], d_ptr[m, q] ([n_rows, n_splits]
    fp32); the grid is (n_rows, n_splits)."""
    row = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    start = q * span
    end = tl.minimum(start + span, n_cols)
    m, d = _online_max_sum(x_ptr + row * stride_xm, start, end, stride_xn, BLOCK_N)
    tl.store(m_ptr + row * n_splits + q, m)
    tl.store(d_ptr + row * n_splits + q, d)


@triton.jit
def _softmax_fwd_split_write_kernel(
    x_ptr, y_ptr, m_ptr, d_ptr, n_cols, span,
    stride_xm, stride_xn, stride_ym, stride_yn, n_splits,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Combine the n_splits (max, sum) pairs of row m and write y over span q."""
    row = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < n_splits
    ms = tl.load(m_ptr + row * n_splits + offs_s, mask=mask_s, other=float("-inf"))
    ds = tl.load(d_ptr + row * n_splits + offs_s, mask=mask_s, other=0.0)
    # [BS] -> scalar
    m = tl.max(ms, axis=0)
    d = tl.sum(tl.where(ms == float("-inf"), 0.0, ds * tl.exp2((ms - m) * _LOG2E)),
               axis=0)
    start = q * span
    end = tl.minimum(start + span, n_cols)
    for s in range(start, end, BLOCK_N):
        offs_n = s + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        cols = offs_n.to(tl.int64)
        x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask_n,
                    other=float("-inf")).to(tl.float32)
        y = tl.exp2((x - m) * _LOG2E) / d
        tl.store(y_ptr + row * stride_ym + cols * stride_yn, y.to(y_ptr.dtype.element_ty),
                 mask=mask_n)


# Backward. With y = softmax(x) and upstream gradient dy:
#   dx_i = sum_j dy_j * dy_j/dx_i = sum_j dy_j * y_j * (delta_ij - y_i) = y_i * (dy_i - c),
#   c = sum_j y_j * dy_j   (one scalar per row).

@triton.jit
def _softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols,
    stride_ym, stride_yn, stride_dym, stride_dyn, stride_dxm, stride_dxn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dx = y * (dy - sum(y * dy)) for rows that fit one block; y_ptr, dy_ptr, dx_ptr
    [n_rows, n_cols] with their own strides."""
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < n_cols)[None, :]
    rows = offs_m.to(tl.int64)
    cols = offs_n.to(tl.int64)
    y = tl.load(y_ptr + rows[:, None] * stride_ym + cols[None, :] * stride_yn, mask=mask,
                other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask,
                 other=0.0).to(tl.float32)
    # [BM, BN] -> [BM]
    c = tl.sum(y * dy, axis=1)
    dx = y * (dy - c[:, None])
    tl.store(dx_ptr + rows[:, None] * stride_dxm + cols[None, :] * stride_dxn,
             dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_dot(a_row, b_row, start, end, stride_a, stride_b, BLOCK_N: tl.constexpr):
    """sum(a[start:end] * b[start:end]) in fp32."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in range(start, end, BLOCK_N):
        offs_n = s + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        cols = offs_n.to(tl.int64)
        a = tl.load(a_row + cols * stride_a, mask=mask_n, other=0.0).to(tl.float32)
        b = tl.load(b_row + cols * stride_b, mask=mask_n, other=0.0).to(tl.float32)
        acc += a * b
    # [BN] -> scalar
    return tl.sum(acc, axis=0)


@triton.jit
def _softmax_bwd_span(y_row, dy_row, dx_row, c, start, end, stride_yn, stride_dyn, stride_dxn,
                      BLOCK_N: tl.constexpr):
    """dx[start:end] = y * (dy - c)."""
    for s in range(start, end, BLOCK_N):
        offs_n = s + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        cols = offs_n.to(tl.int64)
        y = tl.load(y_row + cols * stride_yn, mask=mask_n, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols * stride_dyn, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(dx_row + cols * stride_dxn, (y * (dy - c)).to(dx_row.dtype.element_ty),
                 mask=mask_n)


@triton.jit
def _softmax_bwd_looped_kernel(
    y_ptr, dy_ptr, dx_ptr, n_cols,
    stride_ym, stride_yn, stride_dym, stride_dyn, stride_dxm, stride_dxn,
    BLOCK_N: tl.constexpr,
):
    """The backward of one long row per program (grid (n_rows,)): c, then dx."""
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_ym
    dy_row = dy_ptr + row * stride_dym
    c = _row_dot(y_row, dy_row, 0, n_cols, stride_yn, stride_dyn, BLOCK_N)
    _softmax_bwd_span(y_row, dy_row, dx_ptr + row * stride_dxm, c, 0, n_cols,
                      stride_yn, stride_dyn, stride_dxn, BLOCK_N)


@triton.jit
def _softmax_bwd_split_dot_kernel(
    y_ptr, dy_ptr, c_partial_ptr, n_cols, span,
    stride_ym, stride_yn, stride_dym, stride_dyn, n_splits,
    BLOCK_N: tl.constexpr,
):
    """c_partial[m, q] = sum over span q of y * dy ([n_rows, n_splits] fp32)."""
    row = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    start = q * span
    end = tl.minimum(start + span, n_cols)
    c = _row_dot(y_ptr + row * stride_ym, dy_ptr + row * stride_dym, start, end,
                 stride_yn, stride_dyn, BLOCK_N)
    tl.store(c_partial_ptr + row * n_splits + q, c)


@triton.jit
def _softmax_bwd_split_write_kernel(
    y_ptr, dy_ptr, dx_ptr, c_partial_ptr, n_cols, span,
    stride_ym, stride_yn, stride_dym, stride_dyn, stride_dxm, stride_dxn, n_splits,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Sum the partial dots of row m and write dx over span q."""
    row = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    # [BS] -> scalar
    c = tl.sum(tl.load(c_partial_ptr + row * n_splits + offs_s, mask=offs_s < n_splits,
                       other=0.0), axis=0)
    start = q * span
    end = tl.minimum(start + span, n_cols)
    _softmax_bwd_span(y_ptr + row * stride_ym, dy_ptr + row * stride_dym,
                      dx_ptr + row * stride_dxm, c, start, end,
                      stride_yn, stride_dyn, stride_dxn, BLOCK_N)
