import pytest
import torch
import triton
import triton.language as tl

import speedlight
import speedlight.nn as snn
from speedlight import launch, reference
from speedlight.kernels.layer_norm import _layer_norm_stats_scaled
from speedlight.ops import layer_norm as op
from tests.conftest import gpu_target
from tests.helpers import (EXTREME_SCALES, assert_module_matches, assert_rejected, bits,
                           relative_error, rescue_rows, seeded)


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
    assert_module_matches(snn.LayerNorm((4, 32)).to(device), ref, seeded((5, 4, 32), device=device))


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
    assert_rejected(lambda: call(device), error, match)


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


# --- two reductions on the common path, the scaled statistics only where a row needs them --

@triton.jit
def _two_pass_layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps,
                                BLOCK_N: tl.constexpr):
    """The scaled statistics on every row, one row per program
    (layer_norm._layer_norm_stats_scaled), then y = xc * r * w + b."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)[None, :]
    mean, rstd, xc, r = _layer_norm_stats_scaled(x, mask[None, :], n_cols, eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = xc * r[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + row * n_cols + offs[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask[None, :])
    tl.store(mean_ptr + row + tl.arange(0, 1), mean)
    tl.store(rstd_ptr + row + tl.arange(0, 1), rstd)


@pytest.mark.parametrize("kind,tiles", [
    *[pytest.param(k, 1, id=f"gpu-tiles-1-row-{k}") for k in ("common", "overflow", "underflow",
                                                              "nan")],
    pytest.param("nan", 16, id="gpu-tiles-16-rows-nan")])
def test_two_reductions_match_the_scaled_statistics_bit_for_bit(kind, tiles, device,
                                                                monkeypatch):
    """LayerNorm's forward takes the mean and the centred sum of squares unscaled and
    scales a row only when that sum leaves [2^-64, 2^64] (or is NaN): y, mean and rstd are
    the scaled statistics' bit for bit, on rows that need them and rows that do not."""
    hidden = 300
    x = rescue_rows(kind, hidden, torch.bfloat16, device)
    w = (1.0 + seeded((hidden,), device=device, seed=1, scale=0.2)).to(torch.bfloat16)
    b = seeded((hidden,), device=device, seed=2, scale=0.2).to(torch.bfloat16)
    eps = 0.0 if kind == "underflow" else 1e-5
    monkeypatch.setattr(op, "FWD_TILE", 512 * tiles)  # one row of 300 per tile, or 16
    with launch.for_target(gpu_target(132)):
        y, mean, rstd = op.layer_norm_fwd(x, w, b, eps)
    y2 = torch.empty_like(x)
    mean2, rstd2 = (torch.empty(x.shape[0], device=device) for _ in range(2))
    _two_pass_layer_norm_kernel[(x.shape[0],)](x, w, b, y2, mean2, rstd2, hidden, eps,
                                               BLOCK_N=triton.next_power_of_2(hidden))
    for got, want in ((mean, mean2), (rstd, rstd2), (y, y2)):
        assert torch.equal(bits(got), bits(want))
