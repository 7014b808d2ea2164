"""cross_entropy's options: class weights (torch's semantics, with label smoothing and
z-loss), and the z-loss, token accuracy and predicted tokens returned from the same pass.
The loss itself, the in-place gradient and bad input are in test_cross_entropy.py."""

import pytest
import torch
import torch.nn.functional as F

import speedlight
from speedlight import reference
from speedlight.ops import cross_entropy as op
from speedlight.verify.harness import LaunchCounter
from tests.helpers import class_targets, loss_and_grad, seeded


# --- class weights ---------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("vocab", [pytest.param(97, id="vocab97"),
                                   pytest.param(20011, id="vocab20011-looped")])
def test_class_weights_match_torch_functional(reduction, label_smoothing, vocab, device):
    """torch's weighted loss, including how it combines weight and label smoothing (the
    smoothing term weighs each class, a mean divides by the sum of the targets' weights)."""
    tokens = 12 if vocab < 1000 else 3
    logits = seeded((tokens, vocab), device=device, scale=2.0)
    target = class_targets((tokens,), vocab, device)
    target[::5] = -100
    w = seeded((vocab,), device=device, seed=5).abs()
    kwargs = dict(reduction=reduction, label_smoothing=label_smoothing, weight=w)
    upstream = seeded((tokens,) if reduction == "none" else (), device=device, seed=3)
    loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, upstream=upstream, **kwargs)
    ref, g_ref = loss_and_grad(F.cross_entropy, logits.double(), target, upstream=upstream.double(),
                         **dict(kwargs, weight=w.double()))
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-7)


def test_weighted_mean_over_zero_counted_weight_is_zero(device):
    """Deliberately unlike torch (NaN/inf): counted targets whose weights sum to 0 give a
    mean of 0 and a zero gradient, even with smoothing (which weighs other classes)."""
    logits = seeded((5, 30), device=device)
    target = torch.tensor([1, 2, -100, 1, 2], device=device)
    w = torch.ones(30, device=device)
    w[1] = w[2] = 0.0
    for kwargs in ({}, {"label_smoothing": 0.1, "z_loss": 1e-3}):
        loss, g = loss_and_grad(speedlight.cross_entropy, logits, target, weight=w, **kwargs)
        assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g))
    assert not torch.isfinite(F.cross_entropy(logits, target, weight=w, label_smoothing=0.1))


def test_weighted_z_loss_is_weighted_like_the_target_term(device):
    logits = seeded((9, 40), device=device, scale=2.0)
    target = class_targets((9,), 40, device)
    w = seeded((40,), device=device, seed=6).abs()
    base = speedlight.cross_entropy(logits, target, weight=w, reduction="none")
    with_z = speedlight.cross_entropy(logits, target, weight=w, reduction="none", z_loss=0.05)
    lse = torch.logsumexp(logits.double(), -1)
    torch.testing.assert_close((with_z - base).double(), 0.05 * w[target].double() * lse ** 2,
                               rtol=1e-5, atol=1e-6)


# --- z-loss, accuracy and predicted tokens from the same pass ------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("vocab", [pytest.param(300, id="vocab300"),
                                   pytest.param(20011, id="vocab20011-looped")])
def test_extras_in_one_launch(reduction, vocab, device):
    tokens = 8 if vocab < 1000 else 1  # one long row: the split kernels give way to the loop
    logits = seeded((tokens, vocab), device=device, scale=2.0)
    target = class_targets((tokens,), vocab, device)
    target[0] = -100
    if tokens > 1:
        target[1] = int(logits[1].argmax())  # at least one right prediction
    counter = LaunchCounter()
    with counter.active():
        out = speedlight.cross_entropy(logits, target, reduction=reduction, z_loss=0.01,
                                       return_z_loss=True, return_token_accuracy=True,
                                       return_predicted_tokens=True)
    assert counter.count == 1 and isinstance(out, op.CrossEntropyOutput)
    ref = reference.cross_entropy(logits.double(), target, reduction=reduction, z_loss=0.01,
                                  return_z_loss=True, return_token_accuracy=True,
                                  return_predicted_tokens=True)
    torch.testing.assert_close(out.loss.double(), ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.z_loss.double(), ref[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.token_accuracy, ref[2])
    assert torch.equal(out.predicted_tokens, logits.argmax(-1))
    plain = speedlight.cross_entropy(logits, target, reduction=reduction, z_loss=0.01)
    assert torch.equal(out.loss, plain)


def test_only_the_asked_extras_are_returned(device):
    logits = seeded((4, 30), device=device)
    target = class_targets((4,), 30, device)
    out = speedlight.cross_entropy(logits, target, return_token_accuracy=True)
    assert out.z_loss is None and out.predicted_tokens is None and out.token_accuracy.dim() == 0
    assert isinstance(speedlight.cross_entropy(logits, target), torch.Tensor)


@pytest.mark.parametrize("vocab", [pytest.param(50, id="vocab50"),
                                   pytest.param(20011, id="vocab20011-looped")])
def test_predicted_tokens_break_ties_and_nan_as_torch_argmax(vocab, device):
    logits = torch.zeros((5, vocab), device=device)
    logits[0, [3, 7, vocab - 1]] = 2.0                 # a tie: the first index wins
    logits[1, [vocab - 1, 5]] = 1.0                    # a tie across blocks of the loop
    logits[2] = float("-inf")                          # all -inf: index 0
    logits[3, [4, vocab - 2]] = float("nan")           # NaN counts as the largest
    logits[3, 1] = float("inf")
    logits[4, vocab - 1] = float("inf")
    target = torch.tensor([3, 5, 0, 4, vocab - 1], device=device)
    out = speedlight.cross_entropy(logits, target, reduction="none",
                                   return_predicted_tokens=True, return_token_accuracy=True)
    expected = torch.argmax(logits, -1)
    assert expected.tolist() == [3, 5, 0, 4, vocab - 1]
    assert torch.equal(out.predicted_tokens, expected)
    assert out.token_accuracy.tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_extras_with_the_inplace_gradient_and_compile(device):
    torch._dynamo.reset()
    h = seeded((10, 32), device=device).requires_grad_()
    w = seeded((300, 32), device=device, seed=1).requires_grad_()
    target = class_targets((10,), 300, device)

    def lm_loss(h, w, target, inplace):
        out = speedlight.cross_entropy(h @ w.T, target, z_loss=1e-3, inplace_backward=inplace,
                                       return_z_loss=True, return_token_accuracy=True)
        return out.loss, out.z_loss, out.token_accuracy

    ref = lm_loss(h, w, target, False)
    gh_ref = torch.autograd.grad(ref[0], h)[0]
    compiled = torch.compile(lm_loss, fullgraph=True, backend="aot_eager")
    for fn, inplace in ((lm_loss, True), (compiled, False)):
        loss, z, acc = fn(h, w, target, inplace)
        assert not z.requires_grad and not acc.requires_grad
        (gh,) = torch.autograd.grad(loss, h)
        torch.testing.assert_close((loss, z, acc), ref)
        torch.testing.assert_close(gh, gh_ref, rtol=1e-5, atol=1e-6)
