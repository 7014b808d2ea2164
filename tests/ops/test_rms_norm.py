import contextlib

import pytest
import torch
import triton
import triton.language as tl

import speedlight
import speedlight.nn as snn
from speedlight import launch, reference
from speedlight.kernels.norm_scale import _rms_rstd_scaled
from speedlight.ops import rms_norm as op
from tests.conftest import gpu_target
from tests.helpers import (EXTREME_SCALES, RESCUES, FreshGradient, assert_module_matches,
                           assert_rejected, assert_verified, bits, case_maker, relative_error,
                           rescue_rows, seeded)

SPEC = op.SPEC


case = case_maker("rms_norm", "rows", "hidden")


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
    assert_module_matches(ours, ref, seeded((3, 11, 384), device=device))
    assert set(ours.state_dict()) == set(ref.state_dict()) == {"weight"}
    assert isinstance(ours, torch.nn.RMSNorm)


def test_module_default_eps_and_multidim_shape(device):
    ref = torch.nn.RMSNorm((4, 32)).to(device)
    x = seeded((5, 4, 32), device=device)
    assert_module_matches(snn.RMSNorm((4, 32)).to(device), ref, x)
    no_affine = snn.RMSNorm(32, elementwise_affine=False).to(device)
    torch.testing.assert_close(no_affine(x), torch.nn.RMSNorm(32, elementwise_affine=False)(x),
                               rtol=1e-5, atol=1e-5)


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
    assert_rejected(lambda: call(device), error, match)


def test_dw_reduced_over_many_programs(device):
    """More rows than programs: every program's partial dw must reach the sum."""
    x = seeded((301, 64), device=device).requires_grad_()
    w = seeded((64,), device=device, seed=9).requires_grad_()
    g = seeded((301, 64), device=device, seed=4)
    (gw,) = torch.autograd.grad(speedlight.rms_norm(x, w), (w,), g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    (gw64,) = torch.autograd.grad(reference.rms_norm(x64, w64), (w64,), g.double())
    torch.testing.assert_close(gw.double(), gw64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sms", [pytest.param(1, id="1-sm"), pytest.param(132, id="132-sms")])
@pytest.mark.parametrize("rows,hidden", [
    pytest.param(9, 4096, id="rows9-hidden4096"),  # 2-row tiles; on 1 SM, 2 programs loop over 5
    pytest.param(37, 768, id="rows37-hidden768"),
    pytest.param(3, 20011, id="rows3-hidden20011-looped"),
])
def test_gpu_sized_launches_match_float64(sms, rows, hidden, device):
    """The block sizes and persistent grids a GPU gets (launch.for_target), verified under the
    interpreter: with one SM the persistent programs walk several tiles each."""
    from speedlight.launch import for_target

    with for_target(gpu_target(sms)):
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


# --- in_place: the backward writes dx over dy ---------------------------------------------

def _grads_in_place(fn, inputs, dy, in_place):
    """(gradients of inputs, where y's gradient lay) of fn(*inputs) under dy, y's gradient
    a fresh tensor nobody else holds."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    FreshGradient.addresses.clear()
    grads = torch.autograd.grad(FreshGradient.apply(fn(*leaves, in_place=in_place)), leaves,
                                dy.clone())
    return grads, FreshGradient.addresses[0]


@pytest.mark.parametrize("hidden", [pytest.param(384, id="hidden384"),
                                    pytest.param(20001, id="hidden20001-looped")])
def test_in_place_writes_dx_over_dy_and_matches(hidden, device):
    """dx is dy's own storage when nothing else holds dy, and every gradient equals the
    out-of-place backward's."""
    x = seeded((3, hidden), device=device)
    w = seeded((hidden,), device=device, seed=1)
    dy = seeded((3, hidden), device=device, seed=2)
    (dx, dw), written = _grads_in_place(speedlight.rms_norm, (x, w), dy, True)
    (dx0, dw0), elsewhere = _grads_in_place(speedlight.rms_norm, (x, w), dy, False)
    assert dx.data_ptr() == written and dx0.data_ptr() != elsewhere
    assert torch.equal(dx, dx0) and torch.equal(dw, dw0)


def _norm(op, x, w, in_place):
    if op == "rms_norm":
        return speedlight.rms_norm(x, w, in_place=in_place)
    if op == "add_rms_norm":
        return speedlight.add_rms_norm(x, x.detach() * 0.5, w, in_place=in_place)[0]
    norm = snn.RMSNorm(x.shape[-1], in_place=in_place).to(x.device)  # returns a view of y
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x), norm.weight


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "module"])
@pytest.mark.parametrize("how", ["root", "hook", "retain_grad", "hook-on-view"])
def test_in_place_never_overwrites_a_gradient_someone_else_reads(op, how, device):
    """With in_place=True, the caller's gradient when y is the root of backward, what a
    hook on y (or on a view of it) keeps, and y.grad after retain_grad() all hold the true
    gradient of y afterwards; the gradients are the out-of-place ones."""
    x = seeded((3, 64), device=device)
    w = seeded((64,), device=device, seed=1)
    g = seeded((3, 64), device=device, seed=2)
    grads = {}
    for in_place in (True, False):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        y = _norm(op, *leaves, in_place)
        if op == "module":
            y, leaves[1] = y
        out = y.view(-1) if how == "hook-on-view" else y
        seen = []
        if how in ("hook", "hook-on-view"):
            out.register_hook(seen.append)
        if how == "retain_grad":
            out.retain_grad()
        upstream = g.clone().view(out.shape)
        root = out if how == "root" else FreshGradient.apply(out)
        grads[in_place] = torch.autograd.grad(root, leaves, upstream)
        seen += [upstream] if how == "root" else [out.grad] if how == "retain_grad" else []
        assert len(seen) == 1 and torch.equal(seen[0].reshape(g.shape), g), \
            f"{how}, in_place={in_place}: y's gradient was overwritten"
    for got, want in zip(grads[True], grads[False]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_in_place_with_a_broadcast_upstream_gradient(device):
    """y.sum() hands a stride-0 gradient: it is made dense before being written over."""
    x = seeded((5, 64), device=device).requires_grad_()
    (dx,) = torch.autograd.grad(speedlight.rms_norm(x, in_place=True).sum(), (x,))
    (dx0,) = torch.autograd.grad(speedlight.rms_norm(x).sum(), (x,))
    assert torch.equal(dx, dx0)


def test_in_place_module_and_bad_flag(device):
    norm = snn.RMSNorm(64, in_place=True).to(device)
    assert "in_place=True" in repr(norm)
    x = seeded((3, 64), device=device).requires_grad_()
    (dx,) = torch.autograd.grad(norm(x), (x,), seeded((3, 64), device=device, seed=3))
    (dx0,) = torch.autograd.grad(torch.nn.RMSNorm(64).to(device)(x), (x,),
                                 seeded((3, 64), device=device, seed=3))
    torch.testing.assert_close(dx, dx0, rtol=1e-5, atol=1e-5)
    assert_rejected(lambda: speedlight.rms_norm(x, in_place=1), TypeError, "in_place must be a bool")


# --- one reduction on the common path, the scaled sum only where a row needs it ----------

@triton.jit
def _two_pass_rms_norm_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps,
                              BLOCK_N: tl.constexpr):
    """The scaled formula on every row, one row per program: a max, then the sum of
    squares of x / p (norm_scale._rms_rstd_scaled), then y = x * rstd * w."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)[None, :]
    rstd = _rms_rstd_scaled(x, n_cols, eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + row * n_cols + offs[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask[None, :])
    tl.store(rstd_ptr + row + tl.arange(0, 1), rstd)


@pytest.mark.parametrize("kind,tiles", [
    *[pytest.param(k, t, id=f"gpu-tiles-{t}-rows-bf16-{k}") for t in (1, 16)
      for k in ("common", *RESCUES)],
    *[pytest.param(k, None, id=f"interpreter-tiles-fp32-{k}")
      for k in ("common", "underflow", "nan")]])
def test_one_reduction_matches_the_two_pass_formula_bit_for_bit(kind, tiles, device):
    """The forward takes the unscaled sum of squares (one reduction) and scales a row by a
    power of two near its largest |x| only when that sum leaves [2^-64, 2^64]: on rows that
    need it and rows that do not, in tiles of one row and of several (rows past the end
    among them), y and rstd are the two-pass scaled formula's bit for bit."""
    hidden, dtype = 300, torch.float32 if tiles is None else torch.bfloat16
    eps = 0.0 if kind == "underflow" else 1e-6  # eps would hide the underflow
    x = rescue_rows(kind, hidden, dtype, device)
    sum_sq = x.double().square().sum(1)
    common = (sum_sq >= 2.0 ** -64) & (sum_sq <= 2.0 ** 64)
    assert common.sum() == 12 - (kind != "common")  # the inputs are what they claim
    w = (1.0 + seeded((hidden,), device=device, seed=1, scale=0.2)).to(dtype)
    with contextlib.ExitStack() as sized:
        if tiles is not None:  # the tiles of a GPU's launch: 512 values (1 row) or 8192
            sized.enter_context(launch.for_target(gpu_target(132)))
            sized.enter_context(launch.forcing("rms_norm", {"tile": 512 * tiles,
                                                            "warps_per_sm": 32}))
        y, rstd = op.rms_norm_fwd(x, w, eps, 0.0)
    y2, rstd2 = torch.empty_like(x), torch.empty(x.shape[0], device=device)
    _two_pass_rms_norm_kernel[(x.shape[0],)](x, w, y2, rstd2, hidden, eps,
                                             BLOCK_N=triton.next_power_of_2(hidden))
    assert torch.equal(bits(rstd), bits(rstd2))
    assert torch.equal(bits(y), bits(y2))
