"""The launch context, launch sizing and launch counting, public so a team's own launcher
does what speedlight's do.

The launch context: one ContextVar holding the Target launches are sized for (whole) and any
forced or tuned configurations. Whoever sizes launches for a GPU enters it once (`with
for_target(target):` in inspect, and so the report's inspect stage, and tune); launchers
ask `planned_sm_count(device)` for the SM count and `config(configs, key, device)` for
their configuration, nothing else. A registered op saves the context with its forward and
re-enters it in its backward, which autograd may run on a thread of its own.

Sizing: the grids and tiles of kernels over rows, for the GPU `planned_sm_count` names (the
CUDA device in use, or the context's target, so that `speedlight inspect` on a CPU runs the
launches a GPU user gets). Under the Triton interpreter (CPU tensors, no target) every
program costs milliseconds, so the helpers choose few, large programs there.

Counting: `watch_launches()` sees every kernel launch while active: Triton's (compiled or
interpreted) and those of CUDA C++ extension functions wrapped by `extension_kernel`.
verify's empty-input check ("no launch on an empty input") is built on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
import triton

from speedlight import hardware

# --- the launch context: which GPU launches are sized for, and their configurations -------

@dataclass(frozen=True)
class LaunchContext:
    """What launches are sized for: entered once by whoever sizes them for a GPU
    (`for_target`: inspect, the report's inspect stage, tune), read by launchers alone
    (`planned_sm_count`, `launch_sku`, `config`), and kept with each forward for its
    backward. verify and bench enter none: they run the launches of the device they run on.

    target: the speedlight.target.Target whose SM count sizes the launches and whose SKU's
    tuned tables they read, whatever device their tensors are on; None: the device's own
    (a CUDA device's SM count and SKU; on a CPU the interpreter's sizing and no table).
    forced: op name -> (the configuration every launch of the op is given, None for its
    rule; the list each launch's (key, configuration) is appended to): tune's candidates.
    tuned: op name -> {key: configuration}, preferred over the tuned tables.
    """

    target: Any = None
    forced: Mapping[str, tuple[Mapping[str, Any] | None, list]] = field(default_factory=dict)
    tuned: Mapping[str, Mapping[Any, Mapping[str, Any]]] = field(default_factory=dict)


_CONTEXT: contextvars.ContextVar[LaunchContext] = contextvars.ContextVar(
    "speedlight_launch_context", default=LaunchContext())


def current() -> LaunchContext:
    """The launch context in force here (a launcher's; the registration saves it with a
    forward). Never read it in code torch.compile traces: ContextVar.get breaks the graph."""
    return _CONTEXT.get()


@contextlib.contextmanager
def entered(context: LaunchContext) -> Iterator[LaunchContext]:
    """Inside, `context` is in force (the registration re-enters a forward's in its
    backward, which autograd may run on a thread of its own)."""
    if not isinstance(context, LaunchContext):
        raise TypeError(f"context must be a launch.LaunchContext, got {type(context).__name__}")
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


def for_target(target) -> contextlib.AbstractContextManager[LaunchContext]:
    """Inside, launchers size grids and blocks for `target` (a speedlight.target.Target: its
    SM count) and read its SKU's tuned tables, whatever device the tensors are on, so that
    `speedlight inspect` on a CPU runs the launches a user of that GPU gets. None: the
    device's own. Forced and tuned configurations of an enclosing context are kept."""
    if target is not None:
        sms = getattr(target, "sm_count", None)
        if not isinstance(sms, int) or isinstance(sms, bool) or sms < 1:
            raise ValueError(f"target must be a speedlight.target.Target whose sm_count is a "
                             f"positive int, got {target!r} (sm_count {sms!r})")
        if not isinstance(getattr(getattr(target, "sku", None), "key", None), str):
            raise TypeError(f"target must be a speedlight.target.Target (its sku.key names "
                            f"the tuned tables), got {type(target).__name__}")
    return entered(dataclasses.replace(current(), target=target))


@contextlib.contextmanager
def forcing(op: str, config: Mapping[str, Any] | None = None) -> Iterator[list]:
    """Inside, every launch of op `op` that asks `launch.config` is given `config` (None: its
    rule, no tuned entry consulted); yields the list of (key, configuration) those launches
    asked for, in order (`speedlight tune` forces its candidates so)."""
    asked: list = []
    outer = current()
    with entered(dataclasses.replace(outer, forced={**outer.forced, op: (config, asked)})):
        yield asked


def with_tuned(op: str, table: Mapping[Any, Mapping[str, Any]]
               ) -> contextlib.AbstractContextManager[LaunchContext]:
    """Inside, a launch of op `op` whose key is in `table` is given table[key] (before any
    tuned table's entry)."""
    outer = current()
    return entered(dataclasses.replace(outer, tuned={**outer.tuned, op: dict(table)}))


def planned_sm_count(device: torch.device | str) -> int | None:
    """How many SMs a launch on `device` is sized for: the launch context's target's when
    it names one, else the CUDA device's own, else None (the CPU interpreter's own sizing:
    few, large programs)."""
    target = _CONTEXT.get().target
    if target is not None:
        return target.sm_count
    index = _cuda_index(device)
    return None if index is None else sm_count(index)


def planned_arch(device: torch.device | str) -> int | None:
    """The NVIDIA compute capability a launch on `device` is compiled for, as an int (90
    for sm_90a): the launch context's target's, else the CUDA device's own; None for an AMD
    target or ROCm device (whose arch is a gfx name) and for the CPU interpreter, which
    takes the path of the GPU that kernels are sized for by default."""
    target = _CONTEXT.get().target
    if target is not None:
        return target.arch if isinstance(target.arch, int) else None
    index = _cuda_index(device)
    if index is None or getattr(torch.version, "hip", None):
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


def planned_amd_arch(device: torch.device | str | None = None) -> str | None:
    """The LLVM gfx name ("gfx942") an AMD launch on `device` is compiled for: the launch
    context's target's when it is AMD, else a ROCm device's own (its gcnArchName without
    the feature flags); None for an NVIDIA target or device and for the CPU interpreter.
    Launchers give Triton's HIP-only options (waves_per_eu, matrix_instr_nonkdim, kpack)
    only where this names an arch: a CUDA launch refuses them."""
    target = _CONTEXT.get().target
    if target is not None:
        return target.arch if isinstance(target.arch, str) else None
    index = _cuda_index(device) if device is not None else None
    if index is None or not getattr(torch.version, "hip", None):
        return None
    name = getattr(torch.cuda.get_device_properties(index), "gcnArchName", "") or ""
    return name.split(":")[0] or None


def _cuda_index(device: torch.device | str) -> int | None:
    """The index of a CUDA (or ROCm) device, None for any other."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """The SM count of CUDA device `device_index`."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch_sku(device: torch.device | str | None) -> str | None:
    """The SKU (a hardware.DEVICES key) whose tuned tables a launch on `device` reads: the
    launch context's target's, else the CUDA device's own (matched by name), else None
    (under the interpreter launches use their rules)."""
    target = _CONTEXT.get().target
    if target is not None:
        return target.sku.key
    if device is None or torch.device(device).type != "cuda":
        return None
    device = torch.device(device)
    return _cuda_sku(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sku(index: int) -> str | None:
    try:
        return hardware.spec_for_device_name(torch.cuda.get_device_name(index)).key
    except KeyError:
        return None


def config(configs, key, device: torch.device | str | None = None
           ) -> Mapping[str, Any] | None:
    """The configuration a launch asks for: `configs` is its op's configuration space (a
    speedlight.tuning.Configs), `key` what the launcher knows of the launch (its shape,
    dtype...). In order: the configuration the context forces on the op (`forcing`), the
    context's tuned entry for key (`with_tuned`), the tuned tables' entry on the SKU a
    launch on `device` reads (`launch_sku`), else the space's rule (None without one: the
    launcher applies its own)."""
    context = _CONTEXT.get()
    forced = context.forced.get(configs.op)
    if forced is not None:
        chosen = forced[0] if forced[0] is not None else configs.rule(key)
        forced[1].append((key, chosen))
        return chosen
    tuned = context.tuned.get(configs.op, {})
    if key in tuned:
        return tuned[key]
    sku = launch_sku(device)
    found = configs.tuned(sku, key) if sku is not None else None
    return found if found is not None else configs.rule(key)


# --- grids and tiles over rows ------------------------------------------------------------

def target_programs(device: torch.device, per_sm: int = 4) -> int:
    """How many programs a persistent-style grid should have: `per_sm` per SM on a GPU
    (or on the launch context's target), two on the CPU interpreter (every program there
    costs milliseconds)."""
    sms = planned_sm_count(device)
    return per_sm * sms if sms else 2


def partial_sum_programs(n_rows: int, device: torch.device, per_sm: int = 4) -> int:
    """How many programs split the rows of a kernel that also reduces over them (the dW of
    a norm): each sums its own rows into one fp32 partial and the host sums the partials.

    On a GPU (or the context's target) target_programs(per_sm): a few rows to a few
    dozen each, summed as a tree within a block. Under the interpreter at most 4 rows
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

    On a GPU (or the context's target) a tile of ~4K elements per program keeps
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
    return block_m, block_n, warps_for_tile(block_m * block_n, device)


def elementwise_tile(n_rows: int, n_cols: int, device: torch.device, *, max_block_n: int,
                     interpreted_max_block_n: int = 65536) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of an elementwise kernel's [BLOCK_M, BLOCK_N] tile of
    a [n_rows, n_cols] grid of tiles: ~4K elements per program on a GPU (or the launch
    context's target), BLOCK_N up to `max_block_n`; under the interpreter, where each
    program costs milliseconds, tiles of up to 64K elements (BLOCK_N up to
    `interpreted_max_block_n`) and one warp."""
    gpu = planned_sm_count(device) is not None
    max_tile, max_n = (4096, max_block_n) if gpu else (65536, interpreted_max_block_n)
    block_n = min(triton.next_power_of_2(max(n_cols, 1)), max_n)
    block_m = min(triton.next_power_of_2(max(n_rows, 1)), max(1, max_tile // block_n))
    return block_m, block_n, warps_for_tile(block_m * block_n) if gpu else 1


def planned_warp_size(device: torch.device | str | None = None) -> int:
    """Lanes of a warp on the GPU launches are sized for: the launch context's target's
    (64 on an AMD Instinct: a wavefront), else a ROCm device's own (64), else 32."""
    target = _CONTEXT.get().target
    if target is not None:
        return getattr(target, "warp_size", 32)
    if device is not None and torch.device(device).type == "cuda" and \
            getattr(torch.version, "hip", None):
        return 64
    return 32


def warps_for_tile(tile: int, device: torch.device | str | None = None) -> int:
    """num_warps for a tile of `tile` elements: one warp per 16 elements a lane (512 for
    32-lane warps, 1024 for AMD's 64-lane waves: planned_warp_size), so every lane moves
    whole 16-byte vectors of 16-bit data; 1 to 16 warps (1024 lanes at most on AMD)."""
    lanes = planned_warp_size(device)
    return max(1, min(16 if lanes == 32 else 1024 // lanes, tile // (16 * lanes)))


def persistent_row_grid(n_rows: int, n_cols: int, device: torch.device, *, max_block_n: int,
                        tile: int, warps_per_sm: int, values_per_lane: int = 16
                        ) -> tuple[tuple[int], int, int, int]:
    """(grid, BLOCK_M, BLOCK_N, num_warps) of a persistent kernel over whole rows: tiles
    of BLOCK_M rows of ~`tile` elements on a GPU (`values_per_lane` values per lane, up to
    32 warps of 32 lanes, 16 waves of 64 on AMD), and as many programs as fit `warps_per_sm` resident warps per SM,
    each walking tiles p, p + P, ... so what it loads once (a weight) is read P times, not
    once per tile. Under the interpreter, row_tile's large tiles and two programs."""
    gpu = planned_sm_count(device) is not None
    block_m, block_n, num_warps = row_tile(n_cols, device, max_block_n=max_block_n,
                                           max_tile=tile if gpu else None)
    if gpu:
        lanes = planned_warp_size(device)
        num_warps = max(1, min(1024 // lanes, block_m * block_n // (values_per_lane * lanes)))
        if lanes == 64:  # an AMD CU holds 32 waves (4 SIMDs x 8)
            warps_per_sm = min(warps_per_sm, 32)
    per_sm = max(1, warps_per_sm // num_warps)
    grid = (min(triton.cdiv(n_rows, block_m), target_programs(device, per_sm=per_sm)),)
    return grid, block_m, block_n, num_warps


# shared memory a program keeps beside its pipeline buffers (a reduction's scratch, the
# driver's reserve): a buffer layout that leaves less is not chosen
PIPELINE_SMEM_SLACK = 8 * 1024


def pipeline_depth(stage_bytes: int, programs_per_sm: int, device: torch.device | str, *,
                    deepest: int = 4) -> int:
    """The depth (tl.range's num_stages) of a persistent kernel's software-pipelined tile
    loop: on NVIDIA from sm_80 (cp.async), the deepest of `deepest` down to 3 whose
    STAGES - 1 shared-memory buffers of `stage_bytes` each (the tiles one iteration
    loads), for each of the `programs_per_sm` programs its grid puts on an SM, fit the SM's
    shared memory; 1 (a plain loop) where none fits, on AMD and older targets, and under
    the interpreter (which ignores it)."""
    arch = planned_arch(device)
    if arch is None or arch < 80:
        return 1
    limits = hardware.arch_limits(arch)
    for stages in range(deepest, 2, -1):
        per_program = (stages - 1) * stage_bytes + PIPELINE_SMEM_SLACK
        if per_program <= limits.smem_per_block and \
                programs_per_sm * per_program <= limits.smem_per_sm:
            return stages
    return 1


def as_rows(x: torch.Tensor, n_cols: int) -> torch.Tensor:
    """x as [rows, n_cols] over its last dim(s): a view when the strides allow, else a copy
    (the `x2` of a launcher)."""
    return x.reshape(-1, n_cols)


# The C++ type of each dtype in a CUDA C++ kernel's template arguments (its demangled name
# in the SASS, which inspect matches a CudaLaunch's instance against).
CUDA_TYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


# --- counting launches --------------------------------------------------------------------

_WATCHERS: list[Callable[[str], None]] = []


def record_launch(kernel: str) -> None:
    """Tell every active watch_launches that `kernel` was launched (what extension_kernel
    does for each call; a launcher that starts device work another way calls it itself)."""
    for watcher in list(_WATCHERS):
        watcher(kernel)


def extension_kernel(fn: Callable, name: str | None = None) -> Callable:
    """`fn` (a function of a CUDA C++ extension that launches one kernel), recording each
    call as a launch of `name` (default: fn's name)."""
    label = name or getattr(fn, "__name__", repr(fn))

    @functools.wraps(fn)
    def launch(*args, **kwargs):
        record_launch(label)
        return fn(*args, **kwargs)
    return launch


@contextlib.contextmanager
def watch_launches(into: list[str] | None = None) -> Iterator[list[str]]:
    """Inside, the names of the kernels launched are appended, in order, to the yielded
    list (`into`, or a new one): Triton kernels, compiled or interpreted (not warmup
    compiles), and extension kernels."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launched = [] if into is None else into
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def counting(orig):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup", False):
                launched.append(getattr(self, "__name__", str(self)))
            return orig(self, *args, **kwargs)
        return run

    for cls, orig in originals.items():
        cls.run = counting(orig)
    _WATCHERS.append(launched.append)
    try:
        yield launched
    finally:
        _WATCHERS.remove(launched.append)
        for cls, orig in originals.items():
            cls.run = orig
