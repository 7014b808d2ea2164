import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import rms_norm as op
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import (DTYPES, EXTREME_SCALES, assert_verified, case_maker, relative_error,
                           seeded)

SPEC = op.SPEC


case = case_maker("rms_norm", "rows", "hidden")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden,layout,flags", [
    pytest.param(1, 1, "contiguous", {}, id="rows1-hidden1"),
    pytest.param(13, 781, "contiguous", {}, id="rows13-hidden781"),
    pytest.param(8, 1823, "strided", {}, id="rows8-hidden1823-strided"),
    pytest.param(6, 1000, "transposed", {}, id="rows6-hidden1000-transposed"),
    pytest.param(9, 256, "contiguous", {"weight": False}, id="rows9-hidden256-noweight"),
    pytest.param(9, 256, "contiguous", {"offset": 1}, id="rows9-hidden256-gemma"),
    pytest.param(2, 20011, "strided", {}, id="rows2-hidden20011-looped"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_backward_match_float64(rows, hidden, layout, flags, dtype, seed, device):
    assert_verified(SPEC, case(rows, hidden, dtype, layout, seed, **flags), device)


def test_nonfinite_positions_match(device):
    assert_verified(SPEC, case(5, 300, nonfinite=True), device)


def test_empty_input_launches_nothing(device):
    x = torch.empty(0, 64, device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    counter = LaunchCounter()
    with counter.active():
        y = speedlight.rms_norm(x, w)
        y.sum().backward()
    assert y.shape == (0, 64) and counter.count == 0
    assert torch.equal(w.grad, torch.zeros(64, device=device))


def test_scale_invariance(device):
    """RMSNorm(a * x) == RMSNorm(x) for a > 0 (eps aside)."""
    x = seeded((7, 512), device=device)
    w = seeded((512,), device=device, seed=1)
    y1 = speedlight.rms_norm(x, w, eps=0.0)
    y2 = speedlight.rms_norm(37.5 * x, w, eps=0.0)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)


def test_leading_dims_and_views(device):
    base = seeded((2, 5, 300), device=device)
    x = base[:, 1:4, :257]  # a strided 3-D view
    w = seeded((257,), device=device, seed=2)
    torch.testing.assert_close(speedlight.rms_norm(x, w), reference.rms_norm(x, w),
                               rtol=1e-5, atol=1e-5)


def test_module_matches_torch_and_shares_state_dict(device):
    ref = torch.nn.RMSNorm(384, eps=1e-5).to(device)
    with torch.no_grad():
        ref.weight.copy_(seeded((384,), device=device, seed=5))
    ours = snn.RMSNorm(384, eps=1e-5).to(device)
    ours.load_state_dict(ref.state_dict())
    assert set(ours.state_dict()) == set(ref.state_dict()) == {"weight"}
    x = seeded((3, 11, 384), device=device)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    assert isinstance(ours, torch.nn.RMSNorm)


def test_module_default_eps_and_multidim_shape(device):
    ref = torch.nn.RMSNorm((4, 32)).to(device)
    ours = snn.RMSNorm((4, 32)).to(device)
    ours.load_state_dict(ref.state_dict())
    x = seeded((5, 4, 32), device=device)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    no_affine = snn.RMSNorm(32, elementwise_affine=False).to(device)
    torch.testing.assert_close(no_affine(x), torch.nn.RMSNorm(32, elementwise_affine=False)(x),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, device):
    torch._dynamo.reset()

    def block(x, w):
        return speedlight.rms_norm(x * 2.0, w, eps=1e-5) + 1.0

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    x = seeded((6, 96), device=device).requires_grad_()
    w = seeded((96,), device=device, seed=3).requires_grad_()
    y = compiled(x, w)
    gx, gw = torch.autograd.grad(y.sum(), (x, w))
    y_ref = block(x, w)
    gx_ref, gw_ref = torch.autograd.grad(y_ref.sum(), (x, w))
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
    torch.testing.assert_close(gw, gw_ref)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, dtype=torch.int64, device=d)), TypeError,
     "x must be a float32, float16 or bfloat16 tensor.*int64"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), torch.ones(7, device=d)),
     ValueError, r"weight must have shape \(8,\)"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), torch.ones(8, dtype=torch.int32, device=d)),
     TypeError, "weight must be"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), None, offset=1.0), ValueError,
     "offset=1.0 scales a weight"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), eps=-1.0), ValueError, "eps"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), eps=float("nan")), ValueError,
     "eps must be a finite non-negative number, got nan"),
    (lambda d: speedlight.rms_norm(torch.ones(4, 8, device=d), eps=float("inf")), ValueError,
     "eps must be a finite non-negative number, got inf"),
    (lambda d: snn.RMSNorm(8).to(d)(torch.ones(4, 8, dtype=torch.int32, device=d)), TypeError,
     "x must be a float32, float16 or bfloat16 tensor.*int32"),
    (lambda d: speedlight.rms_norm([1.0, 2.0]), TypeError, "x must be a torch.Tensor"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(device)
    assert counter.count == 0


def test_mismatched_devices():
    x = torch.ones(4, 8)
    w = torch.ones(8, device="meta")
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        speedlight.rms_norm(x, w)


def test_cpu_tensor_without_interpreter_says_how_to_enable_it(monkeypatch):
    monkeypatch.setattr(op, "check_runtime", op.check_runtime)  # keep the real check
    import speedlight.ops._common as common
    monkeypatch.setattr(common, "is_interpreted", lambda kernel: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        speedlight.rms_norm(torch.ones(2, 8), torch.ones(8))


def test_dw_reduced_over_many_programs(device):
    """More rows than programs: every program's partial dw must reach the sum."""
    x = seeded((301, 64), device=device).requires_grad_()
    w = seeded((64,), device=device, seed=9).requires_grad_()
    g = seeded((301, 64), device=device, seed=4)
    (gw,) = torch.autograd.grad(speedlight.rms_norm(x, w), (w,), g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (gw64,) = torch.autograd.grad(reference.rms_norm(x64, w64), (w64,), g.double())
    torch.testing.assert_close(gw.double(), gw64, rtol=1e-5, atol=1e-5)


@needs_gpu("rows x stride > 2^31 needs > 4 GiB per tensor and hours under the CPU interpreter")
def test_64bit_indexing(device):
    rows, hidden = 65537, 32771  # rows * hidden > 2^31
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
    w = torch.randn(hidden, device=device, dtype=torch.bfloat16)
    y = speedlight.rms_norm(x, w)
    tail = slice(rows - 3, rows)
    torch.testing.assert_close(y[tail].float(), reference.rms_norm(x[tail].float(), w.float()),
                               rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("sms", [pytest.param(1, id="1-sm"), pytest.param(132, id="132-sms")])
@pytest.mark.parametrize("rows,hidden", [
    pytest.param(9, 4096, id="rows9-hidden4096"),  # 2-row tiles; on 1 SM, 2 programs loop over 5
    pytest.param(37, 768, id="rows37-hidden768"),
    pytest.param(3, 20011, id="rows3-hidden20011-looped"),
])
def test_gpu_sized_launches_match_float64(sms, rows, hidden, device):
    """The block sizes and persistent grids a GPU gets (spec.sized_for), verified under the
    interpreter: with one SM the persistent programs walk several tiles each."""
    from speedlight.spec import sized_for

    with sized_for(sms):
        assert_verified(SPEC, case(rows, hidden, torch.bfloat16), device)
        assert_verified(SPEC, case(rows, hidden, torch.float32, weight=False), device)


@pytest.mark.parametrize("hidden", [pytest.param(300, id="hidden300"),
                                    pytest.param(20011, id="hidden20011-looped")])
@pytest.mark.parametrize("scale,eps", EXTREME_SCALES)
def test_extreme_magnitudes_match_float64(hidden, scale, eps, device):
    """x^2 overflows float32 above |x| ~ 1.8e19 (rstd became 0 and y silently 0): each row
    is scaled by a power of two near its largest |x|, so y and every gradient match
    float64 wherever they are representable."""
    x = seeded((3, hidden), device=device, scale=scale).requires_grad_()
    w = (1.0 + seeded((hidden,), device=device, seed=1, scale=0.2)).requires_grad_()
    g = seeded((3, hidden), device=device, seed=2)
    y = speedlight.rms_norm(x, w, eps=eps)
    grads = torch.autograd.grad(y, (x, w), g)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y64 = reference.rms_norm(x64, w64, eps=eps)
    grads64 = torch.autograd.grad(y64, (x64, w64), g.double())
    for name, got, want in zip(("y", "dx", "dw"), (y, *grads), (y64, *grads64)):
        assert torch.isfinite(got).all(), name
        assert relative_error(got, want) < 1e-5, name
