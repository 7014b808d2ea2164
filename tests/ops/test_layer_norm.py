import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import layer_norm as op
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import (DTYPES, EXTREME_SCALES, assert_verified, case_maker, relative_error,
                           seeded)

SPEC = op.SPEC


case = case_maker("layer_norm", "rows", "hidden")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden,layout,flags", [
    pytest.param(1, 1, "contiguous", {}, id="rows1-hidden1"),
    pytest.param(13, 781, "contiguous", {}, id="rows13-hidden781"),
    pytest.param(8, 1823, "strided", {}, id="rows8-hidden1823-strided"),
    pytest.param(6, 1000, "transposed", {}, id="rows6-hidden1000-transposed"),
    pytest.param(9, 256, "contiguous", {"weight": False, "bias": False}, id="rows9-hidden256-noaffine"),
    pytest.param(9, 256, "contiguous", {"bias": False}, id="rows9-hidden256-nobias"),
    pytest.param(9, 256, "contiguous", {"weight": False}, id="rows9-hidden256-noweight"),
    pytest.param(2, 20011, "strided", {}, id="rows2-hidden20011-looped"),
    # 5 tiles of 16 rows over the interpreter's 2 persistent programs
    pytest.param(70, 4096, "contiguous", {}, id="rows70-hidden4096-tiles-per-program"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_backward_match_float64(rows, hidden, layout, flags, dtype, seed, device):
    assert_verified(SPEC, case(rows, hidden, dtype, layout, seed, **flags), device)


def test_nonfinite_positions_match(device):
    assert_verified(SPEC, case(5, 300, nonfinite=True), device)


def test_empty_input_launches_nothing(device):
    x = torch.empty(0, 64, device=device, requires_grad=True)
    w = torch.ones(64, device=device, requires_grad=True)
    b = torch.zeros(64, device=device, requires_grad=True)
    counter = LaunchCounter()
    with counter.active():
        y = speedlight.layer_norm(x, (64,), w, b)
        y.sum().backward()
    assert y.shape == (0, 64) and counter.count == 0
    assert torch.equal(w.grad, torch.zeros(64, device=device))
    assert torch.equal(b.grad, torch.zeros(64, device=device))


@pytest.mark.parametrize("hidden", [pytest.param(512, id="hidden512"),
                                    pytest.param(20011, id="hidden20011-looped")])
def test_variance_is_taken_around_a_large_mean(hidden, device):
    """Rows of mean 3000 and std 1: E[x^2] - E[x]^2 in fp32 would lose every digit."""
    x = 3000.0 + seeded((3, hidden), device=device)
    y = speedlight.layer_norm(x, hidden, eps=0.0)
    y64 = reference.layer_norm(x.double(), (hidden,), eps=0.0)
    torch.testing.assert_close(y.double(), y64, rtol=0, atol=5e-3)


def test_invariant_to_shift_and_scale(device):
    """LayerNorm(a * x + c) == LayerNorm(x) for a > 0 (eps aside), and each output row has
    mean 0 and variance 1 without an affine."""
    x = seeded((7, 384), device=device)
    y = speedlight.layer_norm(x, 384, eps=0.0)
    torch.testing.assert_close(speedlight.layer_norm(2.5 * x - 7.0, 384, eps=0.0), y,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.mean(-1), torch.zeros(7, device=device), rtol=0, atol=1e-6)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(7, device=device),
                               rtol=1e-5, atol=1e-5)


def test_leading_dims_views_and_multidim_shape(device):
    base = seeded((2, 5, 300), device=device)
    x = base[:, 1:4, :257]  # a strided 3-D view
    w, b = seeded((257,), device=device, seed=2), seeded((257,), device=device, seed=3)
    torch.testing.assert_close(speedlight.layer_norm(x, (257,), w, b),
                               torch.nn.functional.layer_norm(x, (257,), w, b),
                               rtol=1e-5, atol=1e-5)
    w2, b2 = seeded((5, 300), device=device, seed=4), seeded((5, 300), device=device, seed=5)
    torch.testing.assert_close(speedlight.layer_norm(base, (5, 300), w2, b2),
                               torch.nn.functional.layer_norm(base, (5, 300), w2, b2),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    pytest.param({}, id="affine"), pytest.param({"bias": False}, id="nobias"),
    pytest.param({"elementwise_affine": False}, id="noaffine"),
])
def test_module_matches_torch_and_shares_state_dict(kwargs, device):
    ref = torch.nn.LayerNorm(384, eps=1e-6, **kwargs).to(device)
    with torch.no_grad():
        for i, p in enumerate(ref.parameters()):
            p.copy_(seeded(p.shape, device=device, seed=5 + i))
    ours = snn.LayerNorm(384, eps=1e-6, **kwargs).to(device)
    assert isinstance(ours, torch.nn.LayerNorm)
    ours.load_state_dict(ref.state_dict())
    assert set(ours.state_dict()) == set(ref.state_dict())
    x = seeded((3, 11, 384), device=device).requires_grad_()
    y, y_ref = ours(x), ref(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g = seeded(y.shape, device=device, seed=9)
    params = [x] + list(ours.parameters())
    grads = torch.autograd.grad(y, params, g)
    grads_ref = torch.autograd.grad(y_ref, [x] + list(ref.parameters()), g)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_module_multidim_shape(device):
    ref = torch.nn.LayerNorm((4, 32)).to(device)
    ours = snn.LayerNorm((4, 32)).to(device)
    ours.load_state_dict(ref.state_dict())
    x = seeded((5, 4, 32), device=device)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, device):
    torch._dynamo.reset()

    def block(x, w, b):
        return speedlight.layer_norm(x * 2.0, (96,), w, b) + 1.0

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    x = seeded((6, 96), device=device).requires_grad_()
    w = seeded((96,), device=device, seed=3).requires_grad_()
    b = seeded((96,), device=device, seed=4).requires_grad_()
    y = compiled(x, w, b)
    grads = torch.autograd.grad(y.sum(), (x, w, b))
    y_ref = block(x, w, b)
    grads_ref = torch.autograd.grad(y_ref.sum(), (x, w, b))
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, dtype=torch.int64, device=d), 8), TypeError,
     "x must be a float32, float16 or bfloat16 tensor.*int64"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 7), ValueError,
     r"trailing dims must be normalized_shape \(7,\).*\(4, 8\)"),
    (lambda d: speedlight.layer_norm(torch.ones(8, device=d), (2, 8)), ValueError,
     "trailing dims must be normalized_shape"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8.0), TypeError,
     "normalized_shape must be an int"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8, torch.ones(7, device=d)),
     ValueError, r"weight must have normalized_shape \(8,\), got \(7,\)"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8, None, torch.ones(4, 2, device=d)),
     ValueError, r"bias must have normalized_shape \(8,\)"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8,
                                     torch.ones(8, dtype=torch.int32, device=d)),
     TypeError, "weight must be"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8, eps=-1.0), ValueError, "eps"),
    (lambda d: speedlight.layer_norm(torch.ones(4, 8, device=d), 8, eps=float("nan")),
     ValueError, "eps must be a finite non-negative number, got nan"),
    (lambda d: speedlight.layer_norm([1.0, 2.0], 2), TypeError, "x must be a torch.Tensor"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(device)
    assert counter.count == 0


def test_mismatched_devices():
    with pytest.raises(ValueError, match="bias is on meta but x is on cpu"):
        speedlight.layer_norm(torch.ones(4, 8), 8, torch.ones(8), torch.ones(8, device="meta"))


def test_dw_db_reduced_over_many_programs(device):
    """More rows than programs: every program's partial dw and db must reach the sums."""
    x = seeded((301, 64), device=device).requires_grad_()
    w = seeded((64,), device=device, seed=9).requires_grad_()
    b = seeded((64,), device=device, seed=10).requires_grad_()
    g = seeded((301, 64), device=device, seed=4)
    gw, gb = torch.autograd.grad(speedlight.layer_norm(x, 64, w, b), (w, b), g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    gw64, gb64 = torch.autograd.grad(reference.layer_norm(x64, (64,), w64, b64), (w64, b64),
                                     g.double())
    # a lost partial would be off by O(1); 1e-4 leaves room for fp32 sums of 301 terms
    torch.testing.assert_close(gw.double(), gw64, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb.double(), gb64, rtol=1e-4, atol=1e-4)


@needs_gpu("rows x stride > 2^31 needs > 4 GiB per tensor and hours under the CPU interpreter")
def test_64bit_indexing(device):
    rows, hidden = 65537, 32771  # rows * hidden > 2^31
    x = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(hidden, device=device, dtype=torch.bfloat16)
    b = torch.randn(hidden, device=device, dtype=torch.bfloat16)
    y = speedlight.layer_norm(x, hidden, w, b)
    (dx,) = torch.autograd.grad(y, (x,), torch.ones_like(y))
    tail = slice(rows - 3, rows)
    xt = x.detach()[tail].float().requires_grad_()
    y_ref = reference.layer_norm(xt, (hidden,), w.float(), b.float())
    (dx_ref,) = torch.autograd.grad(y_ref, (xt,), torch.ones_like(y_ref))
    torch.testing.assert_close(y[tail].float(), y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dx[tail].float(), dx_ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("hidden", [pytest.param(300, id="hidden300"),
                                    pytest.param(20011, id="hidden20011-looped")])
@pytest.mark.parametrize("scale,eps", EXTREME_SCALES)
def test_extreme_magnitudes_match_float64(hidden, scale, eps, device):
    """(x - mean)^2 overflows float32 above |x| ~ 1e19 (rstd became 0: y was the bias,
    silently): each row is scaled by a power of two near its largest |x|, so y and every
    gradient match float64 wherever they are representable. The mean sits away from 0."""
    x = (scale * (1.0 + seeded((3, hidden), device=device))).requires_grad_()
    w = (1.0 + seeded((hidden,), device=device, seed=1, scale=0.2)).requires_grad_()
    b = seeded((hidden,), device=device, seed=3, scale=0.2).requires_grad_()
    g = seeded((3, hidden), device=device, seed=2)
    y = speedlight.layer_norm(x, (hidden,), w, b, eps=eps)
    grads = torch.autograd.grad(y, (x, w, b), g)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = reference.layer_norm(x64, (hidden,), w64, b64, eps=eps)
    grads64 = torch.autograd.grad(y64, (x64, w64, b64), g.double())
    for name, got, want in zip(("y", "dx", "dw", "db"), (y, *grads), (y64, *grads64)):
        assert torch.isfinite(got).all(), name
        assert relative_error(got, want) < 1e-5, name
