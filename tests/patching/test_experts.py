"""The mixtures of experts' routed experts on speedlight.moe_experts, by both ways in:
transformers' experts-implementation registry (5.25+, this env) and the instance's forward
(older transformers: forced here by hiding the registry); the router untouched; the whole
model against float64 (gpt-oss and DeepSeek-V3 with every kind they take); and a compile
with no graph break on the module path."""

import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds, experts, unpatch
from speedlight.pipeline.model_check import check_models
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import KEEPING_FAMILIES, batch, build, vocab

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
    report = apply_kinds(model, **EXPERTS_ONLY)
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
    report = apply_kinds(model, **EXPERTS_ONLY)
    assert len(_experts_paths(report)) == 2, str(report)
    ids, labels = batch(vocab(base))
    doc = check_models(base, model, {"input_ids": ids, "labels": labels}, lambda o: o.loss,
                       train=True)
    assert doc["reference"].startswith("float64")
    assert not doc["failed"], (doc["failed"], doc["worst"])
    checked = {c["name"] for c in doc["checks"]}
    assert any(n.endswith("experts.gate_up_proj") for n in checked), sorted(checked)


# what each family keeps as the model has it, and a phrase its reason must hold
KEPT = {"gpt_oss": {"attention": "sink"},
        "deepseek_v3": {"attention": "v_head_dim", "rope": "apply_rotary_pos_emb_interleave"}}


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3"])
def test_gpt_oss_and_deepseek_v3_patched_whole_match_float64(family):
    """Every kind each family takes, its routed experts by moe_experts (gpt-oss's own
    layout and clamped SwiGLU; DeepSeek-V3's behind its group-limited router, beside its
    shared expert), what it keeps named in the report: logits, loss (gpt-oss's with its
    router's auxiliary loss) and every gradient, the routers' included, against a float64
    copy of the original; the auxiliary loss equals the unpatched model's."""
    base = build(family)
    base.config._experts_implementation = "eager"
    model = copy.deepcopy(base)
    with pytest.warns(PatchWarning, match=f"kept for {family}"):
        report = apply_kinds(model)
    kept = dict(report.not_patched)
    assert set(kept) == set(KEPT[family]), report.not_patched
    for kind, phrase in KEPT[family].items():
        assert phrase in kept[kind] and kind not in report.patched, kept[kind]
    experts_paths = _experts_paths(report)
    assert len(experts_paths) == (2 if family == "gpt_oss" else 1), report.patched["mlp"]
    assert all("registry:" in p for p in experts_paths)
    for kind in ("rms_norm", "decoder_layer", "cross_entropy", "linear_cross_entropy"):
        assert report.count(kind) >= 1, kind
    assert report.count("rope") == (2 if family == "gpt_oss" else 0)
    ids, labels = batch(vocab(base))
    inputs = {"input_ids": ids, "labels": labels}
    if family == "gpt_oss":
        inputs["output_router_logits"] = True
    counter = LaunchCounter()
    with counter.active():
        doc = check_models(base, model, inputs, lambda o: o.loss, train=True)
    assert "_moe_gate_up_kernel" in counter.kernels and "_moe_gate_bwd_kernel" in counter.kernels
    assert not doc["failed"], (doc["failed"], doc["worst"])
    checked = {c["name"] for c in doc["checks"]}
    router = "mlp.router.weight" if family == "gpt_oss" else "mlp.gate.weight"
    for name in ("logits", "experts.gate_up_proj", "experts.down_proj", router):
        assert any(n.endswith(name) for n in checked), (name, sorted(checked))
    if family == "gpt_oss":
        assert any(n.endswith("experts.gate_up_proj_bias") for n in checked)
        with torch.no_grad():
            ours, theirs = model(**inputs), base(**inputs)
        assert theirs.aux_loss is not None
        torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, **TOL)
    unpatch(model)
    assert model.config._experts_implementation == "eager"
    assert not any("forward" in m.__dict__ or experts.FORWARD_ATTR in m.__dict__
                   for m in model.modules())


def test_module_path_compiles_whole(monkeypatch):
    """The instance-forward path (transformers without the registry) traces in one graph
    with no break, forward and backward (AOT autograd), and matches eager."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(experts, "experts_registry", lambda: None)
    model = build("qwen3_moe")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        report = apply_kinds(model, attention=False)
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


@pytest.mark.parametrize("family", KEEPING_FAMILIES)
def test_gpt_oss_and_deepseek_v3_patched_trace_whole(family):
    """gpt-oss patched (its experts by the registry, their transposed views and bias
    arguments; its own attention with sinks) and DeepSeek-V3 (its latent attention and
    RoPE kept) trace in one graph with no break (tests/patching/test_compile.py holds the
    other families)."""
    from torch._dynamo.utils import counters

    model = build(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)  # its attention is kept, and says so
        apply_kinds(model)
    ids, labels = batch(vocab(model))
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    loss = compiled(input_ids=ids, labels=labels).loss
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()
    torch.testing.assert_close(loss, model(input_ids=ids, labels=labels).loss, **TOL)
