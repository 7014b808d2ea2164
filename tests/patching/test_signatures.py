"""A patched model keeps its forward's signature, so the tools that read it keep working:
Trainer keeps a dataset's columns by it (remove_unused_columns), generate passes
logits_to_keep only to a forward that names it (one position of prefill logits, not the
whole prompt's), and greedy decoding with a dynamic or a static cache gives the tokens the
original gives."""

import copy
import inspect
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds
from tests.patching.tiny_models import (FAMILIES, KEEPING_FAMILIES, NEW_FAMILIES, batch, build,
                                        vocab)


def _patched(model):
    with warnings.catch_warnings():  # the families that keep their layer say so
        warnings.simplefilter("ignore", PatchWarning)
        return apply_kinds(model)


@pytest.mark.parametrize("family", FAMILIES + NEW_FAMILIES + KEEPING_FAMILIES)
def test_every_patched_forward_keeps_the_signature_it_replaces(family):
    """The causal LM's forward: the original's parameters, in order, kinds, defaults and
    annotations, with speedlight's keyword-only skip_logits before **kwargs; every other
    patched module's forward: exactly its class's."""
    original = build(family)
    model = copy.deepcopy(original)
    _patched(model)
    before = inspect.signature(original.forward)
    after = inspect.signature(model.forward)
    assert [p for p in after.parameters.values() if p.name != "skip_logits"] == \
        list(before.parameters.values())
    assert after.parameters["skip_logits"].kind is inspect.Parameter.KEYWORD_ONLY
    assert after.return_annotation == before.return_annotation
    assert "logits_to_keep" in after.parameters
    replaced = [(path, m) for path, m in model.named_modules()
                if "forward" in m.__dict__ and m is not model]
    assert len(replaced) > 5
    for path, module in replaced:
        assert inspect.signature(module.forward) == \
            inspect.signature(type(module).forward.__get__(module)), path


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_greedy_decoding_keeps_one_prefill_position_and_the_original_tokens(family, cache):
    """generate with a left-padded batch: the prefill's logits are [batch, 1, vocab]
    (generate passed logits_to_keep), and the greedy tokens equal the original model's,
    with a dynamic cache and with a static one (whose unwritten slots the padding mask
    leaves out). Gemma 2: sliding window and softcaps."""
    original = build(family)
    original.eval()
    model = copy.deepcopy(original)
    _patched(model)
    ids, _ = batch(vocab(original), seq=6)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    shapes = []
    model.register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.logits.shape)))
    expected = original.generate(ids, **kwargs)
    tokens = model.generate(ids, **kwargs)
    assert shapes[0] == (2, 1, vocab(original)), shapes
    assert len(shapes) == 4 and tokens.shape == (2, 10)
    assert torch.equal(tokens, expected), (tokens[:, 6:], expected[:, 6:])
