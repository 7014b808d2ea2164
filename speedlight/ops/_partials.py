"""The last step of a norm's backward: the fp32 partial rows of its weight's (and bias's)
gradient, one per program of the row kernel, summed and cast in one launch
(kernels/row_tile.py's _column_sum_kernel) instead of torch's sum and cast (two launches,
and an fp32 [hidden] temporary)."""

from __future__ import annotations

import torch
import triton

from speedlight.kernels.row_tile import _column_sum_kernel
from speedlight.launch import planned_sm_count

# On a GPU: tiles of 4096 values over up to 256 partials (a persistent backward has one or
# two per SM: one step), 4 warps; narrow column blocks (8 fp32: one 32-byte sector of each
# partial row), so the grid has several programs per SM. Under the interpreter every
# partial of a column in one step where it fits, partials last, so numpy sums them pairwise.
GPU_TILE, GPU_MAX_BLOCK_P, GPU_MAX_BLOCK_N = 4096, 256, 1024
CPU_TILE, CPU_MAX_BLOCK_P = 65536, 4096


def sum_partials(partial: torch.Tensor, dtype: torch.dtype,
                 partial_b: torch.Tensor | None = None, dtype_b: torch.dtype | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(partial.sum(0) in `dtype`, partial_b.sum(0) in `dtype_b` or None): partial,
    partial_b [n_partials, n_cols] fp32 contiguous, summed in fp32 and rounded once."""
    n_partials, n_cols = partial.shape
    out = torch.empty(n_cols, dtype=dtype, device=partial.device)
    out_b = (torch.empty(n_cols, dtype=dtype_b, device=partial.device)
             if partial_b is not None else None)
    if n_cols == 0:
        return out, out_b
    gpu = planned_sm_count(partial.device) is not None
    if gpu:
        block_p = min(GPU_MAX_BLOCK_P, triton.next_power_of_2(n_partials))
        block_n, num_warps = max(8, min(GPU_MAX_BLOCK_N, GPU_TILE // block_p)), 4
    else:
        block_p = min(CPU_MAX_BLOCK_P, triton.next_power_of_2(n_partials))
        block_n, num_warps = min(triton.next_power_of_2(n_cols), max(1, CPU_TILE // block_p)), 1
    _column_sum_kernel[(triton.cdiv(n_cols, block_n),)](
        partial, out, partial_b if partial_b is not None else partial,
        out_b if out_b is not None else out, n_partials, n_cols,
        HAS_B=partial_b is not None, PARTIALS_LAST=not gpu, BLOCK_N=block_n, BLOCK_P=block_p,
        num_warps=num_warps)
    return out, out_b
