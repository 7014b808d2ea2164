"""What the norms' backwards share (RMSNorm's, LayerNorm's): the grid of their persistent
row kernel, each program of which writes one fp32 partial row of the weight's (and bias's)
gradient, and the last step: those rows summed and cast in one launch
(kernels/row_tile.py's _column_sum_kernel) instead of torch's sum and cast (two launches,
and an fp32 [hidden] temporary)."""

from __future__ import annotations

import torch
import triton

from speedlight.kernels.row_tile import _column_sum_kernel
from speedlight.launch import planned_sm_count, planned_warp_size, target_programs

# Persistent backward from 4096 wide: tiles of 8192 values, 8 per lane (it holds w, dw and
# the dy and x tiles: under 64 registers at 32 warps, where 16 values per lane took ~100
# and a quarter of the SM's warps), 32 resident warps per SM. Narrower rows: tiles of 4096
# values, 16 per lane, 16 warps per SM (so each lane stores whole 16-byte vectors of its
# dw partial row, and the partial rows stay few).
BWD_WIDE = 4096
BWD_TILE = {True: 8192, False: 4096}
BWD_VALUES_PER_LANE = {True: 8, False: 16}
BWD_WARPS_PER_SM = {True: 32, False: 16}


def bwd_programs_per_sm(block_n: int, num_warps: int) -> int:
    """Programs of num_warps warps per SM the backward's grid is sized for."""
    return max(1, BWD_WARPS_PER_SM[block_n >= BWD_WIDE] // num_warps)


def partial_programs(n_tiles: int, per_sm: int, device: torch.device) -> int:
    """Programs of a persistent backward over n_tiles row tiles, each writing one fp32 row
    of partial weight gradients: per_sm per SM on a GPU (or the launch context's target),
    one per tile under the interpreter (where a program sums its tiles one after another,
    so each sums one tile and _column_sum_kernel sums the rest pairwise, as accurately as
    the GPU's tree)."""
    if planned_sm_count(device) is None:
        return max(1, n_tiles)
    return max(1, min(n_tiles, target_programs(device, per_sm=per_sm)))


def norm_bwd_grid(n_rows: int, n_cols: int, device: torch.device, *,
                  wide_tile: int = BWD_TILE[True]) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, programs) of a norm's persistent backward over whole rows:
    on a GPU tiles of BWD_TILE values (whole rows, at least one; `wide_tile` from
    BWD_WIDE wide), BWD_VALUES_PER_LANE a lane, BWD_WARPS_PER_SM resident warps per SM;
    under the interpreter tiles of at most 4 rows, one per program (partial_programs)."""
    block_n = triton.next_power_of_2(max(n_cols, 1))
    if planned_sm_count(device) is None:
        block_m = min(4, triton.next_power_of_2(max(n_rows, 1)))
        return block_m, block_n, 1, partial_programs(triton.cdiv(n_rows, block_m), 1, device)
    lanes = planned_warp_size(device)
    wide = block_n >= BWD_WIDE
    tile = wide_tile if wide else BWD_TILE[False]
    block_m = max(1, min(triton.next_power_of_2(max(n_rows, 1)), tile // block_n))
    num_warps = max(1, min(1024 // lanes,
                           block_m * block_n // (BWD_VALUES_PER_LANE[wide] * lanes)))
    per_sm = bwd_programs_per_sm(block_n, num_warps)
    # a program per SM at least, and otherwise at least 4 rows each (each writes and the
    # column sum reads an fp32 row of dw: few rows, few partials); tiles no taller than a
    # program's share of the rows, and the warps that tile fills (each lane keeps whole
    # 16-byte vectors of dw)
    sms = planned_sm_count(device)
    programs = max(1, min(n_rows, sms * per_sm, max(sms, n_rows // 4)))
    share = triton.cdiv(n_rows, programs)
    block_m = min(block_m, 1 << (share.bit_length() - 1))  # a power of two at most share
    num_warps = max(1, min(num_warps, block_m * block_n // (BWD_VALUES_PER_LANE[wide] * lanes)))
    return block_m, block_n, num_warps, min(programs, triton.cdiv(n_rows, block_m))



# On a GPU: column blocks of 4096 values over the partials (up to 256; narrow blocks, 8 fp32
# at least: one 32-byte sector of each partial row, so the grid has several programs per SM
# when the partials are many), 32 partial values a lane per step. Under the interpreter
# every partial of a column in one step where it fits, partials last, so numpy sums them
# pairwise.
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
        block_n = max(8, min(GPU_MAX_BLOCK_N, GPU_TILE // block_p))
        # warps whose lanes each store whole 16-byte vectors of the result, 32 partial
        # values each per step
        num_warps = max(1, min(4, block_n * torch.tensor([], dtype=dtype).element_size()
                               // (16 * 32)))
        block_p = min(block_p, max(1, 32 * 32 * num_warps // block_n))
    else:
        block_p = min(CPU_MAX_BLOCK_P, triton.next_power_of_2(n_partials))
        block_n, num_warps = min(triton.next_power_of_2(n_cols), max(1, CPU_TILE // block_p)), 1
    _column_sum_kernel[(triton.cdiv(n_cols, block_n),)](
        partial, out, partial_b if partial_b is not None else partial,
        out_b if out_b is not None else out, n_partials, n_cols,
        HAS_B=partial_b is not None, PARTIALS_LAST=not gpu, BLOCK_N=block_n, BLOCK_P=block_p,
        num_warps=num_warps)
    return out, out_b
