"""Where speedlight's kernels run: on CUDA tensors, compiled; or on CPU tensors through the
Triton interpreter (TRITON_INTERPRET=1 before the first kernel module is imported).

`use_interpreter()` is the one place the interpreter runtime is chosen and made to compute
as the GPU does; `select_device` (the CLI at startup, a Ray worker) calls it for
`--device cpu`, and `check_runtime` on the first launch on CPU tensors (a script or test
that set TRITON_INTERPRET itself).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import warnings

import torch

_INTERPRETER_READY = False
# Set while a launch capture records launches on meta tensors (shapes, no data) and runs
# none: inspect's dry capture, which needs a launch's arguments, not its run.
_RECORDING_ONLY = contextvars.ContextVar("speedlight_recording_only", default=False)


@contextlib.contextmanager
def recording_only():
    """Inside, launchers accept meta tensors: every launch is recorded by a capture and
    none runs (inspect's dry capture of a case at any size)."""
    token = _RECORDING_ONLY.set(True)
    try:
        yield
    finally:
        _RECORDING_ONLY.reset(token)


def on_gpu(device: torch.device | str) -> bool:
    """Whether speedlight's kernels run compiled on a GPU here (a CUDA or ROCm device),
    rather than under the Triton interpreter on a CPU: the question behind every default a
    tool sets by where it runs (model_defaults, budgets, whether a time represents a GPU's)."""
    return torch.device(device).type == "cuda"


def model_defaults(device: torch.device | str) -> tuple[torch.dtype, str]:
    """(dtype, size) of a model run by default: bf16 and the model's real size on a GPU;
    fp32 and the scaled-down model under the interpreter, where the real size takes hours
    and bf16 matmuls are emulated."""
    return (torch.bfloat16, "full") if on_gpu(device) else (torch.float32, "small")


def only_recorded(t: torch.Tensor) -> bool:
    """Whether a launch on t is only recorded, not run: a meta tensor inside
    recording_only (a capture of a case at any size)."""
    return t.device.type == "meta" and _RECORDING_ONLY.get()


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


# device types torch.autocast knows (asking about another, e.g. meta, raises)
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia", "ipu", "maia")


def autocast_dtype(t) -> torch.dtype | None:
    """The dtype torch.autocast computes in on `t`'s device now (a tensor or a device); None
    outside autocast, for a device autocast does not know, or for anything not a tensor
    (left to the op's argument checks to name)."""
    device = t.device if isinstance(t, torch.Tensor) else t
    if not isinstance(device, torch.device) or device.type not in _AUTOCAST_DEVICES:
        return None
    if not torch.is_autocast_enabled(device.type):
        return None
    return torch.get_autocast_dtype(device.type)


def is_interpreted(kernel) -> bool:
    """True when `kernel` was built by the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


def use_interpreter() -> None:
    """Choose the CPU runtime: switch the Triton interpreter on (it must be on before the
    first kernel module is imported), quiet numpy's warnings on masked-off lanes, and make
    the interpreter round fp32 -> bf16 to nearest even as compiled kernels do.
    Idempotent."""
    global _INTERPRETER_READY
    if _INTERPRETER_READY:
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            module="triton.runtime.interpreter")
    warnings.filterwarnings("ignore", category=DeprecationWarning,
                            module="triton.runtime.interpreter")
    _round_bf16_like_the_gpu()
    _masks_as_bool()
    _builtins_listed_once()
    _numpy_dtypes_once()
    _INTERPRETER_READY = True


def select_device(requested: str = "auto") -> str:
    """'cuda' or 'cpu'. On the CPU the Triton interpreter is switched on, which must happen
    before the first kernel module is imported."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested != "cpu" and not requested.startswith("cuda"):
        raise SystemExit(f"speedlight: --device takes auto, cuda, cuda:N or cpu; got {requested!r}")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("speedlight: --device cuda asked for, but torch sees no CUDA device")
    if requested == "cpu":
        if os.environ.get("TRITON_INTERPRET") in ("0", ""):
            raise SystemExit("speedlight: --device cpu needs the Triton interpreter, but "
                             "TRITON_INTERPRET is set to 0")
        use_interpreter()
    return requested


def check_runtime(t: torch.Tensor, kernel) -> None:
    """CUDA tensors run compiled kernels; CPU tensors need the Triton interpreter (whose
    numerics use_interpreter sets on the first CPU launch); meta tensors only inside
    recording_only (a capture records the launch, nothing runs)."""
    if only_recorded(t):
        return
    if t.device.type == "cuda":
        if is_interpreted(kernel):
            raise RuntimeError(
                "speedlight's kernels were imported under TRITON_INTERPRET=1, which runs them "
                "on CPU tensors only; unset TRITON_INTERPRET to run on the GPU")
        return
    if t.device.type == "cpu":
        if not is_interpreted(kernel):
            raise RuntimeError(
                f"got a CPU tensor ({describe(t)}) but the Triton interpreter is off: speedlight "
                "runs its kernels on CPU tensors only under the interpreter. Set "
                "TRITON_INTERPRET=1 in the environment before importing speedlight (or triton), "
                "e.g. `TRITON_INTERPRET=1 python ...`, or move the tensors to a CUDA device")
        if not _language_interpreted():
            raise RuntimeError(
                f"got a CPU tensor ({describe(t)}) and speedlight's kernels run under the "
                "Triton interpreter, but triton itself was imported before TRITON_INTERPRET=1 "
                "was set (transformers, torch.compile or another library imports it), so "
                "triton.language's own functions are compiled ones the interpreter cannot "
                "call. Set TRITON_INTERPRET=1 before anything imports triton: in the "
                "environment (`TRITON_INTERPRET=1 python ...`, `%env TRITON_INTERPRET=1` as a "
                "notebook's first cell), or at the top of the script before other imports")
        use_interpreter()
        return
    raise RuntimeError(f"speedlight runs on CUDA devices (or on CPU through the Triton "
                       f"interpreter); got a tensor on {t.device}")


def _language_interpreted() -> bool:
    """Whether triton.language's own jitted functions (tl.cdiv, tl.sigmoid...) are the
    interpreter's: they are made when triton is first imported, so with TRITON_INTERPRET
    set after that, speedlight's kernels are interpreted but cannot call them."""
    import triton.language as tl
    return is_interpreted(tl.cdiv)


def _round_bf16_like_the_gpu() -> None:
    """Make the Triton 3.6 interpreter round fp32 -> bf16 to nearest even, as the GPU does.

    The interpreter truncates that cast (round toward zero), which doubles the rounding
    error of every bf16 output on CPU and would make a correct kernel look worse than
    PyTorch; compiled kernels round to nearest even.
    """
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


def _builtins_listed_once() -> None:
    """Make the interpreter find triton.language's builtins once, not at every launch.

    Before each launch, and each call of a @triton.jit helper inside one, the interpreter
    points every builtin of triton.language (and of its tensor and math parts) at its own
    semantics, finding them with inspect.getmembers: over a fifth of the CPU a small
    kernel's launch takes. The names of the builtins are fixed, so they are listed once per
    package; each launch still patches exactly the members that are builtins at that moment
    (inside a launch they are already patched, and are left alone, as before). Chosen by
    feature: only where the interpreter patches through _patch_builtin(pkg, builder, scope)."""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_builtin", None)
    if patch is None or getattr(patch, "_listed_once", False) or \
            list(inspect.signature(patch).parameters) != ["pkg", "builder", "scope"] or \
            not hasattr(interpreter, "_patch_attr"):
        return
    names: dict = {}

    def patch_builtin(pkg, builder, scope):
        if pkg not in names:
            names[pkg] = [n for n, member in inspect.getmembers(pkg)
                          if tl.core.is_builtin(member)]
        if names[pkg] and not tl.core.is_builtin(getattr(pkg, names[pkg][0])):
            return  # a helper called inside a launch: the launch patched them all
        for name in names[pkg]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    patch_builtin._listed_once = True
    interpreter._patch_builtin = patch_builtin


def _numpy_dtypes_once() -> None:
    """Make the interpreter's Triton-to-numpy dtype map (_get_np_dtype, which builds its
    table of 18 numpy dtypes at every call: a twentieth of a patched model's step) answer
    each dtype from a cache after its first call; the answers are the function's own.
    Chosen by feature: only where the interpreter has it."""
    import functools

    from triton.runtime import interpreter

    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or hasattr(original, "cache_info"):
        return
    cached = functools.lru_cache(maxsize=None)(original)

    def np_dtype(tt_dtype):
        try:
            return cached(tt_dtype)
        except TypeError:  # an unhashable type: asked of the function itself
            return original(tt_dtype)

    np_dtype.cache_info = cached.cache_info
    interpreter._get_np_dtype = np_dtype


def _masks_as_bool() -> None:
    """Make the interpreter's compiled loads and stores (Triton 3.9's; 3.6's are numpy's)
    take a mask splatted from a scalar condition, e.g. `tl.store(..., mask=pid == 0)`.

    The interpreter keeps a comparison's result typed as its operands (int32 for a
    program id), so such a mask arrives as int32: numpy reads it as a condition, the
    compiled load and store refuse it ('mask has unsupported dtype'), where a GPU kernel
    takes it. Chosen by feature: wrapped only where the interpreter has them."""
    import numpy as np
    from triton.runtime import interpreter

    native = getattr(interpreter, "_interpreter", None)
    if native is None or not hasattr(native, "load") or getattr(native.load, "_bool_mask", False):
        return
    load, store, rmw = native.load, native.store, native.atomic_rmw

    def as_bool(mask):
        return mask if getattr(mask, "dtype", None) == np.bool_ else np.asarray(mask, dtype=bool)

    def masked_load(ptrs, mask, other, dtype):
        return load(ptrs, as_bool(mask), other, dtype)

    def masked_store(ptrs, value, mask):
        return store(ptrs, value, as_bool(mask))

    def masked_rmw(op, ptrs, value, mask, sem):
        return rmw(op, ptrs, value, as_bool(mask), sem)

    masked_load._bool_mask = True
    native.load, native.store, native.atomic_rmw = masked_load, masked_store, masked_rmw
