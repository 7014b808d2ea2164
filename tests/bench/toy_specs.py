"""Cheap OpSpecs for the bench tests: plain-PyTorch implementations, so the harness is
exercised in milliseconds and without the Triton interpreter. Also a spec file:
`speedlight bench --spec tests/bench/toy_specs.py --only-spec`."""

from __future__ import annotations

import dataclasses
import time

import torch

from speedlight.spec import Case, Cost, OpSpec, rand_tensor


def _cases(suite: str) -> list[Case]:
    shapes = {"quick": [(4, 8), (3, 33)], "model": [(64, 128)], "full": [(4, 8), (1, 1)]}[suite]
    return [Case("toy_scale", {"rows": r, "cols": c}) for r, c in shapes]


def _inputs(case: Case, device) -> dict:
    return {"x": rand_tensor((case["rows"], case["cols"]), case, device), "alpha": 1.5}


def _cost(case: Case, mode: str) -> Cost:
    n, e = case["rows"] * case["cols"], case.dtype.itemsize
    # forward: read x, write y; backward: read dy, write dx. One multiply per element.
    return Cost(flops=n, bytes=2 * n * e)


TOY = OpSpec(
    name="toy_scale",
    impl=lambda x, alpha: x * alpha,
    reference=lambda x, alpha: x * alpha,
    make_inputs=_inputs,
    cost=_cost,
    suites={s: (lambda s=s: _cases(s)) for s in ("quick", "model", "full")},
    grad_inputs=("x",),
)

# An implementation that computes the wrong thing: verify fails it, so bench withholds its
# speedups.
WRONG = dataclasses.replace(TOY, name="toy_wrong", impl=lambda x, alpha: x * alpha * 1.01)


class _SlowForward(torch.autograd.Function):
    """Forward sleeps FWD_S, backward BWD_S: tells which part a mode timed."""

    @staticmethod
    def forward(ctx, x):
        time.sleep(FWD_S)
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        time.sleep(BWD_S)
        return dy * 2


FWD_S, BWD_S = 0.03, 0.001
SLOW = dataclasses.replace(TOY, name="toy_slow_forward", impl=lambda x, alpha: _SlowForward.apply(x),
                           reference=lambda x, alpha: x * 2)

SPECS = [TOY]
