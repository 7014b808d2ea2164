"""The custom op register_op builds for each of an op's forward, inference and backward
launchers: one torch.library custom op over the launcher's parameters and an `impl`
argument choosing the implementation, with its fake; a launcher's None output becomes an
empty placeholder, since a custom op's outputs are tensors."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Sequence

import torch

Launcher = Callable[..., Any]

# What runs around a launcher while a custom op calls it: a context manager factory, or
# None. A launcher runs inside the op's dispatch, below any TorchDispatchMode that saw the
# op itself; profile's memory tracking enters its own mode here to see the tensors the
# launcher makes (its intermediates). A plain global, not a ContextVar: autograd runs a
# GPU backward on a thread of its own.
_AROUND_LAUNCHER: list[Callable[[], Any]] = []


@contextlib.contextmanager
def around_launchers(factory: Callable[[], Any]):
    """Within this block, every custom op's launcher runs inside `factory()`."""
    _AROUND_LAUNCHER.append(factory)
    try:
        yield
    finally:
        _AROUND_LAUNCHER.pop()


def _placeholder(args) -> torch.Tensor:
    first = next(a for a in args if isinstance(a, torch.Tensor))
    return first.new_empty((0,))


def _tensors_only(out, n: int, args, op_name: str):
    """A launcher's result as a custom op returns it: None -> an empty placeholder."""
    if n == 0:
        return None
    out = out if isinstance(out, tuple) else (out,)
    if len(out) != n:
        raise RuntimeError(f"{op_name}: its launcher returned {len(out)} outputs, the "
                           f"registration declares {n}")
    out = tuple(_placeholder(args) if o is None else o for o in out)
    return out[0] if n == 1 else out


def build_custom_op(op_name: str, impls: dict[str, Launcher], fake, params, hints, n_out: int,
               mutates: Sequence[str]):
    """A custom op `op_name` (namespace::name) over `params` (+ impl) that runs
    impls[impl]."""
    default = next(iter(impls))
    n_args = len(params)

    def split(args, kwargs):
        """(the launcher's arguments, impl): torch may pass an argument with a default
        by keyword, or leave it out."""
        call = list(args[:n_args]) + [kwargs.get(p.name, p.default)
                                      for p in params[len(args):]]
        if len(args) > n_args:
            return call, args[n_args]
        return call, kwargs.get("impl", default)

    def run(*args, **kwargs):
        call, impl = split(args, kwargs)
        around = _AROUND_LAUNCHER[-1]() if _AROUND_LAUNCHER else contextlib.nullcontext()
        with around:
            out = impls[impl](*call)
        return _tensors_only(out, n_out, call, op_name)

    def run_fake(*args, **kwargs):
        call, _ = split(args, kwargs)
        return _tensors_only(fake(*call), n_out, call, op_name)

    sig_params = [p.replace(annotation=hints.get(p.name, p.annotation),
                            kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
    sig_params.append(inspect.Parameter("impl", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=default, annotation=str))
    returns = (None if n_out == 0 else torch.Tensor if n_out == 1
               else tuple[(torch.Tensor,) * n_out])
    run.__signature__ = inspect.Signature(sig_params, return_annotation=returns)
    run.__name__ = op_name.split("::")[-1]
    schema = torch.library.infer_schema(run, mutates_args=tuple(mutates))
    op = torch.library.custom_op(op_name, run, mutates_args=tuple(mutates),
                                 schema=schema)
    op.register_fake(run_fake)
    return op
