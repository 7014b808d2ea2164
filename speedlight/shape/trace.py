"""Trace a researcher's function on fake tensors: every aten op it runs, with its shapes,
dtypes, strides, FLOPs and bytes (profile's formulas, speedlight.workloads.costs), forward
and, for training, backward. Nothing is computed and no memory is allocated.
"""

from __future__ import annotations

import logging
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speedlight.workloads import costs
from speedlight.registry import import_file
from speedlight.spec import dtype_name, parse_dtype

_SHAPE_ITEM = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*\[([^\]]*)\]\s*(?::\s*([\w.]+))?\s*")


@dataclass(frozen=True)
class InputSpec:
    """One input of the function: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": dtype_name(self.dtype)}


def parse_shapes(text: str) -> list[InputSpec]:
    """'x=[8,4096,4096]:bf16,w=[4096]:bf16' -> InputSpecs (dtype fp32 when not given)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"--shapes must be like 'x=[8,4096]:bf16,w=[4096]:bf16', got {text!r}")
    specs, pos = [], 0
    while pos < len(text):
        m = _SHAPE_ITEM.match(text, pos)
        if m is None:
            raise ValueError(f"--shapes: cannot read {text[pos:]!r}; expected name=[d0,d1,...]:dtype "
                             f"items separated by commas, e.g. 'x=[8,4096]:bf16,w=[4096]:bf16'")
        name, dims, dtype = m.group(1), m.group(2), m.group(3)
        try:
            shape = tuple(int(d) for d in dims.split(",") if d.strip())
        except ValueError:
            raise ValueError(f"--shapes: {name}=[{dims}] has a dimension that is not an integer") from None
        if any(d < 0 for d in shape):
            raise ValueError(f"--shapes: {name}=[{dims}] has a negative dimension")
        if math.prod(shape) >= 2 ** 63:
            raise ValueError(f"--shapes: {name}=[{dims}] has {math.prod(shape)} elements, "
                             f"beyond what a tensor can hold (2^63 - 1, int64)")
        specs.append(InputSpec(name, shape, _dtype(dtype or "fp32", name)))
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ValueError(f"--shapes: expected ',' after {name}, got {text[pos:]!r}")
            pos += 1
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--shapes names an input twice: {names}")
    return specs


def _dtype(name: str, arg: str) -> torch.dtype:
    extra = {"fp8": torch.float8_e4m3fn, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
             "int64": torch.int64, "int32": torch.int32, "long": torch.int64, "int": torch.int32,
             "bool": torch.bool}
    if name.lower() in extra:
        return extra[name.lower()]
    try:
        return parse_dtype(name)
    except ValueError as e:
        raise ValueError(f"--shapes: input {arg!r}: {e}") from None


def load_function(target: str) -> tuple[Callable, Path, str]:
    """'path/to/op.py:fn' -> (the function, the file, its name)."""
    if ":" not in target:
        raise ValueError(f"expected path/to/op.py:function, got {target!r}")
    path_text, fn_name = target.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"{path_text!r} does not exist (expected path/to/op.py:function)")
    module = load_module(path)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise ValueError(f"{path_text} defines no function {fn_name!r}; it defines: "
                         f"{', '.join(found) or 'none'}")
    return fn, path.resolve(), fn_name


def load_module(path: Path):
    name = f"speedlight_shape_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    try:
        return import_file(path, name)
    except Exception as e:
        raise ValueError(f"{str(path)!r} failed to load: {type(e).__name__}: "
                         f"{e.msg if isinstance(e, SyntaxError) else e}") from None


@dataclass
class TracedOp:
    """One aten op the function runs, as profile's formulas cost it."""

    index: int
    phase: str  # forward / backward
    op: str  # aten name, e.g. aten.mul.Tensor
    inputs: list[dict]  # shape, dtype, stride of each tensor argument
    outputs: list[dict]
    flops: int
    bytes: int
    family: str  # the formula's family: pointwise, reduction, matmul, view, ...
    detail: str
    kernel: bool  # eager launches a kernel for it (views and allocations do not)
    tensor_core: bool
    dtype: str  # the dtype its FLOPs run in
    counted: bool = True  # a formula covers it
    dims: Any = None  # the reduced / gathered dims, when the op has them
    out_ids: list[int] = field(default_factory=list)
    in_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"index": self.index, "phase": self.phase, "op": self.op, "inputs": self.inputs,
                "outputs": self.outputs, "flops": self.flops, "bytes": self.bytes,
                "family": self.family, "detail": self.detail, "kernel": self.kernel,
                "tensor_core": self.tensor_core, "dtype": self.dtype, "counted": self.counted}


def _meta(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "dtype": dtype_name(t.dtype), "stride": list(t.stride()),
            "bytes": costs.tensor_bytes(t)}


class _Recorder(TorchDispatchMode):
    """Records each aten op under a FakeTensorMode (entered before it, so it runs inside)."""

    def __init__(self):
        super().__init__()
        self.ops: list[TracedOp] = []
        self.phase = "forward"
        self.keep: list[torch.Tensor] = []  # holds outputs so their ids stay unique

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "prim":
            return out
        ins, outs = costs.tensors((args, kwargs)), costs.tensors(out)
        self.keep += outs
        c = costs.estimate(func, args, kwargs, out)
        if c is None:  # no formula: its tensors read and written once, FLOPs unknown (not zero)
            r, w = costs.io_bytes(func, args, kwargs, out)
            c = costs.OpCost(0, r + w, "uncounted", f"no FLOP formula; read {r} B + write {w} B")
        first = next((t for t in ins + outs if t.is_floating_point()), None)
        bound = costs.bind(func, args, kwargs)
        self.ops.append(TracedOp(
            index=len(self.ops), phase=self.phase, op=str(func),
            inputs=[_meta(t) for t in ins], outputs=[_meta(t) for t in outs],
            flops=c.flops, bytes=c.bytes, family=c.formula, detail=c.detail,
            kernel=c.kernel, tensor_core=c.tensor_core,
            dtype=dtype_name(first.dtype) if first is not None else "fp32",
            counted=c.formula != "uncounted",
            dims=bound.get("dim", bound.get("dims")),
            out_ids=[id(t) for t in outs], in_ids=[id(t) for t in ins]))
        return out


@dataclass
class Trace:
    """What the function ran at these shapes."""

    inputs: list[InputSpec]
    ops: list[TracedOp]
    outputs: list[dict]  # forward outputs: shape, dtype, stride, bytes
    grads: list[dict]  # backward: the gradients written (one per input that takes one)
    input_bytes: dict[str, int]  # bytes of each input
    used_inputs: list[str]  # inputs the forward reads
    train: bool
    out_ids: set = field(default_factory=set)
    in_ids: dict = field(default_factory=dict)  # id -> input name


def fake_inputs(inputs: Sequence[InputSpec], train: bool) -> list[torch.Tensor]:
    ts = []
    for s in inputs:
        t = torch.empty(s.shape, dtype=s.dtype)
        if train and t.is_floating_point() and t.dtype.itemsize >= 2:
            t.requires_grad_(True)
        ts.append(t)
    return ts


def trace(fn: Callable, inputs: Sequence[InputSpec], *, train: bool = False) -> Trace:
    """Run `fn` on fake tensors of these shapes, forward (and backward when `train`),
    recording every aten op."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = _Recorder()
    with FakeTensorMode(allow_non_fake_inputs=False):
        ts = fake_inputs(inputs, train)
        in_ids = {id(t): s.name for t, s in zip(ts, inputs)}
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)  # its traceback of a failing meta kernel: we say it
        try:
            with rec:
                out = fn(*ts)
        except Exception as e:
            given = ", ".join(f"{s.name}={list(s.shape)}:{dtype_name(s.dtype)}" for s in inputs)
            raise ValueError(f"{getattr(fn, '__name__', fn)}({given}) failed on fake tensors: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        finally:
            fake_log.setLevel(level)
        outs = costs.tensors(out)
        if not outs:
            raise ValueError(f"{getattr(fn, '__name__', fn)!r} returned no tensor")
        grads = []
        if train:
            wanted = [(t, s) for t, s in zip(ts, inputs) if t.requires_grad]
            diff = [o for o in outs if o.requires_grad]
            if not diff:
                raise ValueError("--train: no output of the function depends on a floating input")
            rec.phase = "backward"
            with rec:
                gs = torch.autograd.grad(diff, [t for t, _ in wanted],
                                         [torch.empty_like(o) for o in diff], allow_unused=True)
            grads = [dict(_meta(g), name=f"d{s.name}") for g, (_, s) in zip(gs, wanted) if g is not None]
            # the upstream gradients are inputs of the backward, made outside the recorder
        used = sorted({in_ids[i] for op in rec.ops if op.phase == "forward" for i in op.in_ids
                       if i in in_ids}, key=[s.name for s in inputs].index)
        return Trace(inputs=list(inputs), ops=rec.ops, outputs=[_meta(o) for o in outs],
                     grads=grads, input_bytes={s.name: costs.tensor_bytes(t) for t, s in zip(ts, inputs)},
                     used_inputs=used, train=train, out_ids={id(o) for o in outs}, in_ids=in_ids)
