"""A patched model under PEFT's LoRA: patched after get_peft_model (through to the base
model) or before it, the model trains as the unpatched LoRA model does, every adapter gets
its gradient, and the kinds that read a projection's weight in place of calling it (the
fused MLP's gate/up projections, the fused loss's lm_head) never bypass an adapter: they
are refused at patch time, or fall back at call time, with the reason in the report."""

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from speedlight.patching import PatchWarning, apply_kinds
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import batch, build, vocab

TOL = dict(rtol=2e-4, atol=2e-5)
# the kinds that read a weight directly (mlp="fused", the fused loss) and the ones around
# them; attention's interpreter cost is paid per family in test_patch.py
KINDS = dict(mlp="fused", attention=False)
LORA_LAYER = "peft.tuners.lora.layer.Linear"


def _lora(model, targets=("q_proj", "v_proj", "gate_proj", "lm_head")):
    # init_lora_weights=False: B starts random, so a bypassed adapter changes the first loss
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets),
                             init_lora_weights=False)
    torch.manual_seed(0)  # the same adapters in every model
    return peft.get_peft_model(model, config)


def _train(model, steps: int = 2):
    """AdamW steps on one padded batch: the losses and the first step's gradients of the
    trainable parameters, by name."""
    ids, labels = batch(vocab(model), seq=7)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    labels[1, -2:] = -100
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=1e-2)
    losses, grads = [], None
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        grads = grads or {n: p.grad.clone() for n, p in params.items() if p.grad is not None}
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), grads


@pytest.mark.parametrize("when", ["after-wrapping", "before-wrapping"])
def test_lora_model_trains_as_unpatched_and_no_adapter_is_bypassed(when):
    base = build("llama", seed=3)
    expected_losses, expected_grads = _train(_lora(copy.deepcopy(base)))
    if when == "after-wrapping":
        model = _lora(copy.deepcopy(base))
        with pytest.warns(PatchWarning, match=LORA_LAYER):
            report = apply_kinds(model, **KINDS)
    else:
        inner = copy.deepcopy(base)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PatchWarning)
            report = apply_kinds(inner, **KINDS)
        assert not report.not_patched
        model = _lora(inner)
    counter = LaunchCounter()
    with counter.active():
        losses, grads = _train(model)
    torch.testing.assert_close(losses, expected_losses, **TOL)
    assert sorted(grads) == sorted(expected_grads) and any("lm_head.lora_B" in n for n in grads)
    assert sum("lora_" in n for n in grads) == 2 * (2 * 3 + 1)  # A and B: q, v, gate x 2, head
    for name, g in expected_grads.items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda m: f"{name}: {m}")
    # the adapters' projections ran through their own layers: the gated unit alone, the
    # loss from the logits (the cross_entropy patch); norms and RoPE still speedlight's
    assert "_gated_matmul_kernel" not in counter.kernels and "_glu_fwd_kernel" in counter.kernels
    for kernel in ("_cross_entropy_fwd_kernel", "_rms_norm_fwd_kernel", "_rope_kernel"):
        assert kernel in counter.kernels, kernel
    refused = dict(report.not_patched)
    assert set(refused) == {"linear_cross_entropy", "mlp model.layers.0.mlp (fused)",
                            "mlp model.layers.1.mlp (fused)"}, refused
    assert refused["linear_cross_entropy"].startswith(f"lm_head: it is a {LORA_LAYER}")
    assert "gate_proj" in refused["mlp model.layers.0.mlp (fused)"]
    assert all("reading its weight would bypass its own forward" in why
               for why in refused.values())


def test_lora_on_attention_projections_keeps_every_kind():
    """PEFT's default targets for Llama (q_proj, v_proj): nothing speedlight reads by weight
    is wrapped, so every kind asked for is patched."""
    model = _lora(build("llama"), targets=("q_proj", "v_proj"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        report = apply_kinds(model, mlp="fused")
    assert report.count("linear_cross_entropy") == 1
    assert all("(gated_matmul)" in m for m in report.patched["mlp"])


class _DequantizingLinear(torch.nn.Linear):
    """A stand-in for a quantized layer (as bitsandbytes' Linear8bitLt): a Linear subclass
    whose own forward computes from its stored weight."""

    def forward(self, x):
        return super().forward(x)


def test_a_quantized_layer_is_refused_naming_it():
    model = build("llama")
    for module in (model.model.layers[0].mlp, model):
        name = "gate_proj" if module is not model else "lm_head"
        old = getattr(module, name)
        new = _DequantizingLinear(old.in_features, old.out_features, bias=False)
        new.weight = old.weight
        setattr(module, name, new)
    with pytest.warns(PatchWarning):
        report = apply_kinds(model, mlp="fused", attention=False)
    refused = dict(report.not_patched)
    assert "_DequantizingLinear" in refused["linear_cross_entropy"]
    assert "_DequantizingLinear" in refused["mlp model.layers.0.mlp (fused)"]
    assert "mlp model.layers.1.mlp (fused)" not in refused
