"""Specialise a launch for a compile target exactly as Triton's runtime does.

JITFunction.run binds a launch's arguments with a binder generated from the kernel's
signature (create_function_from_signature over native_specialize_impl) and packs them
into the signature, constexprs and attributes the compiler sees: 16-byte divisibility of
pointers and integers (tt.divisibility = 16), integers equal to 1 made constexprs,
do_not_specialize honoured. The same binder is built here for the target's backend (CUDA, or
HIP for an AMD gfx target),
so the kernel compiled for inspection is the one a user's launch compiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from speedlight.spec import dtype_name


@dataclass
class Arg:
    """One bound kernel argument as the runtime sees it."""

    name: str
    kind: str  # tensor | int | float | bool | none | constexpr | other
    value: Any = None  # ints, floats, bools, constexprs
    dtype: str | None = None
    shape: tuple = ()
    strides: tuple = ()
    align: int = 0  # largest power of two <= 16 dividing data_ptr (bytes)
    spec: str = ""  # "D" (divisible by 16), "1" (equal to 1, made constexpr), "" (none)
    lo: int = 0  # address range [lo, hi) the tensor covers
    hi: int = 0

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind}
        if self.kind == "tensor":
            out.update(dtype=self.dtype, shape=list(self.shape), strides=list(self.strides),
                       align=self.align, specialisation=self.spec)
        else:
            out.update(value=_plain(self.value), specialisation=self.spec)
        return out


def _plain(v):
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return repr(v)


_BINDERS: dict = {}


def compile_function(kernel):
    """The JITFunction behind `kernel` (the interpreter's InterpretedFunction wraps the same
    Python function; a JITFunction built on it specialises and compiles as the runtime
    would). Autotuner / heuristics wrappers are unwrapped."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    while not isinstance(kernel, (JITFunction, InterpretedFunction)) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    if isinstance(kernel, JITFunction):
        return kernel
    if isinstance(kernel, InterpretedFunction):
        cached = _BINDERS.get(("jit", id(kernel.fn)))
        if cached is None:
            cached = _BINDERS[("jit", id(kernel.fn))] = (JITFunction(kernel.fn, **kernel.kwargs),
                                                         kernel.fn)
        return cached[0]
    raise TypeError(f"not a Triton kernel: {kernel!r}")


def gpu_target(arch: int | str):
    """Triton's GPUTarget of an arch: ("cuda", 90, 32) for sm_90a, ("hip", "gfx942", 64)
    for an AMD gfx target."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("hip", arch, 64) if isinstance(arch, str) else GPUTarget("cuda", arch, 32)


def _binder(jit_fn, arch: int | str):
    """The runtime's argument binder for `jit_fn`, built for the backend of `arch` (CUDA,
    or HIP for a gfx target)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    key = ("binder", id(jit_fn), arch)  # by identity: hashing a JITFunction walks its source
    if key not in _BINDERS:
        backend = make_backend(gpu_target(arch))
        _BINDERS[key] = (backend, create_function_from_signature(jit_fn.signature, jit_fn.params,
                                                                 backend), jit_fn)
    return _BINDERS[key][:2]


def specialise(jit_fn, args: tuple, kwargs: dict, arch: int | str):
    """(signature, constexprs, attrs, options) exactly as JITFunction.run derives them:
    pointers and ints divisible by 16 get tt.divisibility=16, ints equal to 1 become
    constexprs, and do_not_specialize is honoured."""
    from triton import knobs

    backend, binder = _binder(jit_fn, arch)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", jit_fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound,
                                                              specialization, options)
    return bound, specialization, signature, constexprs, attrs, options


def _alignment(ptr: int) -> int:
    for a in (16, 8, 4, 2):
        if ptr % a == 0:
            return a
    return 1


def describe_arg(name: str, value, spec_entry):
    """The bound argument as an Arg: tensors with dtype, shape, strides, alignment and address
    range; ints with their value and whether the runtime specialised them."""
    kind_, attr = spec_entry
    spec = "D" if isinstance(attr, str) and "D" in attr else ""
    if kind_ == "constexpr":
        if isinstance(value, int) and not isinstance(value, bool) and value == 1:
            spec = "1"
        return Arg(name, "constexpr", value=value, spec=spec)
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        t = value
        ptr = t.data_ptr()
        extent = (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) if t.numel() else 0
        return Arg(name, "tensor", dtype=dtype_name(t.dtype), shape=tuple(t.shape),
                   strides=tuple(t.stride()), align=_alignment(ptr), spec=spec, lo=ptr,
                   hi=ptr + extent * t.element_size())
    if value is None:
        return Arg(name, "none")
    if isinstance(value, bool):
        return Arg(name, "bool", value=value)
    if isinstance(value, int):
        return Arg(name, "int", value=value, spec=spec)
    if isinstance(value, float):
        return Arg(name, "float", value=value)
    return Arg(name, "other", value=repr(value))
