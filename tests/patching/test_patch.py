import copy
import dataclasses
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds, unpatch
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import (FAMILIES, MOE, NEW_FAMILIES, assert_same_step, batch, build,
                                        vocab)

TOL = dict(rtol=2e-4, atol=2e-5)


def report_note(family: str) -> str:
    from speedlight.patching.families import FAMILIES as KNOWN
    return KNOWN[family].layer_note


# the families whose decoder layer is kept as it is (Family.layer_form None)
KEPT = ("granite", "granitemoe", "olmo2")


def _run(model, ids, labels):
    """Logits without labels; loss and gradients of the training step with labels (a
    patched model computes that loss without its logits)."""
    logits = model(input_ids=ids).logits.detach()
    out = model(input_ids=ids, labels=labels)
    grads = torch.autograd.grad(out.loss, [p for p in model.parameters()], allow_unused=True)
    return logits, out.loss.detach(), grads


# RMSNorm modules of each tiny model: 2 per layer and the final norm, plus q_norm/k_norm
# per layer (Qwen3, Qwen3-MoE, Gemma 3, OLMo 2), post-norms (Gemma 2/3, GLM-4: 2 per layer)
NORMS = {"qwen3": 9, "gemma2": 9, "gemma3_text": 13, "olmo2": 9, "glm4": 9, "qwen3_moe": 9}
# MLP and experts modules: Qwen2-MoE's layers have experts and a shared expert each
MLPS = {"qwen2_moe": 4}


@pytest.mark.parametrize("family", FAMILIES + NEW_FAMILIES)
def test_patched_logits_loss_and_every_gradient_match(family):
    base = build(family)
    patched = copy.deepcopy(base)
    with warnings.catch_warnings():  # a family without a layer form warns of its layer
        warnings.simplefilter("ignore" if family in KEPT else "error", PatchWarning)
        report = apply_kinds(patched)
    assert report.count("rms_norm") == NORMS.get(family, 2 * 2 + 1)
    assert report.count("mlp") == MLPS.get(family, 2) and report.count("rope") == 2
    if family in MOE:  # every layer's experts (Qwen3-MoE's second layer is dense)
        experts = [m for m in report.patched["mlp"] if "experts)" in m]
        assert len(experts) == (1 if family == "qwen3_moe" else 2), report.patched["mlp"]
    assert report.count("attention") == 2
    assert report.count("cross_entropy") == 1
    if family in KEPT:  # its layer is not of a form add_rms_norm fuses (its layer_note)
        assert report.not_patched == [("decoder_layer", f"{family}: {report_note(family)}")]
    else:
        assert report.count("decoder_layer") == 2 and not report.not_patched
    assert report.count("linear_cross_entropy") == 1 and "logits are None" in str(report)
    ids, labels = batch(vocab(base))
    expected = _run(base, ids, labels)
    counter = LaunchCounter()
    with counter.active():
        got = _run(patched, ids, labels)
    kernels = " ".join(counter.kernels)
    for name in ("rms_norm", "rope", "cross_entropy", "moe_gate" if family in MOE else "glu",
                 "attention"):
        assert f"_{name}_" in kernels, f"no {name} kernel ran in the patched {family} model"
    gated = "geglu" if family.startswith("gemma") else "swiglu"
    assert all(f"({gated}" in m for m in report.patched["mlp"]), report.patched["mlp"]
    assert_same_step(base, got, expected, TOL)


@pytest.mark.parametrize("family", ["llama", "gemma2", "phi3"])
def test_fused_mlp_runs_gated_matmul_and_matches(family):
    """mlp="fused": each MLP's two input projections and its gated product in one
    gated_matmul kernel (Phi-3's [2I, H] gate_up_proj read in place), then down_proj."""
    base = build(family)
    patched = copy.deepcopy(base)
    report = apply_kinds(patched, rms_norm=False, rope=False, cross_entropy=False, mlp="fused")
    assert report.count("mlp") == 2 and not report.not_patched
    assert all("(gated_matmul)" in m for m in report.patched["mlp"]), report.patched["mlp"]
    ids, labels = batch(base.config.vocab_size)
    expected = _run(base, ids, labels)
    counter = LaunchCounter()
    with counter.active():
        got = _run(patched, ids, labels)
    assert "_gated_matmul_kernel" in counter.kernels
    assert_same_step(base, got, expected, TOL)
    with pytest.raises(ValueError, match="mlp must be"):
        apply_kinds(copy.deepcopy(base), mlp="yes")


@pytest.mark.parametrize("family", ["llama", "gemma2"] + NEW_FAMILIES)
def test_unpatch_restores_the_original_exactly(family):
    """unpatch restores every forward, the loss and the attention implementation; the
    family's module-level apply_rotary_pos_emb is never replaced (the patched attention
    forwards call speedlight's RoPE by a name of their own)."""
    import importlib

    from speedlight.patching.families import FAMILIES as KNOWN
    model = build(family)
    ids, labels = batch(vocab(model))
    before = model(input_ids=ids, labels=labels).logits
    mod = importlib.import_module(KNOWN[family].module)
    original_rope = mod.apply_rotary_pos_emb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        apply_kinds(model)
    assert mod.apply_rotary_pos_emb is original_rope
    unpatch(model)
    assert mod.apply_rotary_pos_emb is original_rope
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert "_loss_function" not in model.__dict__
    assert model.config._attn_implementation == "eager"
    counter = LaunchCounter()
    with counter.active():
        after = model(input_ids=ids, labels=labels).logits
    assert counter.count == 0 and torch.equal(before, after)
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)


def test_state_dicts_load_unchanged():
    base = build("llama")
    patched = copy.deepcopy(build("llama", seed=5))
    apply_kinds(patched)
    assert patched.state_dict().keys() == base.state_dict().keys()
    patched.load_state_dict(base.state_dict())
    ids, labels = batch(base.config.vocab_size)
    torch.testing.assert_close(patched(input_ids=ids).logits, base(input_ids=ids).logits, **TOL)


def test_choose_which_ops():
    model = build("llama")
    report = apply_kinds(model, mlp=False, rope=False, cross_entropy=False, attention=False,
                   linear_cross_entropy=False, decoder_layer=False)
    assert set(report.patched) == {"rms_norm"}
    assert "forward" not in model.__dict__
    unpatch(model)


def test_patching_twice_is_refused():
    model = build("qwen2")
    apply_kinds(model)
    with pytest.raises(ValueError, match="already patched"):
        apply_kinds(model)
    unpatch(model)


def test_unknown_architecture_says_what_was_not_patched():
    import transformers as tf
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.warns(PatchWarning, match=r"unknown architecture 'gpt2'.*\n.*NOT patched"):
        report = apply_kinds(gpt2)
    assert not report.patched and {w for w, _ in report.not_patched} == {
        "rms_norm", "mlp", "rope", "cross_entropy", "attention", "decoder_layer",
        "linear_cross_entropy"}
    unpatch(gpt2)


def test_an_unpatched_model_of_the_same_family_keeps_pytorchs_rope():
    patched, plain = build("llama"), build("llama", seed=3)
    apply_kinds(patched)
    ids, _ = batch(plain.config.vocab_size)
    counter = LaunchCounter()
    with counter.active():
        plain(input_ids=ids)
    assert counter.count == 0, counter.kernels
    unpatch(patched)


def test_patch_and_unpatch_reject_non_modules():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        apply_kinds("llama")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got int"):
        unpatch(123)


def test_twenty_training_steps_give_matching_loss_curves():
    from tests.patching.tiny_models import COMMON
    text = (open(__file__).read() * 2)[:4000].encode()
    data = torch.tensor(list(text)) % COMMON["vocab_size"]
    curves = []
    for do_patch in (False, True):
        model = build("llama", seed=11)
        if do_patch:  # attention's interpreter cost over 20 steps is minutes; its model
            apply_kinds(model, attention=False)  # match is checked per family above
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(20):
            starts = torch.randint(0, len(data) - 17, (4,), generator=g)
            ids = torch.stack([data[s:s + 16] for s in starts])
            loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    base, ours = curves
    assert base[-1] < base[0] - 0.3, "the model did not train"
    assert max(abs(a - b) for a, b in zip(base, ours)) < 1e-3, (base, ours)


@pytest.mark.parametrize("family", ["gemma2", "granite", "falcon_h1", "granitemoe", "qwen2_vl"])
def test_fused_loss_without_logits_and_the_normal_path(family):
    """Training with labels: the loss comes from linear_cross_entropy and no logits are
    made (Gemma 2's softcap, Granite's and GraniteMoE's logits_scaling and Falcon-H1's
    lm_head_multiplier applied), in the output class of the family's own forward; eval,
    skip_logits=False or no labels keep the logits; num_items_in_batch divides a sum, as
    Hugging Face does."""
    base = build(family)
    model = copy.deepcopy(base)
    with warnings.catch_warnings():  # Granite keeps its decoder layer (its layer_note)
        warnings.simplefilter("ignore", PatchWarning)
        apply_kinds(model)
    ids, labels = batch(vocab(model))
    fused = model(input_ids=ids, labels=labels)
    # the output class the family's own forward returns (Qwen2-VL's carries rope_deltas)
    assert type(fused) is type(base(input_ids=ids, labels=labels))
    assert fused.logits is None
    plain = model(input_ids=ids, labels=labels, skip_logits=False)
    assert plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss, **TOL)
    torch.testing.assert_close(fused.loss, base(input_ids=ids, labels=labels).loss, **TOL)
    model.eval()
    assert model(input_ids=ids, labels=labels).logits is not None
    model.train()
    n = torch.tensor(7.0)
    summed = model(input_ids=ids, labels=labels, num_items_in_batch=n).loss
    expected = base(input_ids=ids, labels=labels, num_items_in_batch=n).loss
    torch.testing.assert_close(summed, expected, **TOL)
    counter = LaunchCounter()
    with counter.active():
        model(input_ids=ids, labels=labels)
    assert "_cross_entropy_fwd_kernel" in counter.kernels
def test_norm_backward_in_place_only_where_its_gradient_is_its_own(monkeypatch):
    """Gemma 2 has pre-norms and post-norms whose output joins the residual stream (the add
    hands one gradient to both operands). The patch runs the pre-norms' and the final
    norm's backward in place, not the post-norms', the pre-norms writing over their
    gradients, and every gradient equals the out-of-place patch's exactly. In place on the
    post-norms too gives the same gradients: the add's shared gradient is seen to be held
    elsewhere and written into a copy."""
    from speedlight.ops import registration
    from speedlight.patching import families

    decided = []

    def recorded(grad, output):
        decided.append(writable(grad, output))
        return decided[-1]

    writable = registration._writable_gradient
    monkeypatch.setattr(registration, "_writable_gradient", recorded)
    base = build("gemma2")
    ids, labels = batch(base.config.vocab_size)
    runs = {}
    for name, kwargs in [("out_of_place", dict(norm_in_place=False)), ("patched", {})]:
        model = copy.deepcopy(base)
        report = apply_kinds(model, rope=False, attention=False, **kwargs)
        runs[name] = (_run(model, ids, labels), report)
    # the pre-norms' gradients (their linear layers') are written over; the final norm's
    # is the one linear_cross_entropy computed in its forward and still holds: copied
    assert decided == [False] + [True] * (2 * 2), decided
    assert runs["out_of_place"][1].in_place == []
    assert sorted({p.rsplit(".", 1)[-1] for p in runs["patched"][1].in_place}) == [
        "input_layernorm", "norm", "pre_feedforward_layernorm"]
    assert len(runs["patched"][1].in_place) == 2 * 2 + 1
    (_, loss0, grads0), (_, loss1, grads1) = runs["out_of_place"][0], runs["patched"][0]
    assert torch.equal(loss0, loss1)
    for (name, _), g0, g1 in zip(base.named_parameters(), grads0, grads1):
        assert torch.equal(g0, g1), name

    # post-norms in place: their gradient is shared with the residual stream, so copied
    decided.clear()
    everywhere = families.FAMILIES["gemma2"].in_place_norms + (
        "post_attention_layernorm", "post_feedforward_layernorm")
    monkeypatch.setitem(families.FAMILIES, "gemma2", dataclasses.replace(
        families.FAMILIES["gemma2"], in_place_norms=everywhere))
    model = copy.deepcopy(base)
    apply_kinds(model, rope=False, attention=False)
    _, _, grads2 = _run(model, ids, labels)
    for (name, _), g0, g2 in zip(base.named_parameters(), grads0, grads2):
        assert torch.equal(g0, g2), name
    assert decided.count(False) >= 2 * 2, decided


def test_a_model_with_its_own_loss_function_is_patched_and_restored_exactly():
    """An instance's own loss_function (kept by transformers in `_loss_function`) is
    replaced by speedlight's loss while patched, and is the same object again after unpatch."""
    from speedlight.patching.causal_lm import causal_lm_loss
    model = build("llama")
    ids, labels = batch(vocab(model))
    calls = []

    def own_loss(logits, labels, vocab_size, **kwargs):
        calls.append(1)
        return torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab_size).float(), labels[:, 1:].reshape(-1))

    model.loss_function = own_loss
    kinds = dict(rms_norm=False, mlp=False, rope=False, attention=False,
                 linear_cross_entropy=False, decoder_layer=False, plan=None)
    report = apply_kinds(model, **kinds)
    assert "cross_entropy" in report.patched and model.loss_function is causal_lm_loss
    patched_loss = model(input_ids=ids, labels=labels).loss
    assert not calls
    unpatch(model)
    assert model.__dict__["_loss_function"] is own_loss and model.loss_function is own_loss
    torch.testing.assert_close(model(input_ids=ids, labels=labels).loss, patched_loss,
                               rtol=1e-5, atol=1e-6)
    assert calls == [1]
