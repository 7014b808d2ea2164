"""Shared test helpers: run one verify case and assert its verdict, with the reason shown."""

from __future__ import annotations

import contextlib

import pytest
import torch

from speedlight.spec import Case
from speedlight.verify import verify_case

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]


def case_maker(op: str, *names: str):
    """case(<names...>[, dtype[, layout[, seed]]], **flags) -> a Case of op with those shape
    parameters, in that order (dtype float32, layout contiguous and seed 0 by default)."""
    def case(*values, dtype=torch.float32, layout="contiguous", seed=0, **flags):
        shape, rest = values[:len(names)], values[len(names):]
        if len(shape) != len(names) or len(rest) > 3:
            raise TypeError(f"{op} cases take {', '.join(names)} (then dtype, layout, seed); "
                            f"got {len(values)} values")
        dtype, layout, seed = (tuple(rest) + (dtype, layout, seed)[len(rest):])
        return Case(op, dict(zip(names, shape)), dtype=dtype, layout=layout, flags=flags,
                    seed=seed)
    return case


def assert_verified(spec, case: Case, device) -> None:
    r = verify_case(spec, case, device)
    if r.status == "skip":
        pytest.skip(r.reason)
    assert r.status == "pass", f"{case.id}: {r.status}: {r.reason}"
    assert r.checks, "verify ran no checks"


def seeded(shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64 (got may be in any float dtype)."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm())


# |x| where x^2 overflows float32 (above ~1.8e19), near its top, and where it underflows
# (eps = 0, below ~1e-19): norms must still match float64 there
EXTREME_SCALES = [pytest.param(1e20, 1e-6, id="x1e20"), pytest.param(1e30, 1e-6, id="x1e30"),
                  pytest.param(1e36, 1e-6, id="x1e36"), pytest.param(1e-25, 0.0, id="x1e-25-eps0")]


def assert_module_matches(ours, ref, x) -> None:
    """ours, given ref's state dict, gives ref's output on x (to 1e-5)."""
    ours.load_state_dict(ref.state_dict())
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


def assert_rejected(call, error, match: str) -> None:
    """call() raises `error` matching `match` and launches no kernel."""
    from speedlight.verify.harness import LaunchCounter

    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call()
    assert counter.count == 0, f"launched {counter.kernels} before rejecting the input"


@contextlib.contextmanager
def triton_launches(record):
    """Inside, record(kernel, args, kwargs) is called at every Triton launch, compiled or
    interpreted, before the kernel runs."""
    from unittest import mock

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def recording(orig):
        def run(self, *args, **kwargs):
            record(self, args, kwargs)
            return orig(self, *args, **kwargs)
        return run

    with contextlib.ExitStack() as patched:
        for cls in (JITFunction, InterpretedFunction):
            patched.enter_context(mock.patch.object(cls, "run", recording(cls.run)))
        yield


class FreshGradient(torch.autograd.Function):
    """y -> a copy of y whose backward hands y a new gradient tensor, as a linear layer's
    does, and records where it lies (so a test can tell whether dx was written over it)."""

    addresses: list[int] = []

    @staticmethod
    def forward(ctx, y):
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        fresh = g.clone()
        FreshGradient.addresses.append(fresh.data_ptr())
        return fresh


def class_targets(shape, vocab, device, seed=0):
    """Random class indices in [0, vocab), drawn on the CPU so every device gets the same."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g).to(device)


def loss_and_grad(fn, logits, *args, upstream=None, **kwargs):
    """(loss, dloss/dlogits) of fn on a fresh copy of logits."""
    x = logits.detach().clone().requires_grad_()
    loss = fn(x, *args, **kwargs)
    (g,) = torch.autograd.grad(loss, x, upstream if upstream is not None else torch.ones_like(loss))
    return loss.detach(), g


# --- rows that need a norm's scaled sum of squares, and rows that do not --------------

def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bit patterns (NaN payloads and signed zeros compared exactly)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


RESCUES = {  # a row that needs the scaled sum, put among common ones
    "overflow": lambda row: row * 1e19,  # squares overflow
    "underflow": lambda row: row * 1e-25,  # squares underflow
    "zeros": lambda row: row * 0.0,
    "inf": lambda row: row.index_fill(0, torch.tensor([2]), float("inf")),
    "nan": lambda row: row.index_fill(0, torch.tensor([7]), float("nan")),
}


def rescue_rows(kind: str, hidden: int, dtype, device) -> torch.Tensor:
    """12 rows whose unscaled sum of squares lies in [2^-64, 2^64] (values from 1e-7 to 1e6
    in magnitude, zeros among them), the fifth replaced by a RESCUES row unless kind is
    'common'."""
    x = seeded((12, hidden), device=device)
    scales = torch.tensor([1e-7, 1e-3, 1.0, 1e3, 1e6, 1.0, 1.0, 1e-2, 10.0, 1.0, 1e4, 1.0],
                          device=device)
    x = x * scales[:, None]
    x[5, ::3] = 0.0
    if kind != "common":
        x[4] = RESCUES[kind](x[2])
    return x.to(dtype)
