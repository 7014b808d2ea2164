"""What an op launches for a case: every Triton launch, its arguments, its specialisation
for a compile target, and (under the interpreter) the bytes it actually moved.

The op's implementation runs on the case's inputs (forward, then backward when the op has
gradients) while Triton's launch entry points are intercepted: `JITFunction.run` (compiled
kernels on a GPU) and `InterpretedFunction.run` (the CPU interpreter). Each launch records
the kernel, its bound arguments (tensors: dtype, shape, strides, data_ptr alignment; ints
and floats: value), constexprs, grid and launch options, and the signature / constexprs /
attributes the runtime's own binder derives for the target backend, so the kernel compiled
later is the one a user's launch would compile.

A dry capture (no launch runs) may run the op on meta tensors (device "meta": shapes and
strides, no data), so any size is captured in a moment whatever the op computes on the
host: `capture_case(..., device="meta")`. See _MetaRun.

Under the interpreter the loads and stores of each launch are counted as they happen
(masked-off lanes excluded), per kernel argument and per source line, together with what
the addresses allow: whether each access is contiguous, how it is aligned, and so how wide
a global access the compiler could have used.
"""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils._python_dispatch

from speedlight.inspect.specialise import Arg, compile_function, describe_arg, specialise
from speedlight.inspect.traffic import count_access, finish_sites
from speedlight.spec import Case, OpSpec, grad_leaves, rand_tensor

# The launch options a capture keeps (and the compile is given): CUDA's, and the HIP-only
# knobs an AMD launch may add (waves_per_eu, matrix_instr_nonkdim, kpack)
_OPTION_NAMES = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                 "launch_cooperative_grid", "launch_pdl", "ptx_options", "debug",
                 "waves_per_eu", "matrix_instr_nonkdim", "kpack")


# --- what a launch looked like ----------------------------------------------------------

@dataclass
class Launch:
    """One launch of one kernel."""

    direction: str  # fwd | bwd
    index: int  # order within the case
    kernel: str
    file: str
    qualname: str
    module: str
    args: list[Arg]
    grid: tuple[int, int, int]
    options: dict  # launch options given (num_warps, num_stages, ...)
    signature: dict  # param name -> type string, 'constexpr' for specialised values
    constexprs: dict  # path (tuple) -> value
    attrs: dict  # path (tuple) -> [[attr, value]]
    num_warps: int = 4
    num_stages: int = 3
    declared: tuple = ()  # the kernel's own tl.constexpr parameters (BLOCK_M, HAS_WEIGHT...)
    sites: dict = field(default_factory=dict)  # (kind, arg, file, line) -> Site
    measured: bool = False  # the interpreter ran it and counted its bytes
    compiled: Any = None  # the runtime's CompiledKernel (GPU runs only)

    @property
    def programs(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def loaded(self) -> int:
        return sum(s.bytes for s in self.sites.values() if s.kind == "load")

    @property
    def stored(self) -> int:
        return sum(s.bytes for s in self.sites.values() if s.kind == "store")

    def key(self, target: str) -> tuple:
        """What the compiled binary depends on: same key, same kernel."""
        return (self.file, self.qualname, target, _freeze(self.signature),
                _freeze(self.constexprs), _freeze(self.attrs), _freeze(self.options))

    def design_key(self) -> tuple:
        """The kernel as its author configured it: function, pointer dtypes, declared
        constexprs and launch options, whatever ints the runtime specialised (a guard
        covers each configuration once)."""
        return (self.file, self.qualname, tuple(a.dtype for a in self.args if a.kind == "tensor"),
                tuple((a.name, _freeze(a.value)) for a in self.args if a.name in self.declared),
                _freeze(self.options))

    def arg(self, name: str) -> Arg | None:
        return next((a for a in self.args if a.name == name), None)


@dataclass
class Capture:
    """Everything a case launched, in order."""

    case: Case
    launches: list[Launch] = field(default_factory=list)
    measured: bool = False
    note: str = ""

    def direction(self, d: str) -> list[Launch]:
        return [launch for launch in self.launches if launch.direction == d]


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted(((k, _freeze(x)) for k, x in v.items()), key=repr))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)


# --- the interceptor ---------------------------------------------------------------------

class _State:
    """Module-level, not thread-local: autograd may run the backward on another thread."""

    def __init__(self):
        self.lock = threading.RLock()
        self.active: "Recorder | None" = None
        self.launch: Launch | None = None


_STATE = _State()


MODES = ("run", "sample", "dry")


class Recorder:
    """Records launches while active.

    run     execute every launch (under the interpreter, counting bytes)
    sample  under the interpreter, execute only a few programs of each launch (the first
            two, the last, the corners of the grid): enough to see how every access is laid
            out, at any case size; bytes are not counted (outputs stay partly unwritten)
    dry     record and skip every launch (outputs stay uninitialised)
    """

    def __init__(self, arch: int, mode: str = "run"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.arch = arch
        self.mode = mode
        self.direction = "fwd"
        self.launches: list[Launch] = []

    def record(self, kernel, args, kwargs, grid) -> Launch:
        jit_fn = compile_function(kernel)
        bound, specialization, signature, constexprs, attrs, options = specialise(
            jit_fn, args, kwargs, self.arch)
        names = list(bound)
        described = [describe_arg(n, bound[n], s) for n, s in zip(names, specialization)]
        if callable(grid):
            grid = grid(bound)
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        given = {k: kwargs[k] for k in _OPTION_NAMES if k in kwargs and kwargs[k] is not None}
        fn = jit_fn.fn
        launch = Launch(
            direction=self.direction, index=len(self.launches), kernel=fn.__name__,
            file=os.path.abspath(pyinspect.getsourcefile(fn)), qualname=fn.__qualname__,
            module=fn.__module__, args=described, grid=grid, options=given,
            signature=dict(signature), constexprs=dict(constexprs), attrs=dict(attrs),
            num_warps=options.num_warps, num_stages=options.num_stages,
            declared=tuple(p.name for p in jit_fn.params if p.is_constexpr))
        self.launches.append(launch)
        return launch


@contextlib.contextmanager
def intercept(recorder: Recorder):
    """Route every Triton launch inside through `recorder`."""
    from triton.runtime.interpreter import InterpretedFunction, InterpreterBuilder
    from triton.runtime.jit import JITFunction

    originals = {
        (JITFunction, "run"): JITFunction.run,
        (InterpretedFunction, "run"): InterpretedFunction.run,
        (InterpreterBuilder, "create_masked_load"): InterpreterBuilder.create_masked_load,
        (InterpreterBuilder, "create_masked_store"): InterpreterBuilder.create_masked_store,
    }

    def make_run(orig, interpreted):
        def run(self, *args, grid, warmup, **kwargs):
            if warmup or _STATE.active is None:
                return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            rec = _STATE.active
            launch = rec.record(self, args, kwargs, grid)
            if rec.mode == "dry":
                return None
            if not interpreted:
                launch.compiled = orig(self, *args, grid=grid, warmup=warmup, **kwargs)
                return launch.compiled
            previous, _STATE.launch = _STATE.launch, launch
            try:
                if rec.mode == "sample":
                    out = _run_sampled(self, launch, args, kwargs)
                else:
                    out = orig(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                _STATE.launch = previous
            launch.measured = rec.mode == "run"
            return out
        return run

    # the cache and eviction arguments after these differ between Triton versions (3.6:
    # cache_modifier, eviction_policy; 3.9: one cache_policy, at times by keyword): passed
    # on as they come
    def masked_load(self, ptrs, mask, *rest, **named):
        if _STATE.launch is not None:
            count_access(_STATE.launch, "load", ptrs, mask)
        return originals[(InterpreterBuilder, "create_masked_load")](self, ptrs, mask, *rest,
                                                                      **named)

    def masked_store(self, ptrs, value, mask, *rest, **named):
        if _STATE.launch is not None:
            count_access(_STATE.launch, "store", ptrs, mask)
        return originals[(InterpreterBuilder, "create_masked_store")](self, ptrs, value, mask,
                                                                       *rest, **named)

    with _STATE.lock:
        if _STATE.active is not None:
            raise RuntimeError("a launch capture is already active")
        _STATE.active = recorder
    JITFunction.run = make_run(originals[(JITFunction, "run")], interpreted=False)
    InterpretedFunction.run = make_run(originals[(InterpretedFunction, "run")], interpreted=True)
    InterpreterBuilder.create_masked_load = masked_load
    InterpreterBuilder.create_masked_store = masked_store
    try:
        yield recorder
    finally:
        for (cls, name), orig in originals.items():
            setattr(cls, name, orig)
        _STATE.active = None
        _STATE.launch = None


def sample_programs(grid: tuple[int, int, int]) -> set[tuple[int, int, int]]:
    """The programs a sampled launch runs: first, second and last along x, first and last
    along y and z."""
    xs = {0, min(1, grid[0] - 1), grid[0] - 1}
    ys, zs = {0, grid[1] - 1}, {0, grid[2] - 1}
    return {(x, y, z) for x in xs for y in ys for z in zs}


class _Sampled:
    """The kernel body, run only for the chosen programs; it carries the kernel's globals,
    signature and annotations, which the interpreter's grid executor reads."""

    def __init__(self, fn, chosen):
        self.fn, self.chosen = fn, chosen
        self.__globals__ = fn.__globals__
        self.__signature__ = pyinspect.signature(fn)
        self.__annotations__ = dict(fn.__annotations__)
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        from triton.runtime.interpreter import interpreter_builder

        if tuple(interpreter_builder.grid_idx) in self.chosen:
            return self.fn(*args, **kwargs)
        return None


def _run_sampled(kernel, launch: Launch, args, kwargs):
    """Run a few programs of an interpreted launch through the interpreter's own executor."""
    from triton.runtime.interpreter import GridExecutor

    body = _Sampled(kernel.rewrite(), sample_programs(launch.grid))
    return GridExecutor(body, kernel.arg_names, launch.grid, kernel.pre_run_hooks)(*args, **kwargs)


def interpreter_work(capture: Capture) -> int:
    """Program-iterations a full interpreter run of a sampled capture would execute: per
    launch, its programs times the most calls any one access made per sampled program."""
    work = 0
    for launch in capture.launches:
        sampled = len(sample_programs(launch.grid))
        per_program = max((s.calls for s in launch.sites.values()), default=1) / sampled
        work += int(launch.programs * max(per_program, 1.0))
    return work


# --- meta tensors: a launch's arguments without data ----------------------------------------

META = torch.device("meta")

# Factories that draw random values from a CPU generator: on meta they become empty tensors
# of the same shape and dtype (the values would never be read).
_RANDOM = ("randn", "rand", "randint", "randperm", "normal", "uniform_", "normal_",
           "random_", "bernoulli")
# Host reads of a value: a meta tensor has none, so they read as 0 (False).
_VALUE_READS = ("is_nonzero", "_local_scalar_dense", "equal")


def _dtype_of(func, kwargs) -> torch.dtype:
    if kwargs.get("dtype") is not None:
        return kwargs["dtype"]
    return torch.int64 if func.__name__.startswith(("randint", "randperm")) else \
        torch.get_default_dtype()


class _MetaRun(torch.utils._python_dispatch.TorchDispatchMode):
    """Run an op on meta tensors and reach its launchers.

    A registered custom op called with meta tensors would run its fake (shapes only, no
    launch): here speedlight's own custom ops are sent to their CPU implementation instead,
    the launchers, whose Triton launches the recorder captures (dry: none runs). Every
    other op runs on meta (no computation, whatever its size); factories the inputs are made
    with are put on meta, random ones as empty tensors; a value read on the host reads as
    0 (a meta tensor has no data: a launcher that branches on its inputs' values takes
    the branch of zeros)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = func.__name__.split(".")[0]
        if func.namespace == "speedlight":
            with self:
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU),
                                       *args, **kwargs)
        if name in _VALUE_READS:
            return False if name in ("is_nonzero", "equal") else 0
        if name in _RANDOM and not any(isinstance(a, torch.Tensor) and a.device == META
                                       for a in args):
            size = next((a for a in args if isinstance(a, (list, tuple, torch.Size))),
                        kwargs.get("size", ()))
            return torch.empty(tuple(size), dtype=_dtype_of(func, kwargs), device=META)
        if name in _RANDOM:  # in place on a meta tensor: nothing to draw
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = META
        try:
            return func(*args, **kwargs)
        except NotImplementedError:
            # no meta kernel: an op whose output's size depends on its input's values (a
            # routing's torch.bincount). Run on the host on zeros of its inputs' shapes, as
            # a host read of a value reads 0; the result stays on the host (it is read there).
            host = torch.utils._pytree.tree_map(
                lambda a: torch.zeros(a.shape, dtype=a.dtype)
                if isinstance(a, torch.Tensor) and a.device == META else a, (args, kwargs))
            return func(*host[0], **host[1])


@contextlib.contextmanager
def _on_meta():
    from speedlight.runtime import recording_only

    with _MetaRun(), recording_only():
        yield


def meta_input_bytes(spec: OpSpec, case: Case) -> int:
    """What the case's inputs occupy, from their shapes alone (made on meta tensors)."""
    with _on_meta():
        inputs = spec.make_inputs(case, META)
    return sum(t.numel() * t.element_size() for t in inputs.values()
               if isinstance(t, torch.Tensor))


# --- running a case ------------------------------------------------------------------------

def capture_case(spec: OpSpec, case: Case, device: torch.device | str, *, arch: int,
                 mode: str = "run", backward: bool = True) -> Capture:
    """Run the op's forward (and, with backward, its backward when it has gradients) on the
    case's inputs and record every launch. Under the interpreter with mode='run', bytes are
    counted. The forward is the one a training step runs (the inputs that take gradients
    require them) with or without the backward: an op whose forward does part of the
    backward's work (cross_entropy writes dlogits) is seen doing it, as its cost counts.
    On device "meta" (mode 'dry'), inputs and everything the op computes are meta tensors
    (_MetaRun): any size costs a moment."""
    import warnings

    device = torch.device(device)
    if device.type == "meta" and mode != "dry":
        raise ValueError(f"a capture on meta tensors runs no launch: mode must be 'dry', "
                         f"got {mode!r}")
    meta = _on_meta if device.type == "meta" else contextlib.nullcontext
    recorder = Recorder(arch, mode)
    with meta():
        inputs = spec.make_inputs(case, device)
    leaves, names = grad_leaves(inputs, spec.grad_inputs)
    with intercept(recorder), meta(), _quiet(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recorder.direction = "fwd"
        with torch.set_grad_enabled(bool(names)):
            out = spec.impl(**leaves)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor) and o.requires_grad]
        if backward and names and outs:
            recorder.direction = "bwd"
            upstream = [torch.empty_like(o) if mode == "dry" else
                        rand_tensor(tuple(o.shape), case.with_(layout="contiguous"), device,
                                    dtype=o.dtype, salt=101 + i) for i, o in enumerate(outs)]
            torch.autograd.grad(outs, [leaves[n] for n in names], upstream, allow_unused=True)
    for launch in recorder.launches:
        finish_sites(launch)
    measured = bool(recorder.launches) and all(x.measured for x in recorder.launches)
    return Capture(case, recorder.launches, measured)


@contextlib.contextmanager
def _quiet(device: torch.device):
    if device.type != "cpu":
        yield
        return
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        yield
