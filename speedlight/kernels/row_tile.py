"""What the row kernels of the norms share (rms_norm.py, layer_norm.py): loading a
[BLOCK_M, BLOCK_N] tile of rows, or a chunk of one long row, for fp32 arithmetic."""

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
