"""What the row kernels of the norms share (rms_norm.py, layer_norm.py): loading a
[BLOCK_M, BLOCK_N] tile of rows, or a chunk of one long row, for fp32 arithmetic; and the
sum of their per-program partial rows of a weight's gradient."""

import triton
import triton.language as tl


@triton.jit
def _load_tile(ptr, rows, cols, stride_m, stride_n, mask):
    """The tile ptr[rows, cols] as fp32, masked positions 0.

    rows [BM] and cols [BN] int64 indices (64-bit offsets for tensors past 2^31
    elements), stride_m, stride_n the tensor's strides, mask [BM, BN].
    """
    return tl.load(ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _row_block(start, end, mask_n, BLOCK_M: tl.constexpr):
    """(offs_m, mask_m, mask, rows) of the block of rows start + [0, BLOCK_M) below end:
    indices [BM], in range [BM], the tile's mask [BM, BN] against mask_n [BN], and the
    row indices as int64 for the tile's offsets."""
    offs_m = start + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    return offs_m, mask_m, mask_m[:, None] & mask_n[None, :], offs_m.to(tl.int64)


@triton.jit
def _row_chunk(start, n_cols, BLOCK_N: tl.constexpr):
    """(offs_n, mask_n, cols) of one chunk of a long row: indices start + [0, BLOCK_N)
    [BN], which are below n_cols, and the indices as int64 for the row's offsets."""
    offs_n = start + tl.arange(0, BLOCK_N)
    return offs_n, offs_n < n_cols, offs_n.to(tl.int64)


@triton.jit
def _load_chunk(ptr, row, cols, stride_m, stride_n, mask):
    """ptr[row, cols] as fp32, masked positions 0: row an int64 scalar, cols int64 [BN]."""
    return tl.load(ptr + row * stride_m + cols * stride_n, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _column_sum_kernel(
    a_ptr, a_out_ptr, b_ptr, b_out_ptr, n_partials, n_cols,
    HAS_B: tl.constexpr, PARTIALS_LAST: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """a_out[j] = sum_i a[i, j], cast to a_out's dtype (and b's the same with HAS_B): the
    gradient of a norm's weight (and bias) from the fp32 partial rows its row kernel wrote.

    a_ptr, b_ptr [n_partials, n_cols] fp32 contiguous; a_out_ptr, b_out_ptr [n_cols]. The
    grid is (cdiv(n_cols, BLOCK_N),): program q sums columns [q * BLOCK_N, (q + 1) *
    BLOCK_N) over the partials, BLOCK_P at a time, in tiles [BP, BN] (16-byte loads along
    the rows; a tree over the partials on a GPU) or, with PARTIALS_LAST, [BN, BP]: the
    interpreter's form, where numpy sums a last axis pairwise and a first one row after
    row. HAS_B=False removes b.
    """
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    acc_a = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p0 in range(0, n_partials, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        mask_p = offs_p < n_partials
        if PARTIALS_LAST:
            mask = mask_n[:, None] & mask_p[None, :]
            at = offs_p.to(tl.int64)[None, :] * n_cols + offs_n[:, None]
            # [BN, BP] -> [BN]
            acc_a += tl.sum(tl.load(a_ptr + at, mask=mask, other=0.0), axis=1)
            if HAS_B:
                acc_b += tl.sum(tl.load(b_ptr + at, mask=mask, other=0.0), axis=1)
        else:
            mask = mask_p[:, None] & mask_n[None, :]
            at = offs_p.to(tl.int64)[:, None] * n_cols + offs_n[None, :]
            # [BP, BN] -> [BN]
            acc_a += tl.sum(tl.load(a_ptr + at, mask=mask, other=0.0), axis=0)
            if HAS_B:
                acc_b += tl.sum(tl.load(b_ptr + at, mask=mask, other=0.0), axis=0)
    tl.store(a_out_ptr + offs_n, acc_a.to(a_out_ptr.dtype.element_ty), mask=mask_n)
    if HAS_B:
        tl.store(b_out_ptr + offs_n, acc_b.to(b_out_ptr.dtype.element_ty), mask=mask_n)
