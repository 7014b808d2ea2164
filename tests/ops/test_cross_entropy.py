import pytest
import torch
import torch.nn.functional as F

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import cross_entropy as op
from speedlight.verify.harness import LaunchCounter
from tests.conftest import gpu_target, needs_gpu
from tests.helpers import (assert_rejected, assert_verified, case_maker, class_targets,
                           loss_and_grad, seeded)

SPEC = op.SPEC


case = case_maker("cross_entropy", "tokens", "vocab")


@pytest.mark.parametrize("sms", [pytest.param(4, id="4-sms"), pytest.param(132, id="132-sms")])
@pytest.mark.parametrize("tokens,vocab,flags", [
    pytest.param(37, 128, {}, id="tokens37-vocab128-row-tiles"),
    pytest.param(37, 128, {"softcap": 30.0}, id="tokens37-vocab128-softcap"),
    pytest.param(5, 40000, {"ignore": "some"}, id="tokens5-vocab40000-looped-or-split"),
    pytest.param(1, 20011, {"softcap": 30.0, "zloss": 0.01}, id="tokens1-vocab20011-split"),
])
def test_gpu_sized_launches_match_float64(sms, tokens, vocab, flags, device):
    """The block sizes and plans a GPU gets (launch.for_target), verified under the
    interpreter: with 4 SMs five rows take the looped kernel, with 132 the split pair."""
    from speedlight.launch import for_target

    with for_target(gpu_target(sms)):
        assert_verified(SPEC, case(tokens, vocab, torch.bfloat16, **flags), device)


@pytest.mark.parametrize("tokens,vocab,flags", [
    # one row per tile: 16 programs of 8 warps on 4 SMs, 36 rows of a shifted view (the
    # row index divided by seq), a column mask, NaN and inf logits
    pytest.param(36, 4000, {"shifted": True, "smoothing": 0.1, "ignore": "some",
                            "nonfinite": True}, id="rows-of-4000"),
    # tiles of 32 rows, 10 over 8 programs, the last partial; what keeps more live
    pytest.param(300, 128, {"weight": True, "extras": True, "zloss": 0.01, "softcap": 30.0},
                 id="tiles-of-32-rows"),
])
def test_persistent_programs_walking_several_tiles_match_float64(tokens, vocab, flags, device):
    """The fused forward's persistent loop at a GPU's sizing (fewer programs than tiles)."""
    from speedlight.launch import for_target

    with for_target(gpu_target(4)):
        assert_verified(SPEC, case(tokens, vocab, torch.bfloat16, **flags), device)


def test_all_ignored_mean_is_zero_with_zero_gradient(device):
    """Deliberately unlike torch (NaN): no counted token gives loss 0 and gradient 0."""
    logits = seeded((5, 300), device=device)
    target = torch.full((5,), -100, dtype=torch.long, device=device)
    for kwargs in ({}, {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 20.0}):
        loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, **kwargs)
        assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g))
    assert torch.isnan(F.cross_entropy(logits, target))  # what torch does instead
    assert_verified(SPEC, case(6, 1000, ignore="all"), device)


def test_without_smoothing_each_token_loss_is_minus_log_softmax_at_target(device):
    logits = seeded((23, 517), device=device, scale=3.0)
    target = class_targets((23,), 517, device)
    loss = speedlight.cross_entropy(logits, target, reduction="none")
    expected = -torch.log_softmax(logits.double(), -1).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [pytest.param({}, id="plain"),
                                    pytest.param({"label_smoothing": 0.3}, id="smoothing")])
def test_adding_a_constant_to_a_row_changes_nothing(kwargs, device):
    # logits on a 2^-10 grid, so that x + 16 is exact in fp32 and only the kernel rounds
    logits = torch.round(seeded((9, 2000), device=device) * 1024) / 1024
    shift = torch.tensor([16.0, -8.0, 0.0, 4.0, 16.0, 2.0, -16.0, 8.0, 1.0], device=device)
    target = class_targets((9,), 2000, device)
    loss1, g1 = loss_and_grad(speedlight.cross_entropy, logits, target, reduction="none", **kwargs)
    loss2, g2 = loss_and_grad(speedlight.cross_entropy, logits + shift[:, None], target,
                        reduction="none", **kwargs)
    torch.testing.assert_close(loss1, loss2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("vocab", [2, 300, 20011])
def test_confident_target_keeps_its_small_gradient(vocab, device):
    """p_t - 1 cancels in fp32 when p_t ~ 1; the kernel takes it as -(sum of the other
    exps) / (sum of all), so the target's gradient keeps its relative precision."""
    logits = seeded((4, vocab), device=device)
    target = class_targets((4,), vocab, device)
    logits[torch.arange(4), target] = torch.tensor([20.0, 24.0, 28.0, 22.0], device=device)
    _, g = loss_and_grad(speedlight.cross_entropy, logits, target, reduction="sum")
    _, g64 = loss_and_grad(F.cross_entropy, logits.double(), target, reduction="sum")
    at = torch.arange(4), target
    # g_t = p_t - 1 = -sum_{j != t} p_j: from float64's non-target entries, since float64's
    # own p_t - 1 cancels too at these confidences
    expected = -(g64.sum(-1) - g64[at])
    assert (expected > -1e-3).all()  # confident: p_t > 0.999
    torch.testing.assert_close(g[at].double(), expected, rtol=1e-5, atol=0.0)


def test_z_loss_adds_z_times_logsumexp_squared_per_token(device):
    logits = seeded((11, 700), device=device, scale=2.0)
    target = class_targets((11,), 700, device)
    target[3] = -100
    base = speedlight.cross_entropy(logits, target, reduction="none")
    with_z = speedlight.cross_entropy(logits, target, reduction="none", z_loss=0.05)
    lse = torch.logsumexp(logits.double(), -1)
    expected = torch.where(target != -100, 0.05 * lse ** 2, 0.0)
    torch.testing.assert_close((with_z - base).double(), expected, rtol=1e-5, atol=1e-5)


def test_softcap_is_tanh_before_the_loss(device):
    logits = seeded((7, 900), device=device, scale=40.0)
    target = class_targets((7,), 900, device)
    loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, softcap=30.0)
    ref, g_ref = loss_and_grad(lambda x, t: F.cross_entropy(30.0 * torch.tanh(x.double() / 30.0), t),
                         logits, target)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g.double(), g_ref.double(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index", [pytest.param(-100, id="ignore-100"),
                                          pytest.param(3, id="ignore-class3")])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.25])
def test_matches_torch_functional(reduction, ignore_index, label_smoothing, device):
    logits = seeded((40, 97), device=device, scale=2.0)
    target = class_targets((40,), 97, device)
    target[::5] = ignore_index
    target[1::7] = 3
    kwargs = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    upstream = seeded((40,) if reduction == "none" else (), device=device, seed=3)
    loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, upstream=upstream, **kwargs)
    ref, g_ref = loss_and_grad(F.cross_entropy, logits, target, upstream=upstream, **kwargs)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [pytest.param(torch.float16, id="fp16"),
                                   pytest.param(torch.bfloat16, id="bf16")])
def test_half_logits_match_torch_on_upcast_logits(dtype, device):
    """fp32 arithmetic whatever the dtype: as close to torch on float32 logits as one
    rounding of the result to the half dtype allows."""
    logits = seeded((30, 4099), dtype=dtype, device=device, scale=3.0)
    target = class_targets((30,), 4099, device)
    loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, reduction="none")
    ref, g_ref = loss_and_grad(lambda x, t: F.cross_entropy(x.float(), t, reduction="none"),
                         logits, target)
    assert loss.dtype == dtype and g.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(loss.float(), ref.float(), rtol=eps, atol=0.0)
    torch.testing.assert_close(g.float(), g_ref.float(), rtol=eps, atol=1e-7)


def test_leading_dims_int32_targets_and_views(device):
    base = seeded((2, 6, 300), device=device)
    logits = base[:, :-1]  # Hugging Face's shift: [2, 5, 300], not viewable as [10, 300]
    target = class_targets((2, 5), 300, device).to(torch.int32)
    loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, reduction="none")
    ref, g_ref = loss_and_grad(lambda x, t: F.cross_entropy(x.reshape(-1, 300), t.reshape(-1).long(),
                                                      reduction="none").reshape(2, 5),
                         logits, target)
    assert loss.shape == (2, 5)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-7)
    single = speedlight.cross_entropy(logits[0, 0], target[0, 0])  # unbatched: [vocab], []
    torch.testing.assert_close(single, ref[0, 0], rtol=1e-5, atol=1e-6)


def test_no_gradient_wanted_writes_none(device):
    logits = seeded((4, 300), device=device)
    target = class_targets((4,), 300, device)
    loss, dlogits, _, _ = op.cross_entropy_fwd(logits, target, compute_grad=False)
    assert dlogits is None
    with torch.no_grad():
        counter = LaunchCounter()
        with counter.active():
            no_grad = speedlight.cross_entropy(logits.requires_grad_(), target)
    assert counter.count == 1 and not no_grad.requires_grad
    torch.testing.assert_close(no_grad, loss)


# --- the in-place gradient ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"),
                                   pytest.param(torch.bfloat16, id="bf16")])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("layout", ["contiguous", "shifted", "looped", "split"])
def test_inplace_gradient_equals_out_of_place(dtype, reduction, layout, device):
    vocab = 20011 if layout in ("looped", "split") else 500
    lead = (1, 1) if layout == "split" else (2, 4)
    base = seeded(lead + (vocab,), dtype=dtype, device=device, scale=2.0)
    w = seeded((vocab,), dtype=dtype, device=device, seed=1).requires_grad_()
    target = class_targets((2, 3) if layout == "shifted" else lead, vocab, device)
    if layout != "split":  # (one token there)
        target[0, 1] = -100
    upstream = seeded(target.shape if reduction == "none" else (), dtype=dtype, device=device,
                      seed=2)

    def run(inplace):
        logits = base * w  # a non-leaf, as an lm_head output is
        if layout == "shifted":
            logits = logits[:, :-1]
        loss = speedlight.cross_entropy(logits, target, reduction=reduction, softcap=30.0,
                                        z_loss=1e-3, inplace_backward=inplace)
        (gw,) = torch.autograd.grad(loss, w, upstream)
        return loss.detach(), gw, logits.detach()

    loss_a, gw_a, logits_a = run(False)
    loss_b, gw_b, logits_b = run(True)
    assert torch.equal(loss_a, loss_b)
    torch.testing.assert_close(gw_a, gw_b, rtol=1e-6 if dtype == torch.float32 else 1e-2,
                               atol=1e-6)
    assert not torch.equal(logits_a, logits_b)  # overwritten with the gradient


def test_inplace_overwrites_logits_with_their_gradient(device):
    x = seeded((6, 300), device=device).requires_grad_()
    target = class_targets((6,), 300, device)
    logits = x * 1.0
    loss = speedlight.cross_entropy(logits, target, inplace_backward=True)
    (gx,) = torch.autograd.grad(loss, x)
    _, g_ref = loss_and_grad(F.cross_entropy, x, target)
    torch.testing.assert_close(gx, g_ref, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(logits, g_ref, rtol=1e-5, atol=1e-7)  # logits now hold it


def test_inplace_is_refused_where_logits_are_needed_elsewhere(device):
    x = seeded((6, 300), device=device).requires_grad_()
    target = class_targets((6,), 300, device)
    counter = LaunchCounter()
    with counter.active(), pytest.raises(ValueError, match="inplace_backward=True overwrites"):
        speedlight.cross_entropy(x, target, inplace_backward=True)  # a leaf
    assert counter.count == 0
    logits = torch.tanh(x)  # tanh saves its output for its backward
    loss = speedlight.cross_entropy(logits, target, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with torch.no_grad():  # no gradient wanted: nothing is overwritten
        y = x * 1.0
        before = y.clone()
        speedlight.cross_entropy(y, target, inplace_backward=True)
    assert torch.equal(y, before)


# --- torch.compile, modules ----------------------------------------------------------------

def test_torch_compile_fullgraph_inplace(device):
    torch._dynamo.reset()

    def lm_loss(h, w, target):
        return speedlight.cross_entropy(h @ w.T, target, reduction="sum", inplace_backward=True)

    compiled = torch.compile(lm_loss, fullgraph=True, backend="aot_eager")
    h = seeded((10, 32), device=device).requires_grad_()
    w = seeded((300, 32), device=device, seed=1).requires_grad_()
    target = class_targets((10,), 300, device)
    gh, gw = torch.autograd.grad(compiled(h, w, target), (h, w))
    gh_ref, gw_ref = torch.autograd.grad(F.cross_entropy(h @ w.T, target, reduction="sum"),
                                         (h, w))
    torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
def test_module_matches_torch(device):
    logits = seeded((3, 50, 4), device=device)  # torch's [N, C, d]: classes at dim 1
    target = class_targets((3, 4), 50, device)
    target[0, 0] = 7
    for kwargs in ({}, {"reduction": "none", "ignore_index": 7}, {"label_smoothing": 0.1},
                   {"size_average": False}):
        ours, theirs = snn.CrossEntropyLoss(**kwargs), torch.nn.CrossEntropyLoss(**kwargs)
        assert isinstance(ours, torch.nn.CrossEntropyLoss)
        assert ours.reduction == theirs.reduction
        loss, g = loss_and_grad(ours, logits, target)
        ref, g_ref = loss_and_grad(theirs, logits, target)
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-7)
    assert set(snn.CrossEntropyLoss().state_dict()) == set(torch.nn.CrossEntropyLoss().state_dict())
    capped = snn.CrossEntropyLoss(z_loss=1e-3, softcap=30.0)
    assert "z_loss=0.001" in repr(capped) and "softcap=30.0" in repr(capped)
    torch.testing.assert_close(capped(logits[:, :, 0], target[:, 0]),
                               reference.cross_entropy(logits[:, :, 0], target[:, 0],
                                                       z_loss=1e-3, softcap=30.0))


def test_module_takes_class_weights_as_torch_does(device):
    logits = seeded((3, 50, 4), device=device)
    target = class_targets((3, 4), 50, device)
    w = seeded((50,), device=device, seed=4).abs()
    ours = snn.CrossEntropyLoss(weight=w, label_smoothing=0.1)
    theirs = torch.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight"}
    loss, g = loss_and_grad(ours, logits, target)
    ref, g_ref = loss_and_grad(theirs, logits, target)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-7)


def test_module_rejects_what_it_cannot_do():
    with pytest.raises(ValueError, match="softcap"):
        snn.CrossEntropyLoss(softcap=0.0)


# --- bad and empty input, targets out of range ---------------------------------------------

def _ok(d, **kw):
    return dict(logits=torch.ones(4, 8, device=d), target=torch.zeros(4, dtype=torch.long, device=d)) | kw


@pytest.mark.parametrize("kwargs,error,match", [
    (lambda d: _ok(d, logits=torch.ones(4, 8, dtype=torch.int64, device=d)), TypeError,
     "logits must be a float32, float16 or bfloat16 tensor.*int64"),
    (lambda d: _ok(d, logits=[[1.0, 2.0]]), TypeError, "logits must be a torch.Tensor"),
    (lambda d: _ok(d, target=torch.zeros(4, device=d)), TypeError,
     "target must be an integer tensor.*float32.*soft"),
    (lambda d: _ok(d, target=torch.zeros(4, 1, dtype=torch.long, device=d)), ValueError,
     r"target must have shape \(4,\).*got shape \(4, 1\)"),
    (lambda d: _ok(d, logits=torch.ones(4, 0, device=d)), ValueError, "at least one class"),
    (lambda d: _ok(d, reduction="avg"), ValueError, "reduction must be one of.*'avg'"),
    (lambda d: _ok(d, label_smoothing=1.5), ValueError, r"label_smoothing must be a number in \[0, 1\]"),
    (lambda d: _ok(d, label_smoothing=-0.1), ValueError, "label_smoothing"),
    (lambda d: _ok(d, z_loss=-1e-4), ValueError, "z_loss must be a finite number >= 0"),
    (lambda d: _ok(d, softcap=0.0), ValueError, "softcap must be None or a finite number > 0"),
    (lambda d: _ok(d, softcap=-30.0), ValueError, "softcap"),
    (lambda d: _ok(d, ignore_index=1.5), TypeError, "ignore_index must be an int"),
    (lambda d: _ok(d, weight=torch.ones(7, device=d)), ValueError,
     r"weight must have shape \(8,\).*got shape \(7,\)"),
    (lambda d: _ok(d, weight=torch.ones(8, dtype=torch.long, device=d)), TypeError,
     "weight must be None or a floating-point tensor.*int64"),
    (lambda d: _ok(d, weight=[1.0] * 8), TypeError, "weight must be None.*list"),
    (lambda d: _ok(d, ignore_index=2**63), ValueError,
     r"ignore_index must fit int64 \(the targets' dtype\), got 9223372036854775808"),
    (lambda d: _ok(d, label_smoothing=float("nan")), ValueError, "label_smoothing"),
    (lambda d: _ok(d, target=torch.tensor([0, 8, 1, -100], device=d)), ValueError,
     r"outside \[0, 8\).*ignore_index=-100; the first is target\[1\] = 8"),
    (lambda d: _ok(d, target=torch.tensor([0, 1, -1, 2], device=d)), ValueError,
     r"target\[2\] = -1"),
])
def test_bad_input_is_named_and_launches_nothing(kwargs, error, match, device):
    assert_rejected(lambda: speedlight.cross_entropy(**kwargs(device)), error, match)


def test_unchecked_out_of_range_target_gives_nan_row_and_reads_nothing_outside(device):
    logits = seeded((4, 300), device=device)
    target = torch.tensor([5, 300, -7, -100], device=device)
    loss, dlogits, _, _ = op.cross_entropy_fwd(logits, target, reduction="none",
                                               check_target=False)
    assert torch.isnan(loss[1:3]).all() and torch.isnan(dlogits[1:3]).all()
    assert loss[3].item() == 0.0 and torch.equal(dlogits[3], torch.zeros(300, device=device))
    ref, g_ref = loss_and_grad(F.cross_entropy, logits[:1], target[:1], reduction="none")
    torch.testing.assert_close(loss[:1], ref)
    torch.testing.assert_close(dlogits[:1], g_ref)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_empty_input_launches_nothing(reduction, device):
    logits = torch.empty(0, 64, device=device, requires_grad=True)
    target = torch.empty(0, dtype=torch.long, device=device)
    counter = LaunchCounter()
    with counter.active():
        loss = speedlight.cross_entropy(logits, target, reduction=reduction)
        (g,) = torch.autograd.grad(loss.sum(), logits)
    ref = F.cross_entropy(logits, target, reduction=reduction)
    assert counter.count == 0 and loss.shape == ref.shape and g.shape == (0, 64)
    if reduction != "none":
        assert loss.item() == 0.0  # torch: 0 for sum, NaN for mean
    empty3 = speedlight.cross_entropy(torch.empty(2, 0, 10, device=device),
                                      torch.empty(2, 0, dtype=torch.long, device=device),
                                      reduction="none")
    assert empty3.shape == (2, 0)


def test_cost_counts_the_gradient_in_the_forward():
    c = case(512, 32000, torch.bfloat16)
    fwd, bwd = SPEC.cost(c, "fwd"), SPEC.cost(c, "bwd")
    elems = 512 * 32000
    assert fwd.bytes == 2 * elems * 2 + 8 * 512 + 2  # logits in, dlogits out, target, loss
    assert bwd.bytes == 2 * elems * 2 + 2  # dlogits in, grad out, grad_output


@needs_gpu("the CUDA target check (a reduction and one host sync) exists only on a GPU")
def test_cuda_target_check_can_be_turned_off(device):
    logits = torch.randn(4, 300, device=device)
    target = torch.tensor([5, 300, 2, -100], device=device)
    with pytest.raises(ValueError, match="target\\[1\\] = 300"):
        speedlight.cross_entropy(logits, target)
    loss = speedlight.cross_entropy(logits, target, reduction="none", check_target=False)
    assert torch.isnan(loss[1]) and torch.isfinite(loss[[0, 2, 3]]).all()
