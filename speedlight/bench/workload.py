"""What one sample of a bench measurement runs: (prepare, run) for each mode, and the
restoring of inputs an implementation overwrites."""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.bench.baselines import Contender
from speedlight.spec import OpSpec, as_outputs, grad_leaves


def float_outputs(out) -> list[torch.Tensor]:
    return [o for o in as_outputs(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]


def restorer(copies: list[dict], pristine: dict) -> Callable[[int], None]:
    """restore(k): copy the pristine inputs back into input set k (for implementations
    that write their inputs)."""
    def restore(k: int) -> None:
        for name, v in copies[k % len(copies)].items():
            if isinstance(v, torch.Tensor):
                v.copy_(pristine[name])
    return restore


def work(impl: Contender, spec: OpSpec, mode: str, copies: list[dict],
         upstream: list[torch.Tensor], restore):
    """(prepare, run) for measure(); (reason, None) when the mode cannot run."""
    fn, n = impl.fn, len(copies)
    if mode == "fwd":
        def run_fwd(k):
            with torch.no_grad():
                return fn(**copies[k % n])
        return (restore, run_fwd)
    leaves = [grad_leaves(c, spec.grad_inputs) for c in copies]
    if not leaves[0][1]:
        return (f"{spec.name} has no differentiable input among {spec.grad_inputs}", None)
    state: dict = {}

    def forward(k):
        inputs, names = leaves[k % n]
        outs = float_outputs(fn(**inputs))
        pairs = [(o, g) for o, g in zip(outs, state["grads"]) if o.requires_grad]
        if not pairs:
            raise RuntimeError("no output of the forward requires grad")
        state["outs"] = [o for o, _ in pairs]
        state["grads"] = [g for _, g in pairs]
        state["wrt"] = [inputs[m] for m in names]

    def backward():
        torch.autograd.grad(state["outs"], state["wrt"], state["grads"], allow_unused=True)

    if mode == "bwd":
        def prepare_bwd(k):
            if restore:
                restore(k)
            state["grads"] = [u.clone() for u in upstream]
            forward(k)
        return (prepare_bwd, lambda k: backward())

    def prepare_both(k):
        if restore:
            restore(k)
        state["grads"] = [u.clone() for u in upstream]

    def run_both(k):
        forward(k)
        backward()
    return (prepare_both, run_both)
