"""speedlight.ops.registration: what one declaration builds, beyond what every op's
tests already show (custom ops, fakes, autograd, torch.compile)."""

import contextlib

import pytest
import torch

from torch.utils._python_dispatch import TorchDispatchMode

import speedlight
from speedlight import launch
from speedlight.ops import add_rms_norm, cross_entropy, layer_norm, registration, rms_norm
from tests.helpers import triton_launches


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
    seen = []

    def record(kernel, args, kwargs):
        seen.extend((getattr(kernel, "__name__", str(kernel)), kwargs[key])
                    for key in ("STORE_RSTD", "STORE_STATS") if key in kwargs)

    with triton_launches(record):
        yield seen


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


def _sizing_op(name: str, mutates: bool):
    """A stand-in op whose forward and backward report the launch context they run under
    (the SM count and SKU their launches are sized for) in `seen`."""
    seen = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        seen.append(("fwd", launch.planned_sm_count(x.device), launch.launch_sku(x.device)))
        if mutates:
            x.mul_(1.0)
        return x.clone()

    def backward(dy: torch.Tensor) -> torch.Tensor:
        seen.append(("bwd", launch.planned_sm_count(dy.device), launch.launch_sku(dy.device)))
        return dy.clone()

    op = registration.register_op(name, forward=forward, outputs=("y",), fake=registration.like,
                                  backward=backward, grads=("x",),
                                  backward_fake=lambda dy: registration.like(dy),
                                  mutates=("x",) if mutates else (),
                                  namespace="speedlight_tests")
    return op, seen


@pytest.mark.parametrize("mutates", [False, True], ids=["custom-op-autograd", "mutating-function"])
def test_the_backward_runs_in_the_forwards_launch_context_on_another_thread(mutates):
    """Autograd may run a backward on a thread of its own (a GPU's): the forward's launch
    context (a stand-in GPU of 7 SMs) is kept with it and re-entered there, whatever the
    context of the thread that runs the backward."""
    import threading

    from tests.conftest import gpu_target

    op, seen = _sizing_op(f"sizing_{'mutating' if mutates else 'plain'}", mutates)
    x = torch.ones(3, 4, requires_grad=True)
    with launch.for_target(gpu_target(7)):
        y = op(x.clone() if mutates else x)
    errors = []

    def run_backward():
        try:
            with launch.for_target(gpu_target(5)):  # not the forward's: ignored
                y.sum().backward()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=run_backward)
    thread.start()
    thread.join()
    assert not errors, errors
    assert seen == [("fwd", 7, "h100-sxm"), ("bwd", 7, "h100-sxm")]
    assert torch.equal(x.grad, torch.ones(3, 4))
    assert launch.planned_sm_count("cpu") is None  # nothing leaked into this thread


def test_rms_norms_backward_on_another_thread_is_sized_for_the_forwards_target(device):
    """A real launcher: rms_norm's backward grid (its dw partial sums, one program per few
    rows) comes from the forward's target (7 SMs: 14 programs for 300 rows), not from the
    thread the backward runs on (under the interpreter: 75; a GPU's own: its SM count)."""
    import threading

    from speedlight.inspect.launches import Recorder, intercept
    from tests.conftest import gpu_target

    x = torch.randn(300, 64, device=device, requires_grad=True)
    w = torch.randn(64, device=device, requires_grad=True)
    recorder = Recorder(90, "dry")
    with intercept(recorder):
        with launch.for_target(gpu_target(7)):
            y = rms_norm.rms_norm(x, w)
        thread = threading.Thread(target=lambda: y.sum().backward())
        thread.start()
        thread.join()
    (bwd,) = [l for l in recorder.launches if l.kernel == "_rms_norm_bwd_kernel"]
    assert bwd.grid[0] == 14


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
