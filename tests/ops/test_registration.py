"""speedlight.ops.registration: what one declaration builds, beyond what every op's
tests already show (custom ops, fakes, autograd, torch.compile)."""

import contextlib

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

import speedlight
from speedlight.ops import add_rms_norm, cross_entropy, layer_norm, registration, rms_norm


class _Calls(TorchDispatchMode):
    """Records the speedlight custom ops called inside."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "speedlight":
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _stat_switches():
    """The STORE_RSTD / STORE_STATS switch of every norm kernel launched inside."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen = []
    originals = {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def recording(orig):
        def run(self, *args, **kwargs):
            for key in ("STORE_RSTD", "STORE_STATS"):
                if key in kwargs:
                    seen.append((getattr(self, "__name__", str(self)), kwargs[key]))
            return orig(self, *args, **kwargs)
        return run

    for cls, orig in originals.items():
        cls.run = recording(orig)
    try:
        yield seen
    finally:
        for cls, orig in originals.items():
            cls.run = orig


def _saved_tensors(fn) -> int:
    """How many tensors autograd saves for a backward while fn runs."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fn()
    return len(saved)


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_the_inference_op_runs_when_no_gradient_is_wanted(grad, device):
    """Every norm (rms_norm, add_rms_norm, layer_norm) runs its inference op when no
    gradient is wanted: its kernels store no statistics and autograd saves nothing."""
    x = torch.randn(4, 64, device=device)
    r = torch.randn(4, 64, device=device)
    w = torch.randn(64, device=device, requires_grad=True)
    b = torch.randn(64, device=device)
    out = {}

    def run():
        out["y"] = speedlight.rms_norm(x, w)
        out["yh"] = speedlight.add_rms_norm(x, r, w)
        out["z"] = speedlight.layer_norm(x, 64, w, b)

    with torch.set_grad_enabled(grad), _Calls() as calls, _stat_switches() as switches:
        n_saved = _saved_tensors(run)
    y, (y2, h), z = out["y"], out["yh"], out["z"]
    assert y.requires_grad == y2.requires_grad == z.requires_grad == grad
    suffix = "fwd" if grad else "infer"
    assert calls.names == [f"{op}_{suffix}" for op in ("rms_norm", "add_rms_norm", "layer_norm")]
    assert len(switches) == 3 and all(store == grad for _, store in switches), switches
    assert (n_saved > 0) == grad, n_saved  # x, w and the statistics, or nothing
    torch.testing.assert_close(y, rms_norm.rms_norm_fwd(x, w, 1e-6, 0.0)[0])
    torch.testing.assert_close((y2, h), add_rms_norm.add_rms_norm_fwd(x, r, w, 1e-6, 0.0)[:2])
    torch.testing.assert_close(z, layer_norm.layer_norm_fwd(x, w, b, 1e-5)[0])


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_inference_in_place_norm_is_the_inference_op(op, device):
    """in_place changes the backward only: with no gradient wanted the in-place variant
    runs the same inference launcher (no statistics)."""
    x = torch.randn(4, 64, device=device)
    args = (x, torch.randn(4, 64, device=device)) if op == "add_rms_norm" else (x,)
    with torch.no_grad(), _Calls() as calls, _stat_switches() as switches:
        getattr(speedlight, op)(*args, in_place=True)
    assert calls.names == [f"{op}_inplace_infer"] and switches[0][1] is False


def test_schema_comes_from_the_launcher_with_impl_and_mutation():
    assert cross_entropy.CROSS_ENTROPY_INPLACE.forward_op is not None
    fwd = str(torch.ops.speedlight.rms_norm_fwd.default._schema)
    assert fwd == ("speedlight::rms_norm_fwd(Tensor x, Tensor? weight, float eps, float offset, "
                   "str impl=\"triton\") -> (Tensor, Tensor)")
    inplace = str(torch.ops.speedlight.cross_entropy_inplace_fwd.default._schema)
    assert inplace.startswith("speedlight::cross_entropy_inplace_fwd(Tensor(a0!) logits")
    with pytest.raises(ValueError, match="rms_norm has no implementation 'cutlass'"):
        rms_norm.RMS_NORM(torch.ones(2, 4), None, 1e-6, 0.0, impl="cutlass")


def test_config_hook_prefers_a_tuned_entry():
    space = registration.Configs({"num_warps": (1, 2, 4)}, default=lambda key: {"num_warps": 4})
    op = registration.RegisteredOp("toy", ("y",), (), ("triton",), None, configs=space)
    assert op.config((4096, "bf16")) == {"num_warps": 4}
    op.set_tuned({(4096, "bf16"): {"num_warps": 2}})
    assert op.config((4096, "bf16")) == {"num_warps": 2} and op.config((8, "bf16")) == {"num_warps": 4}


def test_a_declaration_that_cannot_work_is_refused_when_registered():
    def fwd(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def bwd(dy: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return dy

    with pytest.raises(ValueError, match="stats \\['s'\\] are not among outputs"):
        registration.register_op("bad_stats", forward=fwd, outputs=("y",), stats=("s",),
                                 fake=registration.like, namespace="speedlight_tests")
    with pytest.raises(ValueError, match="backward parameter 'z' is neither a forward input"):
        registration.register_op("bad_bwd", forward=fwd, outputs=("y",), fake=registration.like,
                                 backward=bwd, grads=("x",), namespace="speedlight_tests")
    with pytest.raises(ValueError, match="grads names 'w', not a forward parameter"):
        registration.register_op("bad_grads", forward=fwd, outputs=("y",),
                                 fake=registration.like, backward=lambda dy: dy, grads=("w",),
                                 namespace="speedlight_tests")


def test_needs_grad_tells_both_launchers_which_gradients_a_call_needs():
    """A launcher parameter `needs_grad` gets one flag per entry of grads (the caller never
    passes it); the autograd rule returns None for an input that needs none."""
    seen = []

    def fwd(x: torch.Tensor, w: torch.Tensor, needs_grad: list[bool]) -> torch.Tensor:
        seen.append(("fwd", list(needs_grad)))
        return x * w

    def bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, needs_grad: list[bool]):
        seen.append(("bwd", list(needs_grad)))
        return dy * w if needs_grad[0] else None, dy * x if needs_grad[1] else None

    op = registration.register_op(
        "toy_needs_grad", forward=fwd, outputs=("y",), fake=lambda x, w, needs_grad: registration.like(x),
        backward=bwd, grads=("x", "w"), namespace="speedlight_tests")
    schema = str(torch.ops.speedlight_tests.toy_needs_grad_bwd.default._schema)
    assert "bool[] needs_grad" in schema
    x = torch.randn(3, requires_grad=True)
    frozen = torch.randn(3)
    op(x, frozen).sum().backward()
    assert seen == [("fwd", [True, False]), ("bwd", [True, False])]
    torch.testing.assert_close(x.grad, frozen)
    seen.clear()
    with torch.no_grad():
        op(x, frozen)
    assert seen == [("fwd", [False, False])]
