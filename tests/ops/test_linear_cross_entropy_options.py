"""linear_cross_entropy under torch.autocast (bf16, and fp16 with a loss scaler), and the
options it shares with cross_entropy (class weights, the extras) beyond the quick suite."""

import pytest
import torch
import torch.nn.functional as F

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import linear_cross_entropy as op
from speedlight.ops import linear_cross_entropy_chunks as chunks
from speedlight.ops.cross_entropy import CrossEntropyOutput
from speedlight.verify.compare import judge
from tests.helpers import case_maker, seeded
from tests.ops.test_linear_cross_entropy import SeeThrough, inputs

case = case_maker("linear_cross_entropy", "tokens", "hidden", "vocab")


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() if t is not None else None for t in tensors]


def _loss_and_grads(fn, h, w, t, b, scale: float):
    """fn's loss and the gradients of (loss * scale) / scale (a loss scaler's round trip)."""
    leaves = _leaves(h, w, b)
    loss = fn(leaves[0], leaves[1], t, leaves[2])
    wrt = [x for x in leaves if x is not None]
    grads = torch.autograd.grad(loss * scale, wrt)
    return loss.detach(), [g / scale for g in grads]


def _unpatched(h, w, t, b=None):
    return F.cross_entropy(F.linear(h, w, b), t)


@pytest.mark.parametrize("amp,hidden_dtype,tokens,vocab,spread,scale", [
    pytest.param(torch.bfloat16, torch.bfloat16, 64, 300, 1.0, 1.0,
                 id="bf16-bf16-hidden-fp32-head"),
    pytest.param(torch.bfloat16, torch.float32, 64, 300, 1.0, 1.0, id="bf16-fp32-hidden"),
    # near-uniform logits over 800 classes and a mean over ~800 tokens, as at the start of
    # training: each token's unscaled fp16 gradient 1 / (800 * 800) is a subnormal ~25
    # ulps wide, which only the loss scaler's factor, multiplied in first, lifts out
    pytest.param(torch.float16, torch.float32, 1000, 800, 1e-3, 2.0 ** 16, id="fp16-scaler"),
])
def test_autocast_matches_the_unpatched_computation(amp, hidden_dtype, tokens, vocab, spread,
                                                    scale, device):
    """Under the same autocast as F.linear + F.cross_entropy: the same loss dtype and
    gradient dtypes, and errors against float64 within verify's bounds of theirs."""
    h, w, t, b = inputs(tokens, 32, vocab, device, bias=True)
    h, w, b = h.to(hidden_dtype), w * spread, b * spread  # an fp32 lm_head, as a model's
    t[::5] = -100
    with torch.autocast(device.type, dtype=amp):
        theirs, g_theirs = _loss_and_grads(_unpatched, h, w, t, b, scale)
        ours, g_ours = _loss_and_grads(
            lambda *a: speedlight.linear_cross_entropy(*a, chunk_size=200), h, w, t, b, scale)
    truth, g_truth = _loss_and_grads(
        lambda hl, wl, tl, bl: reference.linear_cross_entropy(hl, wl, tl, bl),
        h.double(), w.double(), t, b.double(), 1.0)
    tol = op.SPEC.tolerance(amp)
    checks = [judge("loss", ours, truth, theirs, tol)]
    checks += [judge(f"grad_{n}", g, g64, gt, tol)
               for n, g, g64, gt in zip(("hidden", "weight", "bias"), g_ours, g_truth, g_theirs)]
    failed = [f"{c.name}: {c.reason}" for c in checks if not c.passed]
    assert not failed, "; ".join(failed)
    assert ours.dtype == torch.float32 and [g.dtype for g in g_ours] == [hidden_dtype] + [
        torch.float32] * 2


def test_autocast_stays_on_and_the_chunk_matmuls_take_its_dtype(device, monkeypatch):
    """Inside, autocast is still on and each chunk's logits (and so the gradient written
    over them, which the d_hidden and d_weight matmuls read) are bf16, from an fp32 hidden
    and weight; each gradient keeps its input's fp32."""
    h, w, t, _ = inputs(20, 16, 64, device)
    h.requires_grad_()
    w.requires_grad_()
    seen = []
    kernel_call = chunks.cross_entropy_fwd

    def recording(logits, *args, **kwargs):
        seen.append((torch.is_autocast_enabled(device.type), logits.dtype))
        return kernel_call(logits, *args, **kwargs)

    monkeypatch.setattr(chunks, "cross_entropy_fwd", recording)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = speedlight.linear_cross_entropy(h, w, t, chunk_size=10)
    assert seen == [(True, torch.bfloat16)] * 2  # 2 chunks
    loss.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.float32


def test_fp16_logits_compute_the_gradient_in_the_backward(device):
    """fp16 logits take the recomputing registration (the upstream gradient, a loss
    scaler's factor, is multiplied in before the gradient is rounded to fp16); bf16 the
    one that computes it in the forward."""
    called = {}
    for dtype in (torch.float16, torch.bfloat16):
        h, w, t, _ = inputs(8, 16, 40, device, dtype=dtype)
        h.requires_grad_()

        class Calls(SeeThrough):
            def seen(self, func, args):
                if func.namespace == "speedlight":
                    called.setdefault(dtype, []).append(func.overloadpacket.__name__)

        with Calls():
            speedlight.linear_cross_entropy(h, w, t).backward()
    assert called[torch.float16] == ["linear_cross_entropy_recompute_fwd",
                                     "linear_cross_entropy_recompute_bwd"]
    assert called[torch.bfloat16] == ["linear_cross_entropy_fwd", "linear_cross_entropy_bwd"]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_weights_match_cross_entropy_of_the_logits(reduction, device):
    """torch's weighted, smoothed loss (a mean divides by the counted targets' weights),
    chunked, with a per-token upstream gradient for "none"."""
    h, w, t, b = inputs(30, 24, 200, device, bias=True)
    t[::4] = -100
    cw = seeded((200,), device=device, seed=5).abs()
    kwargs = dict(reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    upstream = seeded((30,) if reduction == "none" else (), device=device, seed=9)

    def ours(hl, wl, tl, bl):
        return speedlight.linear_cross_entropy(hl, wl, tl, bl, class_weight=cw, chunk_size=7,
                                               **kwargs)

    def eager(hl, wl, tl, bl):
        return speedlight.cross_entropy(F.linear(hl, wl, bl), tl, weight=cw, **kwargs)

    results = []
    for fn in (ours, eager):
        leaves = _leaves(h, w, b)
        loss = fn(leaves[0], leaves[1], t, leaves[2])
        results.append((loss, torch.autograd.grad(loss, leaves, upstream)))
    (loss, grads), (ref, ref_grads) = results
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for g, g_ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_extras_are_cross_entropys_from_one_pass(reduction, device):
    """return_z_loss / return_token_accuracy / return_predicted_tokens: cross_entropy's
    named tuple, the parts not asked None, the logged values detached, the loss still
    differentiable; equal to cross_entropy's on the same logits."""
    args = op.SPEC.make_inputs(case(37, 16, 300, chunk=16, extras=True, zloss=1e-3,
                                    ignore="some", reduction=reduction), device)
    args["hidden"] = args["hidden"].view(1, 37, 16).requires_grad_()
    args["target"] = args["target"].view(1, 37)
    out = speedlight.linear_cross_entropy(**args)
    assert isinstance(out, CrossEntropyOutput) and out.loss.requires_grad
    assert not any(x.requires_grad for x in out[1:])
    logits = F.linear(args["hidden"], args["weight"])
    ref = speedlight.cross_entropy(logits, args["target"], reduction=reduction,
                                   z_loss=args["z_loss"], return_z_loss=True,
                                   return_token_accuracy=True, return_predicted_tokens=True)
    for got, want in zip(out, ref):
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    only = speedlight.linear_cross_entropy(**dict(args, return_z_loss=False,
                                                  return_predicted_tokens=False))
    assert only.z_loss is None and only.predicted_tokens is None
    torch.testing.assert_close(only.token_accuracy, out.token_accuracy)


@pytest.mark.parametrize("bad,error,match", [
    (dict(class_weight=torch.ones(9)), ValueError, r"class_weight must have shape \(10,\)"),
    (dict(class_weight=torch.ones(10, dtype=torch.int64)), TypeError,
     "class_weight must be None or a floating-point tensor"),
    (dict(bias=torch.ones(10, dtype=torch.float16)), TypeError,
     "bias must have hidden's dtype torch.float32 \\(outside torch.autocast\\)"),
])
def test_bad_options_are_named(bad, error, match, device):
    h, w, t, _ = inputs(4, 8, 10, device)
    bad = {k: v.to(device) for k, v in bad.items()}
    with pytest.raises(error, match=match):
        speedlight.linear_cross_entropy(h, w, t, **bad)


def test_the_module_holds_class_weights_as_a_buffer(device):
    h, w, t, _ = inputs(12, 16, 50, device)
    cw = seeded((50,), device=device, seed=3).abs()
    loss_fn = snn.LinearCrossEntropyLoss(label_smoothing=0.1, class_weight=cw, chunk_size=5)
    assert "class_weight" in dict(loss_fn.named_buffers())
    torch.testing.assert_close(loss_fn(h, w, t), speedlight.cross_entropy(
        F.linear(h, w), t, label_smoothing=0.1, weight=cw))
