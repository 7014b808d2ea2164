import copy

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.pipeline.model_check import check_models
from tests.patching.tiny_models import batch, build


def _inputs(model):
    ids, labels = batch(model.config.vocab_size)
    return {"input_ids": ids, "labels": labels}


def test_an_identical_model_passes():
    model = build("llama")
    doc = check_models(model, copy.deepcopy(model), _inputs(model), lambda o: o.loss, train=True)
    assert doc["passed"], doc["failed"]
    assert doc["reference"].startswith("float64")
    assert any(c["name"].startswith("grad:") for c in doc["checks"])


def test_a_wrong_patched_model_fails_on_the_tensor_that_differs():
    model = build("llama")
    wrong = copy.deepcopy(model)
    with torch.no_grad():
        wrong.model.norm.weight.mul_(1.01)  # a 1% scale error in the final norm
    doc = check_models(model, wrong, _inputs(model), lambda o: o.loss, train=True)
    assert not doc["passed"]
    assert "logits" in doc["failed"]


def test_a_model_patched_with_the_fused_loss_is_checked_on_both_paths():
    from speedlight.patching import apply_kinds

    model = build("gemma2")
    patched = copy.deepcopy(model)
    apply_kinds(patched)
    doc = check_models(model, patched, _inputs(model), lambda o: o.loss, train=True)
    assert doc["passed"], doc["failed"]
    names = {c["name"] for c in doc["checks"]}
    assert "logits" in names and "loss" in names  # logits from the normal (eval) path
    assert patched.training


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_patched_moe_model_is_checked_against_its_float64_copy(family):
    """The experts' grouped_mm takes no float64: the reference copy loops over experts."""
    import warnings

    from speedlight.patching import apply_kinds

    model = build(family)
    patched = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every layer of these families is patched, fused too
        report = apply_kinds(patched)
    assert report.count("decoder_layer") == 2
    doc = check_models(model, patched, _inputs(model), lambda o: o.loss, train=True)
    assert doc["reference"].startswith("float64")
    assert doc["passed"], doc["failed"]
    assert any(c["name"].startswith("grad:") and "experts" in c["name"] for c in doc["checks"])
