import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from tests.helpers import (DTYPES, EXTREME_SCALES, FreshGradient, assert_rejected,
                           relative_error, seeded)


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_the_unfused_block(dtype, device):
    """h is exactly x + residual in the dtype, and y is speedlight.rms_norm of that h."""
    x = seeded((7, 333), dtype, device)
    res = seeded((7, 333), dtype, device, seed=1, scale=4.0)
    w = seeded((333,), dtype, device, seed=2)
    y, h = speedlight.add_rms_norm(x, res, w, eps=1e-5)
    assert torch.equal(h, x + res)
    assert torch.equal(y, speedlight.rms_norm(x + res, w, eps=1e-5))


def test_gradient_reaches_x_and_residual_alike_without_aliasing(device):
    x = seeded((6, 200), device=device).requires_grad_()
    res = seeded((6, 200), device=device, seed=1).requires_grad_()
    w = seeded((200,), device=device, seed=2).requires_grad_()
    y, h = speedlight.add_rms_norm(x, res, w)
    (y.square().sum() + (h * 3.0).sum()).backward()
    assert torch.equal(x.grad, res.grad)
    assert x.grad.data_ptr() != res.grad.data_ptr()
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, res, w))
    y64, h64 = reference.add_rms_norm(x64, r64, w64)
    (y64.square().sum() + (h64 * 3.0).sum()).backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("used", ["y", "h"])
def test_gradient_when_only_one_output_is_used(used, device):
    x = seeded((5, 96), device=device).requires_grad_()
    res = seeded((5, 96), device=device, seed=1).requires_grad_()
    w = seeded((96,), device=device, seed=2).requires_grad_()
    g = seeded((5, 96), device=device, seed=3)
    out = dict(zip("yh", speedlight.add_rms_norm(x, res, w)))[used]
    gx, gw = torch.autograd.grad(out, (x, w), g, allow_unused=True)
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, res, w))
    out64 = dict(zip("yh", reference.add_rms_norm(x64, r64, w64)))[used]
    gx64, gw64 = torch.autograd.grad(out64, (x64, w64), g.double(), allow_unused=True)
    torch.testing.assert_close(gx.double(), gx64, rtol=1e-5, atol=1e-5)
    if used == "y":
        torch.testing.assert_close(gw.double(), gw64, rtol=1e-5, atol=1e-5)
    else:  # the norm took no gradient: weight's is zero or absent, never garbage
        assert gw is None or torch.equal(gw, torch.zeros_like(gw))


def test_module_loads_rms_norm_state_dict_and_matches_hf(device):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    hf = LlamaRMSNorm(384, eps=1e-5).to(device)
    with torch.no_grad():
        hf.weight.copy_(seeded((384,), device=device, seed=5))
    ours = snn.AddRMSNorm(384, eps=1e-5).to(device)
    assert isinstance(ours, torch.nn.RMSNorm)
    ours.load_state_dict(hf.state_dict())
    assert set(ours.state_dict()) == set(torch.nn.RMSNorm(384).state_dict()) == {"weight"}
    x = seeded((3, 11, 384), device=device)
    res = seeded((3, 11, 384), device=device, seed=1)
    y, h = ours(x, res)
    torch.testing.assert_close(h, x + res, rtol=0, atol=0)
    torch.testing.assert_close(y, hf(x + res), rtol=1e-5, atol=1e-5)


def test_gemma_offset_module_matches_hf(device):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    hf = GemmaRMSNorm(256, eps=1e-6).to(device)
    ours = snn.AddRMSNorm(256, eps=1e-6, offset=1.0).to(device)
    assert torch.equal(ours.weight, hf.weight)  # both start at 0: a scale of 1
    with torch.no_grad():
        hf.weight.copy_(seeded((256,), device=device, seed=6, scale=0.2))
    ours.load_state_dict(hf.state_dict())
    x = seeded((4, 256), torch.bfloat16, device)
    res = seeded((4, 256), torch.bfloat16, device, seed=1)
    y, _ = ours(x, res)
    torch.testing.assert_close(y.float(), hf(x + res).float(), rtol=1e-2, atol=1e-2)


def test_module_default_eps_and_multidim_shape(device):
    ours = snn.AddRMSNorm((4, 32)).to(device)
    ref = torch.nn.RMSNorm((4, 32)).to(device)
    x = seeded((5, 4, 32), device=device)
    res = seeded((5, 4, 32), device=device, seed=1)
    y, h = ours(x, res)
    assert h.shape == x.shape
    torch.testing.assert_close(y, ref(x + res), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, dtype=torch.int64, device=d),
                                       torch.ones(4, 8, device=d)),
     TypeError, "x must be a float32, float16 or bfloat16 tensor.*int64"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), torch.ones(4, 7, device=d)),
     ValueError, r"residual must have x's shape \(4, 8\) or one that broadcasts with it, "
                 r"got \(4, 7\)"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d),
                                       torch.ones(4, 8, dtype=torch.float16, device=d)),
     TypeError, "residual has dtype torch.float16 but x has torch.float32"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), torch.ones(4, 8, device=d),
                                       torch.ones(7, device=d)),
     ValueError, r"weight must have shape \(8,\)"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), torch.ones(4, 8, device=d),
                                       None, offset=1.0),
     ValueError, "offset=1.0 scales a weight"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), None), TypeError,
     "residual must be a torch.Tensor"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), torch.ones(4, 8, device=d),
                                       eps=-1.0), ValueError, "eps"),
    (lambda d: speedlight.add_rms_norm(torch.ones(4, 8, device=d), torch.ones(4, 8, device=d),
                                       eps=float("nan")), ValueError,
     "eps must be a finite non-negative number, got nan"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)


def test_dw_reduced_over_many_programs(device):
    x = seeded((301, 64), device=device).requires_grad_()
    res = seeded((301, 64), device=device, seed=1).requires_grad_()
    w = seeded((64,), device=device, seed=9).requires_grad_()
    g = seeded((301, 64), device=device, seed=4)
    (gw,) = torch.autograd.grad(speedlight.add_rms_norm(x, res, w)[0], (w,), g)
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, res, w))
    (gw64,) = torch.autograd.grad(reference.add_rms_norm(x64, r64, w64)[0], (w64,), g.double())
    # a lost partial would be off by O(1); 1e-4 leaves room for fp32 sums of 301 terms
    torch.testing.assert_close(gw.double(), gw64, rtol=1e-4, atol=1e-4)


def test_module_checks_the_residual_as_the_function_does(device):
    """Rows of different tokens must never be added: [2, 3, 16] + [3, 2, 16] is an error,
    as it is for the function, not a reshape of the residual."""
    norm = snn.AddRMSNorm(16).to(device)
    assert_rejected(lambda: norm(torch.ones(2, 3, 16, device=device),
                                 torch.ones(3, 2, 16, device=device)),
                    ValueError, r"residual must have x's shape \(2, 3, 16\).*got \(3, 2, 16\)")


@pytest.mark.parametrize("x_shape,res_shape", [
    pytest.param((4, 16), (1, 16), id="residual-row"),
    pytest.param((2, 3, 16), (3, 16), id="residual-lower-rank"),
    pytest.param((1, 16), (4, 16), id="x-row"),
])
def test_a_broadcastable_residual_broadcasts_as_torch_does(x_shape, res_shape, device):
    norm = snn.AddRMSNorm(16, eps=1e-6).to(device)
    ref = torch.nn.RMSNorm(16, eps=1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(seeded((16,), device=device, seed=2))
        ref.weight.copy_(norm.weight)
    x = seeded(x_shape, device=device).requires_grad_()
    res = seeded(res_shape, device=device, seed=1).requires_grad_()
    y, h = norm(x, res)
    x_ref, res_ref = (t.detach().clone().requires_grad_() for t in (x, res))
    h_ref = x_ref + res_ref
    y_ref = ref(h_ref)
    assert y.shape == h.shape == h_ref.shape
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    g = seeded(h_ref.shape, device=device, seed=3)
    gx, gres = torch.autograd.grad((y * g).sum() + h.sum(), (x, res))
    gx_ref, gres_ref = torch.autograd.grad((y_ref * g).sum() + h_ref.sum(), (x_ref, res_ref))
    assert gx.shape == x.shape and gres.shape == res.shape
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gres, gres_ref, rtol=1e-5, atol=1e-5)


def test_module_without_a_residual_is_plain_rms_norm(device):
    """residual=None: no add; y = RMSNorm(x) and h is x itself (the residual stream
    starts at x)."""
    norm = snn.AddRMSNorm(16).to(device)
    x = seeded((4, 16), device=device)
    y, h = norm(x)
    assert h is x
    torch.testing.assert_close(y, torch.nn.RMSNorm(16).to(device)(x), rtol=1e-5, atol=1e-5)
    y2, _ = norm(x, None)
    assert torch.equal(y, y2)


def test_module_rejects_an_integer_input_by_name(device):
    with pytest.raises(TypeError, match="x must be a float32, float16 or bfloat16 tensor.*int32"):
        snn.AddRMSNorm(16).to(device)(torch.ones(4, 16, dtype=torch.int32, device=device),
                                      torch.ones(4, 16, dtype=torch.int32, device=device))


@pytest.mark.parametrize("hidden", [pytest.param(300, id="hidden300"),
                                    pytest.param(20011, id="hidden20011-looped")])
@pytest.mark.parametrize("scale,eps", EXTREME_SCALES[1:3])
def test_extreme_magnitudes_match_float64(hidden, scale, eps, device):
    """h^2 overflowing float32 does not zero y: RMSNorm's rescaled kernels with the
    residual switched on match float64 in y, h and every gradient."""
    x = seeded((3, hidden), device=device, scale=scale).requires_grad_()
    res = seeded((3, hidden), device=device, seed=3, scale=scale).requires_grad_()
    w = (1.0 + seeded((hidden,), device=device, seed=1, scale=0.2)).requires_grad_()
    g = seeded((3, hidden), device=device, seed=2)
    y, h = speedlight.add_rms_norm(x, res, w, eps=eps)
    grads = torch.autograd.grad((y * g).sum() + (h * g / scale).sum(), (x, res, w))
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, res, w))
    y64, h64 = reference.add_rms_norm(x64, r64, w64, eps=eps)
    grads64 = torch.autograd.grad((y64 * g).sum() + (h64 * g / scale).sum(), (x64, r64, w64))
    names = ("y", "h", "dx", "dres", "dw")
    for name, got, want in zip(names, (y, h, *grads), (y64, h64, *grads64)):
        assert torch.isfinite(got).all(), name
        assert relative_error(got, want) < 1e-5, name


@pytest.mark.parametrize("used", ["both", "y", "h"])
def test_in_place_writes_over_dy_never_dh(used, device):
    """The gradient of x and residual is written over y's gradient (a fresh one, as a
    linear layer hands it); h's (the residual stream's, shared with the next block's
    input) is only read; all equal out of place."""
    x = seeded((4, 300), device=device)
    res = seeded((4, 300), device=device, seed=1, scale=4.0)
    w = seeded((300,), device=device, seed=2)
    dy, dh = seeded((4, 300), device=device, seed=3), seeded((4, 300), device=device, seed=4)
    results = {}
    for in_place in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, res, w)]
        y, h = speedlight.add_rms_norm(*leaves, in_place=in_place)
        y = FreshGradient.apply(y)
        FreshGradient.addresses.clear()
        gy, gh = dy.clone(), dh.clone()
        outs, ups = {"both": ((y, h), (gy, gh)), "y": ((y,), (gy,)), "h": ((h,), (gh,))}[used]
        grads = torch.autograd.grad(outs, leaves, ups)
        results[in_place] = grads, list(FreshGradient.addresses), gh
    (g0, _, gh0), (g1, where_dy, gh1) = results[False], results[True]
    for a, b in zip(g0, g1):
        assert torch.equal(a, b)
    assert torch.equal(gh1, dh) and torch.equal(gh0, dh)  # dh never written
    if used != "h":
        assert g1[0].data_ptr() == where_dy[0]  # dx is dy's storage
