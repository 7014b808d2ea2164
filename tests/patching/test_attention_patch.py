"""speedlight.attention inside patched Hugging Face models: padding masks unpadded to
variable length, packed sequences by position_ids, the fallback for a 4-D mask (recorded
in the report), dropout refused, and the attention implementation restored by unpatch."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import apply_kinds, unpatch
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import batch, build

TOL = dict(rtol=2e-4, atol=2e-5)


def _attention_kernels(counter) -> int:
    return sum("_attention_" in k for k in counter.kernels)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_padding_mask_runs_as_variable_length(family):
    """Right and left padding: the patched model's logits and gradients at the real tokens
    match the original's (Gemma 2: softcap and a sliding window of 8 over 11 tokens)."""
    base = build(family)
    patched = copy.deepcopy(base)
    apply_kinds(patched, rms_norm=False, mlp=False, rope=False, cross_entropy=False)
    ids, _ = batch(base.config.vocab_size)
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # right padding
    mask[1, :2] = 0  # left padding
    out0 = base(input_ids=ids, attention_mask=mask).logits
    counter = LaunchCounter()
    with counter.active():
        out1 = patched(input_ids=ids, attention_mask=mask).logits
    assert _attention_kernels(counter) > 0
    keep = mask.bool()
    torch.testing.assert_close(out1[keep], out0[keep], **TOL)
    g0 = torch.autograd.grad(out0[keep].square().sum(), list(base.parameters()), allow_unused=True)
    g1 = torch.autograd.grad(out1[keep].square().sum(), list(patched.parameters()), allow_unused=True)
    for (name, _), a, b in zip(base.named_parameters(), g0, g1):
        if a is not None:
            torch.testing.assert_close(b, a, **TOL, msg=lambda m: f"{name}: {m}")


def test_sequences_packed_by_position_ids_run_as_variable_length():
    """One row holding two sequences (positions restart at 0) gives each sequence the
    logits it has alone."""
    model = build("llama")
    apply_kinds(model, rms_norm=False, mlp=False, rope=False, cross_entropy=False)
    ids, _ = batch(model.config.vocab_size)
    a, b = ids[0, :7], ids[1, :4]
    packed = torch.cat([a, b])[None]
    positions = torch.cat([torch.arange(7), torch.arange(4)])[None]
    out = model(input_ids=packed, position_ids=positions).logits[0]
    torch.testing.assert_close(out[:7], model(input_ids=a[None]).logits[0], **TOL)
    torch.testing.assert_close(out[7:], model(input_ids=b[None]).logits[0], **TOL)


def test_a_4d_mask_falls_back_and_says_why():
    base = build("qwen2")
    patched = copy.deepcopy(base)
    report = apply_kinds(patched, rms_norm=False, mlp=False, rope=False, cross_entropy=False)
    ids, _ = batch(base.config.vocab_size)
    seq = ids.shape[1]
    allowed = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
    mask4 = torch.zeros(2, 1, seq, seq).masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(patched(input_ids=ids, attention_mask=mask4).logits,
                               base(input_ids=ids, attention_mask=mask4).logits, **TOL)
    assert any("4-D attention mask" in why for _, why in report.not_patched), report
    unpatch(patched)


def test_dropout_in_training_names_the_config_field():
    model = build("llama")
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    apply_kinds(model, rms_norm=False, mlp=False, rope=False, cross_entropy=False)
    model.train()
    ids, _ = batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="config.attention_dropout"):
        model(input_ids=ids)
    model.eval()
    model(input_ids=ids)  # no dropout at inference
    unpatch(model)
    assert model.config._attn_implementation == "eager"
