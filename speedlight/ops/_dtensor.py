"""DTensor inputs (tensor parallelism) for the ops that work row by row over the last dim.

An op over the last dim of [..., hidden] (a norm, softmax, a gated unit, RoPE,
cross-entropy) computes each row from that row alone, so a DTensor sharded along a
leading dim (batch, sequence or heads: Shard(d) with d before the dims the op reduces
over) is computed by running the op on each rank's local tensor and wrapping the result
with the same mesh and placements. `local_rows` is the one decorator every such public
function goes through:

    @local_rows("x")                        # the inputs split into rows
    def rms_norm(x, weight=None, eps=1e-6, offset=0.0, *, in_place=False): ...

Rules, checked before anything runs (ValueError naming the argument and its placement):
- the `rows` inputs (x, the residual, gate and up, q and k, logits and target) are all
  DTensors on one mesh with one placement, or all plain tensors;
- none of them is sharded along a dim the op reduces over (the last dim, `over` says
  otherwise), since no rank would hold a whole row;
- every other tensor input (weight, bias, cos, sin, class weights, an lm_head) is whole on
  each rank: a plain tensor or a Replicate DTensor on the rows' mesh;
- no input is Partial (a pending sum: its local values are not the tensor's).
Outputs with the rows' leading dims get the rows' placement (and global shape, so uneven
shards stay right); a 0-dim output, a sum over the rows (cross_entropy's reduction="sum"),
is Partial("sum") on the mesh dims the rows are sharded over. The op's own checks then
run on the local tensors (a cos whose batch does not match the local q's raises there).
Gradients flow through DTensor's differentiable to_local / from_local.

Plain tensors take one branch more per call; under torch.compile the decorator steps aside
(DTensor under compile is torch's own sharding propagation, not this).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Sequence

import torch


def local_rows(*rows: str, over: Callable[[dict], Sequence[int]] | None = None,
               refuse: Callable[[dict], str | None] | None = None):
    """Decorator: the public op computes DTensor inputs locally (see the module docstring).

    rows: the parameters split into rows, the first defining the rows' placement and the
    dims reduced over. over(arguments) -> those dims of the first (default: its last).
    refuse(arguments) -> a reason the call cannot be computed on local shards, or None
    (e.g. a mean whose divisor needs every rank's count)."""

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if torch.compiler.is_compiling() or not _any_subclass(args, kwargs):
                return fn(*args, **kwargs)
            dtensor = _dtensor_type()
            if dtensor is None or not any(isinstance(a, dtensor) for a in
                                          (*args, *kwargs.values())):
                return fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            plan = _plan(fn.__name__, dict(bound.arguments), rows, over, refuse, dtensor)
            for name, value in bound.arguments.items():
                if isinstance(value, dtensor):
                    bound.arguments[name] = value.to_local(
                        grad_placements=None if name in rows else _summed(plan))
            return _wrap(fn(*bound.args, **bound.kwargs), plan, dtensor)

        return wrapper

    return decorate


def local_reduction_refused(arguments: dict) -> str | None:
    """Why a loss over DTensor rows cannot be reduced on local shards: a mean divides by
    every rank's count of counted tokens; a token accuracy is such a mean too."""
    reduction = arguments.get("reduction")
    if reduction == "mean":
        return ("reduction='mean' divides by the number of counted tokens on every rank, "
                "which no rank holds; use reduction='sum' (a Partial sum) and divide by the "
                "all-reduced count, or reduction='none'")
    if reduction == "sum" and arguments.get("return_token_accuracy"):
        return ("the token accuracy of reduction='sum' is a mean over every rank's tokens; "
                "ask for it with reduction='none'")
    return None


def _any_subclass(args, kwargs) -> bool:
    """Whether any argument is a tensor of a subclass (the only place a DTensor can be):
    cheap enough for every call on plain tensors."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor \
                and type(a) is not torch.nn.Parameter:
            return True
    return False


def _dtensor_type():
    if not torch.distributed.is_available():
        return None
    from torch.distributed.tensor import DTensor
    return DTensor


def _summed(plan) -> tuple | None:
    """The placements of the gradient of a whole (Replicate) input used by sharded rows:
    each rank's part of it, summed over the mesh dims the rows are sharded over."""
    if plan is None:
        return None
    from torch.distributed.tensor import Partial, Replicate, Shard
    return tuple(Partial("sum") if isinstance(p, Shard) else Replicate() for p in plan[1])


def _describe(t) -> str:
    return (f"a DTensor of shape {tuple(t.shape)} with placements {tuple(t.placements)} "
            f"on mesh {tuple(t.device_mesh.shape)}")


def _plan(op: str, arguments: dict, rows: Sequence[str], over, refuse,
          dtensor) -> tuple | None:
    """(mesh, placements, global shape of the first rows input) of the outputs, or None
    when the rows are plain tensors (outputs stay plain); raises for what cannot run
    locally."""
    from torch.distributed.tensor import Replicate, Shard
    row_values = [(n, arguments[n]) for n in rows if isinstance(arguments.get(n), torch.Tensor)]
    first_name, first = row_values[0]
    for name, value in arguments.items():
        if isinstance(value, dtensor) and any(p.is_partial() for p in value.placements):
            raise ValueError(f"{op}: {name} is {_describe(value)}: a Partial placement holds "
                             f"pending sums, not values; redistribute it (e.g. to Replicate "
                             f"or Shard on a leading dim) first")
    sharded_rows = isinstance(first, dtensor)
    for name, value in row_values[1:]:
        if isinstance(value, dtensor) != sharded_rows or (sharded_rows and (
                value.device_mesh != first.device_mesh
                or tuple(value.placements) != tuple(first.placements))):
            what = _describe(value) if isinstance(value, dtensor) else "a plain tensor"
            first_what = _describe(first) if sharded_rows else "a plain tensor"
            raise ValueError(f"{op}: {name} is {what} but {first_name} is {first_what}: "
                             f"they are split into the same rows, so they need one mesh "
                             f"and one placement")
    if sharded_rows:
        reduced = tuple(d % first.dim() for d in (over(arguments) if over else (-1,)))
        for p in first.placements:
            if isinstance(p, Shard) and p.dim % first.dim() in reduced:
                raise ValueError(
                    f"{op}: {first_name} is {_describe(first)}: sharded along dim "
                    f"{p.dim % first.dim()}, which {op} reduces over, so no rank holds a "
                    f"whole row; shard along a leading dim (e.g. Shard(0)) or redistribute "
                    f"to Replicate")
    mesh = first.device_mesh if sharded_rows else None
    for name, value in arguments.items():
        if name in rows or not isinstance(value, torch.Tensor):
            continue
        if not isinstance(value, dtensor):
            if sharded_rows and value.requires_grad and torch.is_grad_enabled():
                raise ValueError(
                    f"{op}: {name} is a plain tensor that requires grad while {first_name} is "
                    f"{_describe(first)}: its gradient would hold this rank's rows alone; "
                    f"make it a Replicate DTensor on {first_name}'s mesh "
                    f"(distribute_tensor({name}, mesh, [Replicate()])), whose gradient is "
                    f"summed over the ranks")
            continue
        if not all(isinstance(p, Replicate) for p in value.placements):
            raise ValueError(f"{op}: {name} is {_describe(value)}, but {op} needs {name} "
                             f"whole on every rank (Replicate); gather it first (e.g. "
                             f"{name}.full_tensor(), or call from the module whose forward "
                             f"FSDP unshards it)")
        if mesh is not None and value.device_mesh != mesh:
            raise ValueError(f"{op}: {name} is {_describe(value)}, on another mesh than "
                             f"{first_name} ({_describe(first)})")
    if refuse is not None and sharded_rows:
        reason = refuse(arguments)
        if reason:
            raise ValueError(f"{op}: {first_name} is {_describe(first)}: {reason}")
    if not sharded_rows:
        return None
    shapes = [(tuple(v.to_local().shape), tuple(v.shape)) for _, v in row_values]
    return first.device_mesh, tuple(first.placements), shapes


def _wrap(out, plan, dtensor):
    if plan is None:
        return out
    if isinstance(out, tuple):
        values = [_wrap_one(o, i, plan, dtensor) for i, o in enumerate(out)]
        return type(out)(*values) if hasattr(out, "_fields") else tuple(values)
    return _wrap_one(out, 0, plan, dtensor)


def _wrap_one(t: Any, index: int, plan, dtensor):
    """Output `index` as a DTensor: its global size along each sharded dim is that of the
    rows input it is computed from (q_rot from q, k_rot from k): the one at its position
    when their local sizes agree, else the first that agrees, else the first."""
    if not isinstance(t, torch.Tensor):
        return t
    from torch.distributed.tensor import Partial, Replicate, Shard
    mesh, placements, shapes = plan
    if t.dim() == 0:  # a sum over the rows: each rank holds its shard's part
        partial = tuple(Partial("sum") if isinstance(p, Shard) else Replicate()
                        for p in placements)
        return dtensor.from_local(t, mesh, partial, run_check=False, shape=t.shape,
                                  stride=t.stride())
    dims = sorted({p.dim for p in placements if isinstance(p, Shard) and p.dim < t.dim()})

    def agrees(local_shape):
        return all(d < len(local_shape) and local_shape[d] == t.shape[d] for d in dims)

    candidates = ([shapes[index]] if index < len(shapes) else []) + shapes
    _, global_shape = next((c for c in candidates if agrees(c[0])), shapes[0])
    shape = list(t.shape)
    for d in dims:
        shape[d] = global_shape[d]
    return dtensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=_stride_like(t, shape))


def _stride_like(t: torch.Tensor, shape: list[int]) -> tuple[int, ...]:
    """The strides of a dense tensor of `shape` laid out in t's dim order."""
    order = sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d]))
    stride = [0] * t.dim()
    step = 1
    for d in order:
        stride[d] = step
        step *= max(shape[d], 1)
    return tuple(stride)
