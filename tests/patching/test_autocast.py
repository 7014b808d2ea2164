"""Every patched family trains under torch.autocast on the CPU: bf16, and fp16 with a
gradient scaler's loss scale (torch.amp.GradScaler("cpu")). One training step's logits,
loss (the fused loss included: the patched model trains without logits) and every
parameter gradient, against a float64 copy of the original, have at most k times the error
the unpatched model has under the same autocast (the model check's rule, with the autocast
dtype's tolerance). Attention, which casts q, k and v to the autocast dtype whichever it
is, runs in the bf16 step only: its interpreter cost is half a step's."""

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds, families
from speedlight.pipeline.model_check import check_models
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import (FAMILIES, KEEPING_FAMILIES, NEW_FAMILIES, batch, build,
                                        vocab)



def _settled_loss_scale(model, inputs) -> float:
    """The loss scale a torch.amp.GradScaler("cpu") trains the unpatched model at: its
    initial scale, times its backoff factor for each step whose fp16 gradients overflow
    (a step the scaler skips)."""
    scaler = torch.amp.GradScaler("cpu")
    scale = scaler.get_scale()
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(32):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(**inputs).loss
        grads = torch.autograd.grad(loss * scale, params, allow_unused=True)
        if all(g is None or bool(torch.isfinite(g).all()) for g in grads):
            return scale
        scale *= scaler.get_backoff_factor()
    raise AssertionError("the unpatched model's fp16 gradients overflow at every scale")


# DeepSeek-V3's group-limited sigmoid router picks other experts under bf16 than in float64
# for some tokens of the tiny model at seeds 0 and 1: the unpatched model's own logits are
# then 2-5% off float64 (0.4% at seed 2), past the judge's ceiling, and no comparison of
# the patched model with float64 can judge it. Built where the routing holds.
ROUTING_HOLDS_SEED = {"deepseek_v3": 2}


@pytest.mark.parametrize("amp", [torch.bfloat16, torch.float16], ids=["bf16", "fp16-scaled"])
@pytest.mark.parametrize("family", FAMILIES + NEW_FAMILIES + KEEPING_FAMILIES)
def test_one_autocast_step_matches_the_unpatched_model(family, amp):
    base = build(family, seed=ROUTING_HOLDS_SEED.get(family, 0))
    patched = copy.deepcopy(base)
    with warnings.catch_warnings():  # the families that keep their layer say so
        warnings.simplefilter("ignore", PatchWarning)
        report = apply_kinds(patched, attention=amp == torch.bfloat16)
    assert report.count("linear_cross_entropy") == 1
    ids, labels = batch(vocab(base), seq=7)
    inputs = {"input_ids": ids, "labels": labels}
    scale = _settled_loss_scale(base, inputs) if amp == torch.float16 else 1.0
    counter = LaunchCounter()
    with counter.active():
        doc = check_models(base, patched, inputs, lambda o: o.loss, train=True, amp=amp,
                           loss_scale=scale)
    assert doc["passed"], (doc["failed"], doc["worst"])
    names = {c["name"] for c in doc["checks"]}
    assert {"logits", "loss"} <= names and sum(n.startswith("grad:") for n in names) > 10
    kernels = " ".join(counter.kernels)
    assert "_glu_" in kernels or "_moe_gate_" in kernels, kernels  # an MLP's or experts' unit
    keeps_attention = "attention" in dict(families.FAMILIES[family].kept)
    for kernel in ("_rms_norm_", "_cross_entropy_fwd_kernel") + (
            ("_attention_",) if amp == torch.bfloat16 and not keeps_attention else ()):
        assert kernel in kernels, f"no {kernel} kernel ran"
