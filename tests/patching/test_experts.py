"""The mixtures of experts' routed experts on speedlight.moe_experts, by both ways in:
transformers' experts-implementation registry (5.25+, this env) and the instance's forward
(older transformers: forced here by hiding the registry); the router untouched; the whole
model against float64; and a compile with no graph break on the module path."""

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, experts, patch, unpatch
from speedlight.pipeline.model_check import check_models
from tests.patching.tiny_models import batch, build, vocab

TOL = dict(rtol=2e-4, atol=2e-5)
EXPERTS_ONLY = dict(rms_norm=False, rope=False, cross_entropy=False, attention=False,
                    linear_cross_entropy=False, decoder_layer=False)


def _experts_paths(report) -> list[str]:
    return [m for m in report.patched["mlp"] if "by moe_experts" in m]


@pytest.mark.parametrize("way", ["registry", "module"])
def test_both_ways_in_run_moe_experts_keep_the_router_and_unpatch(way, monkeypatch):
    """Registry: the experts' config names "speedlight" and the class forward dispatches
    to it; module: the instance's forward is replaced. Either way the router's logits and
    the load-balancing loss equal the unpatched model's, the loss matches, and unpatch
    restores the config's implementation and every forward."""
    if experts.experts_registry() is None and way == "registry":
        pytest.skip("this transformers has no experts-implementation registry")
    if way == "module":
        monkeypatch.setattr(experts, "experts_registry", lambda: None)
    base = build("mixtral")
    model = copy.deepcopy(base)
    before = model.config._experts_implementation
    report = patch(model, **EXPERTS_ONLY)
    paths = _experts_paths(report)
    assert len(paths) == 2 and all(f"{way}:" in p for p in paths), report.patched["mlp"]
    layer_experts = model.model.layers[0].mlp.experts
    assert ("forward" in layer_experts.__dict__) == (way == "module")
    assert (model.config._experts_implementation == "speedlight") == (way == "registry")
    ids, labels = batch(vocab(model))
    ours = model(input_ids=ids, labels=labels, output_router_logits=True)
    theirs = base(input_ids=ids, labels=labels, output_router_logits=True)
    # the first router reads the same input bit for bit; the later ones read the experts'
    # output, equal to float32 rounding
    torch.testing.assert_close(ours.router_logits[0], theirs.router_logits[0], rtol=0, atol=0)
    for a, b in zip(ours.router_logits, theirs.router_logits, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, **TOL)
    torch.testing.assert_close(ours.loss, theirs.loss, **TOL)
    unpatch(model)
    assert model.config._experts_implementation == before
    assert "forward" not in layer_experts.__dict__
    assert experts.FORWARD_ATTR not in layer_experts.__dict__


@pytest.mark.parametrize("family", ["qwen2_moe", "granitemoe"])
def test_patched_moe_matches_the_original_in_float64(family):
    """Logits, loss and every gradient of the experts-patched model against a float64 copy
    of the original (its experts' own loop: transformers' grouped_mm has no float64), at
    most k times the original's own float32 error (the model check's rule)."""
    base = build(family)
    base.config._experts_implementation = "eager"
    model = copy.deepcopy(base)
    report = patch(model, **EXPERTS_ONLY)
    assert len(_experts_paths(report)) == 2, str(report)
    ids, labels = batch(vocab(base))
    doc = check_models(base, model, {"input_ids": ids, "labels": labels}, lambda o: o.loss,
                       train=True)
    assert doc["reference"].startswith("float64")
    assert not doc["failed"], (doc["failed"], doc["worst"])
    checked = {c["name"] for c in doc["checks"]}
    assert any(n.endswith("experts.gate_up_proj") for n in checked), sorted(checked)


def test_module_path_compiles_whole(monkeypatch):
    """The instance-forward path (transformers without the registry) traces in one graph
    with no break, forward and backward (AOT autograd), and matches eager."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(experts, "experts_registry", lambda: None)
    model = build("qwen3_moe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        report = patch(model, attention=False)
    assert all("module:" in p for p in _experts_paths(report))
    ids, labels = batch(vocab(model))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(input_ids=ids, labels=labels).loss
    grads = torch.autograd.grad(loss, model.model.layers[0].mlp.experts.gate_up_proj)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()
    eager = model(input_ids=ids, labels=labels).loss
    expected = torch.autograd.grad(eager, model.model.layers[0].mlp.experts.gate_up_proj)
    torch.testing.assert_close(loss, eager, **TOL)
    torch.testing.assert_close(grads[0], expected[0], **TOL)
