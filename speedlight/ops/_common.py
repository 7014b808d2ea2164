"""What every op's host code shares: input checks that name the argument, the runtime
check (CUDA, or CPU through the Triton interpreter), block-size choices, and the case
suite every norm over [rows, hidden] runs."""

from __future__ import annotations

import functools
from typing import Callable, Iterable, Sequence

import torch
import triton

from speedlight import shapes
from speedlight.spec import Case, planned_sm_count

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_LIST = "float32, float16 or bfloat16"


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(name: str, t, *, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES,
                 min_dim: int = 0, expected: str | None = None) -> None:
    """TypeError unless t is a tensor of one of `dtypes` with at least `min_dim` dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        want = expected or (_DTYPE_LIST if dtypes == FLOAT_DTYPES else
                            " or ".join(str(d).replace("torch.", "") for d in dtypes))
        raise TypeError(f"{name} must be a {want} tensor, got {describe(t)}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s), got {describe(t)}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    if not items:
        return
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}: "
                             f"all tensors must be on one device")


def check_same_dtype(**tensors: torch.Tensor | None) -> None:
    items = [(k, v) for k, v in tensors.items() if v is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}: "
                            f"they must match")


def is_interpreted(kernel) -> bool:
    """True when `kernel` was built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


def check_runtime(t: torch.Tensor, kernel) -> None:
    """CUDA tensors run compiled kernels; CPU tensors need the Triton interpreter."""
    if t.device.type == "cuda":
        if is_interpreted(kernel):
            raise RuntimeError(
                "speedlight's kernels were imported under TRITON_INTERPRET=1, which runs them "
                "on CPU tensors only; unset TRITON_INTERPRET to run on the GPU")
        return
    if t.device.type == "cpu":
        _round_bf16_like_the_gpu()
        if not is_interpreted(kernel):
            raise RuntimeError(
                f"got a CPU tensor ({describe(t)}) but the Triton interpreter is off: speedlight "
                "runs its kernels on CPU tensors only under the interpreter. Set "
                "TRITON_INTERPRET=1 in the environment before importing speedlight (or triton), "
                "e.g. `TRITON_INTERPRET=1 python ...`, or move the tensors to a CUDA device")
        return
    raise RuntimeError(f"speedlight runs on CUDA devices (or on CPU through the Triton "
                       f"interpreter); got a tensor on {t.device}")


_BF16_CAST_FIXED = False


def _round_bf16_like_the_gpu() -> None:
    """Make the Triton 3.6 interpreter round fp32 -> bf16 to nearest even, as the GPU does.

    The interpreter truncates that cast (round toward zero), which doubles the rounding
    error of every bf16 output on CPU and would make a correct kernel look worse than
    PyTorch; compiled kernels round to nearest even. Applied once, on the first CPU launch.
    """
    global _BF16_CAST_FIXED
    if _BF16_CAST_FIXED:
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            a = np.ascontiguousarray(src.data, dtype=np.float32)
            u = a.view(np.uint32)
            rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
            nan = np.isnan(a)
            if nan.any():
                rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # quiet NaN stays NaN
            return TensorHandle(rounded, tl.bfloat16)
        return original(self, src, dst_type)

    InterpreterBuilder.cast_impl = cast_impl
    _BF16_CAST_FIXED = True


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def target_programs(device: torch.device, per_sm: int = 4) -> int:
    """How many programs a persistent-style grid should have: `per_sm` per SM on a GPU
    (or on the GPU `spec.sized_for` names), two on the CPU interpreter (every program
    there costs milliseconds)."""
    sms = planned_sm_count(device)
    return per_sm * sms if sms else 2


def partial_sum_programs(n_rows: int, device: torch.device, per_sm: int = 4) -> int:
    """How many programs split the rows of a kernel that also reduces over them (the dW of
    a norm): each sums its own rows into one fp32 partial and the host sums the partials.

    On a GPU (or the one `spec.sized_for` names) target_programs(per_sm): a few rows to a
    few dozen each, summed as a tree within a block. Under the interpreter at most 4 rows
    each: it sums a block's rows one after another (numpy down axis 0), so the row sum is
    left to the host's torch.sum instead, which is as accurate as the GPU's reduction and
    keeps dW's fp32 error near it.
    """
    if planned_sm_count(device) is not None:
        return max(1, min(n_rows, target_programs(device, per_sm=per_sm)))
    return max(1, min(n_rows, max(target_programs(device), triton.cdiv(n_rows, 4))))


def row_tile(n_cols: int, device: torch.device, *, max_block_n: int,
             max_tile: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a kernel that holds BLOCK_M whole rows.

    On a GPU (or the GPU `spec.sized_for` names) a tile of ~4K elements per program keeps
    registers low while several rows share a program when rows are short; under the
    interpreter, tiles are larger because each program costs milliseconds whatever its size.
    """
    block_n = triton.next_power_of_2(max(n_cols, 1))
    if block_n > max_block_n:
        raise ValueError(f"row of {n_cols} does not fit one block of {max_block_n}")
    gpu = planned_sm_count(device) is not None
    if max_tile is None:
        max_tile = 4096 if gpu else 65536
    block_m = max(1, min(64 if gpu else 1024, max_tile // block_n))
    return block_m, block_n, warps_for_tile(block_m * block_n)


def warps_for_tile(tile: int) -> int:
    """num_warps for a tile of `tile` elements: one warp per 512 (16 per thread, so every
    thread moves whole 16-byte vectors of 16-bit data), 1 to 16 warps."""
    return max(1, min(16, tile // 512))


def persistent_row_grid(n_rows: int, n_cols: int, device: torch.device, *, max_block_n: int,
                        tile: int, warps_per_sm: int) -> tuple[tuple[int], int, int, int]:
    """(grid, BLOCK_M, BLOCK_N, num_warps) of a persistent kernel over whole rows: tiles
    of BLOCK_M rows of ~`tile` elements on a GPU (16 values per thread, up to 32 warps for
    a 16384-wide row), and as many programs as fit `warps_per_sm` resident warps per SM,
    each walking tiles p, p + P, ... so what it loads once (a weight) is read P times, not
    once per tile. Under the interpreter, row_tile's large tiles and two programs."""
    gpu = planned_sm_count(device) is not None
    block_m, block_n, num_warps = row_tile(n_cols, device, max_block_n=max_block_n,
                                           max_tile=tile if gpu else None)
    if gpu:
        num_warps = max(1, min(32, block_m * block_n // 512))
    per_sm = max(1, warps_per_sm // num_warps)
    grid = (min(triton.cdiv(n_rows, block_m), target_programs(device, per_sm=per_sm)),)
    return grid, block_m, block_n, num_warps


def rows_view(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """x as [rows, n_cols] over its last dim(s): a view when the strides allow, else a copy."""
    return x.reshape(-1, n_cols)


def skip_huge_on_cpu(case, device) -> str | None:
    """The OpSpec skip of an op whose only CPU-impossible cases are flagged `huge`."""
    if case.flag("huge") and torch.device(device).type != "cuda":
        return ("64-bit indexing case: rows x stride > 2^31 needs > 4 GiB per tensor and "
                "hours under the interpreter; it runs on a GPU")
    return None


def norm_cases(op: str, suite: str, *, quick_variants: Sequence[tuple[int, int, dict]] = (),
               full_variants: Sequence[dict] = (),
               model_flags: Callable[[shapes.ModelConfig], dict] = lambda m: {}) -> list[Case]:
    """The cases of a norm over [rows, hidden] (rms_norm, add_rms_norm, layer_norm).

    model: every model's hidden size at shapes.MODEL_TOKENS, with the flags
    model_flags(model) gives it (Gemma's offset), once per distinct (hidden, flags).
    quick and full: rows_and_width's shapes, strided and transposed layouts, NaN/Inf,
    empty input and rows longer than one block, plus the op's own variants:
    quick_variants as (rows, hidden, flags), full_variants as flags on 257 x 4093; full also
    has the 64-bit indexing case (rows x row stride > 2^31, skipped on CPU).
    """
    def case(rows, hidden, layout="contiguous", model=None, **flags):
        return Case(op, (("rows", rows), ("hidden", hidden)), layout=layout, flags=flags,
                    model=model)

    points = shapes.rows_width_variant(suite, "hidden", lambda m: tuple(model_flags(m).items()))
    out = [case(r, w, model=m, **dict(v or ())) for r, w, m, v in points]
    if suite == "quick":
        out += [case(37, 128, "strided"), case(5, 781, "strided"), case(4, 1000, "transposed")]
        out += [case(r, w, **flags) for r, w, flags in quick_variants]
        out += [case(5, 781, nonfinite=True), case(0, 128), case(2, 70001, "strided")]
    if suite == "full":
        out += [case(r, w, "strided") for r, w, m, _ in points if m is None and r * w <= 2**24]
        out += [case(257, 4093, **flags) for flags in full_variants]
        out += [case(3, 100003, "transposed"), case(257, 1021, nonfinite=True), case(0, 4096),
                case(65537, 32771, huge=True)]
    return out
