"""The decoder-layer fusion: each layer's residual add and the norm after it as one
speedlight.add_rms_norm (speedlight/patching/decoder_layer.py).

Only the norms (and the fusion) are patched here, so the runs stay cheap under the
interpreter; the default patch, fusion included, is checked per family in test_patch.py."""

import copy
import dataclasses
import inspect
import re
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds, families, unpatch
from speedlight.pipeline.model_check import check_models
from speedlight.patching.decoder_layer import layer_modules
from tests.patching.tiny_models import (FAMILIES, MOE, NEW_FAMILIES, assert_same_step, batch, build,
                                        vocab)

TOL = dict(rtol=2e-5, atol=2e-6)
FUSED = [f for f in FAMILIES + NEW_FAMILIES if families.FAMILIES[f].layer_form is not None]
# the model check's float64 copy cannot run the experts' grouped_mm (fp32/bf16/fp16 only):
# the mixtures of experts are compared with the module-patched model instead
FUSED_MOE = [f for f in FUSED if f in MOE]
NORMS_ONLY = dict(mlp=False, rope=False, cross_entropy=False, attention=False,
                  linear_cross_entropy=False)


class OpCounter(TorchDispatchMode):
    """Counts the speedlight custom ops dispatched, by name (add_rms_norm_inplace_fwd...)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def count(self, op: str, stage: str = "fwd") -> int:
        """Calls of op's `stage` (fwd, bwd, infer), in place or not."""
        return self.calls.get(f"{op}_{stage}", 0) + self.calls.get(f"{op}_inplace_{stage}", 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "speedlight":
            name = func._schema.name.split("::")[-1]
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _run(model, ids, labels):
    out = model(input_ids=ids, labels=labels)
    grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
    return out.logits.detach(), out.loss.detach(), grads


def test_every_family_has_a_form_or_a_reason():
    for name, family in families.FAMILIES.items():
        assert family.layer_form in (None, "pre_norm", "sandwich"), name
        assert family.layer_form is not None or len(family.layer_note) > 40, name
    kept = {name for name, family in families.FAMILIES.items() if family.layer_form is None}
    assert kept == {"granite", "granitemoe", "olmo2"}
    assert "residual_multiplier" in families.FAMILIES["granite"].layer_note


@pytest.mark.parametrize("family", [f for f in FUSED if f not in MOE])
def test_fused_layers_match_the_original_in_float64(family):
    """Logits, loss and every gradient of the fused model against a float64 copy of the
    original: at most k times the original's own error (the model check's rule, the verify
    harness's judge); add_rms_norm runs once per layer, forward and backward, in place of
    the rms_norm of the norm it fuses."""
    base = build(family)
    fused = copy.deepcopy(base)
    report = apply_kinds(fused, **NORMS_ONLY)
    layers = len(layer_modules(base, families.FAMILIES[family]))
    assert layers == 2 and report.count("decoder_layer") == layers and not report.not_patched, \
        str(report)
    form = families.FAMILIES[family].layer_form
    assert all(f"({form}: residual add + " in p for p in report.patched["decoder_layer"])
    norms = report.count("rms_norm")
    ids, labels = batch(vocab(base))
    with OpCounter() as counter:  # only the fused model runs speedlight ops
        doc = check_models(base, fused, {"input_ids": ids, "labels": labels},
                           lambda o: o.loss, train=True)
    failed = set(doc["failed"])
    if family == "falcon_h1":
        # Falcon-H1's Mamba skip weight D: its gradient sums dy * x over every token, and the
        # original's own fp32 error there is luck-sized (7e-8 relative, ~1 unit roundoff) on
        # this CPU's reduction order, so k times it is tighter than the fused layers' 1-ulp
        # changes upstream allow (5.5e-7). Held instead to the fp32 ceiling; every other
        # logit, loss and gradient check keeps the k-times rule.
        for c in doc["checks"]:
            if c["name"].endswith(".mamba.D") and c["name"] in failed:
                assert c["ours"]["rel_l2"] < doc["tolerance"]["ceiling"], c
                failed.discard(c["name"])
    assert not failed, (sorted(failed), doc["worst"])
    assert doc["reference"].startswith("float64")
    checked = {c["name"] for c in doc["checks"]}
    for entry in report.patched["decoder_layer"]:  # "<layer> (<form>: residual add + <norm>)"
        path, norm = entry.split(" ")[0], entry.rsplit(" ", 1)[-1].rstrip(")")
        assert f"grad:{path}.{norm}.weight" in checked, sorted(checked)
    assert sum(name.startswith("grad:") for name in checked) > 10
    for stage in ("fwd", "bwd"):
        assert counter.count("add_rms_norm", stage) == layers, counter.calls
        assert counter.count("rms_norm", stage) == norms - layers, counter.calls


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_the_fusion_keeps_the_norms_rules(family):
    """Gemma's 1 + w and "input" output dtype; Llama's fp32 weight promoting bf16
    activations: the fused call returns what `norm(residual + branch)` returns, in its
    dtype, and the sum in the activations' dtype."""
    from speedlight.patching.decoder_layer import AddNorm

    model = build(family)
    norm = model.model.layers[0].post_attention_layernorm
    spec = families.FAMILIES[family]
    g = torch.Generator().manual_seed(4)
    branch, residual = (torch.randn(3, 5, 64, generator=g).to(torch.bfloat16) for _ in range(2))
    y, h = AddNorm(spec.norm_offset, spec.norm_out, "eps" if hasattr(norm, "eps") else
                   "variance_epsilon", in_place=False)(norm, branch, residual)
    expected_h = residual + branch
    expected_y = norm(expected_h)
    assert torch.equal(h, expected_h)
    assert y.dtype == expected_y.dtype == (torch.float32 if family == "llama" else torch.bfloat16)
    torch.testing.assert_close(y, expected_y, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("family", ["qwen2"] + FUSED_MOE)
def test_fused_and_module_patched_models_agree(family):
    """The fusion alone changes nothing but where the add runs: the same logits, loss and
    gradients as the module-patched model, to float32 rounding (an MoE block called as
    the layer calls it)."""
    base = build(family)
    modules, fused = copy.deepcopy(base), copy.deepcopy(base)
    apply_kinds(modules, **NORMS_ONLY, decoder_layer=False)
    assert apply_kinds(fused, **NORMS_ONLY).count("decoder_layer") == 2
    ids, labels = batch(vocab(base))
    expected = _run(modules, ids, labels)
    with OpCounter() as counter:
        got = _run(fused, ids, labels)
    assert counter.count("add_rms_norm") == counter.count("add_rms_norm", "bwd") == 2
    assert_same_step(base, got, expected, TOL)


def test_the_fused_forward_keeps_the_installed_signature_and_unpatches_exactly():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = build("llama")
    ids, labels = batch(model.config.vocab_size)
    before = model(input_ids=ids, labels=labels)
    apply_kinds(model, **NORMS_ONLY, rms_norm=False)
    layer = model.model.layers[0]
    assert inspect.signature(layer.forward) == inspect.signature(
        LlamaDecoderLayer.forward.__get__(layer))
    with OpCounter() as counter:
        fused = model(input_ids=ids, labels=labels)
    # the norms themselves are not patched here; post_attention_layernorm's output feeds
    # the MLP alone, so the fused backward runs in place
    assert counter.calls == {"add_rms_norm_inplace_fwd": 2}, counter.calls
    torch.testing.assert_close(fused.logits, before.logits, **TOL)
    unpatch(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with OpCounter() as counter:
        after = model(input_ids=ids, labels=labels)
    assert counter.calls == {}
    assert torch.equal(after.logits, before.logits) and torch.equal(after.loss, before.loss)


def test_a_hook_on_the_fused_norm_still_sees_its_call():
    model = build("qwen2")
    apply_kinds(model, **NORMS_ONLY)
    seen = []
    norm = model.model.layers[1].post_attention_layernorm
    handle = norm.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    ids, _ = batch(model.config.vocab_size)
    with OpCounter() as counter:
        model(input_ids=ids)
    handle.remove()
    # layer 1 adds the residual in PyTorch and calls its norm (speedlight's rms_norm);
    # layer 0 stays fused
    assert seen == [(2, 11, 64)], seen
    assert counter.count("add_rms_norm") == 1 and counter.count("rms_norm") == 2 + 1 + 1, \
        counter.calls
    unpatch(model)


def _olmo2_like_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                        use_cache=False, position_embeddings=None, **kwargs):
    """Post-norm on the branch before the add and no norm after it (OLMo 2's form)."""
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, cache=cache, use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
    hidden_states = self.post_attention_layernorm(hidden_states)
    hidden_states = residual + hidden_states
    residual = hidden_states
    hidden_states = self.mlp(hidden_states)
    return residual + self.input_layernorm(hidden_states)


@pytest.mark.parametrize("case", ["granite-as-pre_norm", "llama-as-sandwich", "other-forward"])
def test_a_layer_whose_forward_differs_is_kept_with_the_reason(case, monkeypatch):
    family, expected = {
        "granite-as-pre_norm": ("granite", r"adds `hidden_states \* self.residual_multiplier`"),
        "llama-as-sandwich": ("llama", "does not follow a post-norm"),
        "other-forward": ("llama", "has 0 residual adds followed by a LlamaRMSNorm"),
    }[case]
    form = "sandwich" if case == "llama-as-sandwich" else "pre_norm"
    monkeypatch.setitem(families.FAMILIES, family, dataclasses.replace(
        families.FAMILIES[family], layer_form=form))
    model = build(family)
    if case == "other-forward":
        monkeypatch.setattr(type(model.model.layers[0]), "forward", _olmo2_like_forward)
    with pytest.warns(PatchWarning, match="NOT patched decoder_layer model.layers.0"):
        report = apply_kinds(model, **NORMS_ONLY)
    assert "decoder_layer" not in report.patched
    reasons = [why for what, why in report.not_patched if what.startswith("decoder_layer")]
    assert len(reasons) == 2
    assert all(f"not of the {form} form" in r and "kept as it is" in r for r in reasons)
    assert any(re.search(expected, r) for r in reasons), reasons
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)
    unpatch(model)


def test_granite_keeps_its_layer_and_says_why():
    model = build("granite")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        report = apply_kinds(model, **NORMS_ONLY)
    assert report.not_patched == [("decoder_layer", "granite: "
                                   + families.FAMILIES["granite"].layer_note)]
    assert "NOT patched decoder_layer: granite: its layer scales" in str(report)
    unpatch(model)
