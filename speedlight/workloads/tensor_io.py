"""The tensors of an aten op call and the bytes it must move: every tensor in its
arguments and outputs, each distinct one counted once (a broadcast dimension once), the
arguments it writes in place. The cost formulas (workloads/costs.py) count with these."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

Tensor = torch.Tensor


def tensors(x: Any) -> list[Tensor]:
    """Every tensor in an argument, output or nested list of them, in order."""
    return [t for t in tree_flatten(x)[0] if isinstance(t, Tensor)]


def distinct_elements(t: Tensor) -> int:
    """Elements a kernel must touch: a broadcast (stride-0) dimension counts once."""
    if t.numel() == 0:
        return 0
    return math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0)


def tensor_bytes(t: Tensor) -> int:
    """The bytes a kernel must move for `t`: its distinct elements (see above)."""
    return distinct_elements(t) * t.element_size()


def unique_tensors(ts: list[Tensor]) -> list[Tensor]:
    seen, out = set(), []
    for t in ts:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def bind(func, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    positional = iter(args)
    for a in func._schema.arguments:
        if not a.kwarg_only:
            try:
                bound[a.name] = next(positional)
                continue
            except StopIteration:
                pass
        if a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def written_args(func, bound: dict) -> list[Tensor]:
    """Tensors the schema marks as written in place (`Tensor(a!)`)."""
    out = []
    for a in func._schema.arguments:
        if a.alias_info is not None and a.alias_info.is_write and a.name in bound:
            out += tensors(bound[a.name])
    return out


def io_bytes(func, args, kwargs, out, *, skip_read: tuple[str, ...] = ()) -> tuple[int, int]:
    """(bytes read, bytes written): each distinct tensor input once, each output that is
    not one of the inputs, and each argument written in place."""
    bound = bind(func, args, kwargs)
    inputs = unique_tensors([t for name, v in bound.items() if name not in skip_read for t in tensors(v)])
    input_ids = {id(t) for t in tensors(list(bound.values()))}
    written = unique_tensors([t for t in tensors(out) if id(t) not in input_ids] + written_args(func, bound))
    return sum(tensor_bytes(t) for t in inputs), sum(tensor_bytes(t) for t in written)


def total_io(func, args, kwargs, out, **kw) -> int:
    return sum(io_bytes(func, args, kwargs, out, **kw))


def out_elements(func, args, kwargs, out) -> int:
    """Elements an elementwise op produces: its new outputs, or what it writes in place."""
    bound = bind(func, args, kwargs)
    outs = unique_tensors(tensors(out) + written_args(func, bound))
    if not outs:
        outs = tensors(args)[:1]
    return sum(t.numel() for t in outs)
