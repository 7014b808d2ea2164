"""The families added with mixture-of-experts support: their training curves, the experts
module on its own, and the load-balancing loss on the fused-loss path. (Logits, loss,
every gradient and unpatch of each family: test_patch.py, parametrized over them.)"""
import copy
import warnings

import pytest
import torch

pytest.importorskip("transformers")

from speedlight.patching import PatchWarning, apply_kinds
from speedlight.patching import experts as experts_mod
from speedlight.patching.families import FAMILIES
from speedlight.verify.harness import LaunchCounter
from tests.patching.tiny_models import NEW_FAMILIES, batch, build, vocab

TOL = dict(rtol=2e-4, atol=2e-5)


# SmolLM3 and Ministral are Llama's layer with NoPE layers / a sliding window: their
# training is Llama's (test_patch.py's twenty steps); the rest each bring a form of their own
TRAINED = [f for f in NEW_FAMILIES if f not in ("smollm3", "ministral")]


@pytest.mark.parametrize("family", TRAINED)
def test_training_steps_give_matching_loss_curves(family):
    """Two AdamW steps of the original and of the patched model on one batch (attention
    left out: its interpreter cost is paid per family in test_patch.py) give the same
    loss curve."""
    curves = []
    for do_patch in (False, True):
        model = build(family, seed=11)
        if do_patch:
            apply_kinds(model, attention=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        ids, labels = batch(vocab(model), batch=1, seq=8, seed=100)
        for _ in range(2):
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            losses.append(model(input_ids=ids, labels=labels).loss.item())
        curves.append(losses)
    base, ours = curves
    assert base[-1] < base[0], f"{family} did not train: {base}"
    assert max(abs(a - b) for a, b in zip(base, ours)) < 1e-3, (base, ours)


def _experts(family: str):
    model = build(family)
    return next(m for m in model.modules() if type(m).__name__.endswith("Experts"))


def test_experts_follow_the_given_routing_and_skip_sentinels():
    """The patched experts module against its own forward on one routing, with a token
    routed to the expert-parallel sentinel (index == num_experts) and an expert no token
    picks: output and the gradients of input, routing weights and both 3-D weights."""
    experts = _experts("mixtral")
    # the reference: the module's own loop (the default grouped_mm reads past the last
    # expert's weights for a sentinel unless expert parallelism is set up)
    experts.config._experts_implementation = "eager"
    n = experts.gate_up_proj.shape[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, experts.gate_up_proj.shape[2], generator=g, requires_grad=True)
    index = torch.tensor([[0, 2], [2, 0], [1, n], [0, 1], [2, 1], [1, 0], [0, 2]])
    weights = torch.rand(7, 2, generator=g).requires_grad_()
    params = [x, weights, experts.gate_up_proj, experts.down_proj]
    # transformers 5.17's loop refuses an index past the last expert (one_hot), newer ones
    # skip it: on every version, the reference routes the sentinel's slot to expert 0 with
    # weight 0, which adds nothing to any output or gradient, and gives the sentinel's
    # routing weight the gradient 0 a slot no expert takes has
    routed = index < n
    y0 = experts(x, torch.where(routed, index, 0), weights * routed)
    grads0 = torch.autograd.grad(y0.square().sum(), params)
    patched = copy.deepcopy(experts)
    from speedlight.patching.experts import experts_forward
    import types
    patched.forward = types.MethodType(experts_forward("silu"), patched)
    params[2:] = [patched.gate_up_proj, patched.down_proj]
    counter = LaunchCounter()
    with counter.active():
        y1 = patched(x, index, weights)
    assert counter.kernels.count("_moe_gate_up_kernel") == 1, counter.kernels  # one launch
    grads1 = torch.autograd.grad(y1.square().sum(), params)
    torch.testing.assert_close(y1, y0, **TOL)
    for name, g0, g1 in zip(("x", "weights", "gate_up_proj", "down_proj"), grads0, grads1):
        torch.testing.assert_close(g1, g0, **TOL, msg=lambda m: f"{name}: {m}")
    assert grads1[3][n - 1].abs().sum() == 0  # expert 3: no token, no gradient


@pytest.mark.parametrize("family", ["gpt_oss", "deepseek_v3"])
def test_gpt_oss_and_deepseek_v3_experts_follow_their_own_loop(family, monkeypatch):
    """The experts patched by the module path (the instance's forward: the GPU machines'
    transformers 5.17, forced here by hiding the registry) against the installed module's
    own loop on one routing with a sentinel slot and an expert no token picks: output and
    the gradients of input, routing weights and every weight and bias. gpt-oss's forward
    is called with its own keyword names, as its MLP may call it."""
    monkeypatch.setattr(experts_mod, "experts_registry", lambda: None)
    model = build(family)
    model.config._experts_implementation = "eager"
    reference = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)  # the kinds the family keeps
        report = apply_kinds(model, rms_norm=False, rope=False, cross_entropy=False,
                       attention=False, linear_cross_entropy=False, decoder_layer=False)
    assert any("by moe_experts, module:" in m for m in report.patched["mlp"]), report.patched
    names = FAMILIES[family].experts_classes  # DeepSeek-V3's class had another name
    ours = next(m for m in model.modules() if type(m).__name__ in names)
    theirs = next(m for m in reference.modules() if type(m).__name__ in names)
    assert "forward" in ours.__dict__
    n, hidden = ours.gate_up_proj.shape[0], ours.down_proj.shape[2 if family == "gpt_oss" else 1]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, hidden, generator=g, requires_grad=True)
    index = torch.tensor([[0, 2], [2, 0], [1, n], [0, 1], [2, 1], [1, 0]])  # expert n-1: none
    weights = torch.rand(6, 2, generator=g).requires_grad_()
    routed = index < n  # the reference: the sentinel's slot to expert 0 with weight 0
    keywords = ["router_indices", "routing_weights"] if family == "gpt_oss" else None
    outputs, grads = [], []
    for module, idx, w in ((theirs, torch.where(routed, index, 0), weights * routed),
                           (ours, index, weights)):
        y = module(x, **dict(zip(keywords, (idx, w)))) if keywords else module(x, idx, w)
        params = [p for _, p in sorted(module.named_parameters())]
        outputs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), [x, weights] + params))
    torch.testing.assert_close(outputs[1], outputs[0], **TOL)
    labels = ["x", "weights"] + [n for n, _ in sorted(ours.named_parameters())]
    for name, g0, g1 in zip(labels, *grads, strict=True):
        torch.testing.assert_close(g1, g0, **TOL, msg=lambda m: f"{name}: {m}")
    assert grads[1][labels.index("down_proj")][n - 1].abs().sum() == 0  # no token, no gradient


def test_gpt_oss_experts_with_another_gate_are_reported_not_patched():
    """gpt-oss's _apply_gate is probed against the clamped SwiGLU moe_experts computes: a
    module whose gate differs (here, up and gate swapped) keeps its own forward, and the
    report names the field."""
    model = build("gpt_oss")
    for m in model.modules():
        if type(m).__name__ == "GptOssExperts":
            m._apply_gate = lambda z, m=m: type(m)._apply_gate(m, z.flip(-1))
    with pytest.warns(PatchWarning, match="_apply_gate is not the clamped SwiGLU"):
        report = apply_kinds(model, attention=False)
    assert "mlp" not in report.patched and report.count("rms_norm") == 5


def test_patched_experts_hold_no_host_sync(monkeypatch):
    """The patched experts' forward and backward read no value back to the host (what a
    CUDA graph and torch.compile's fullgraph need): item, tolist, bool and nonzero raise."""
    import types
    from speedlight.patching.experts import experts_forward

    experts = _experts("qwen3_moe")
    experts.forward = types.MethodType(experts_forward("silu"), experts)
    n = experts.gate_up_proj.shape[0]
    x = torch.randn(5, experts.gate_up_proj.shape[2], requires_grad=True)
    index = torch.tensor([[0, 1], [n, 0], [1, 1], [0, n - 1], [1, 0]])
    weights = torch.rand(5, 2, requires_grad=True)

    def sync(*args, **kwargs):
        raise AssertionError("a host sync")

    for name in ("item", "tolist", "__bool__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    y = experts(x, index, weights)
    torch.autograd.grad(y.square().sum(), (x, weights, experts.gate_up_proj))


def test_experts_in_another_layout_are_reported_not_patched():
    model = build("qwen2_moe")
    for m in model.modules():
        if type(m).__name__.endswith("Experts"):
            m.is_transposed = True
    with pytest.warns(PatchWarning, match="is_transposed is True"):
        report = apply_kinds(model)
    assert [m for m in report.patched["mlp"] if "experts" in m] == []
    assert report.count("mlp") == 2  # the shared experts still are


def test_load_balancing_loss_is_added_on_the_fused_path():
    """output_router_logits: the family's auxiliary loss (router_aux_loss_coef times it) is
    added to the loss without logits, and returned with the router logits, as the
    original forward does."""
    base = build("qwen3_moe")
    model = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PatchWarning)
        apply_kinds(model)
    ids, labels = batch(vocab(model))
    ours = model(input_ids=ids, labels=labels, output_router_logits=True)
    theirs = base(input_ids=ids, labels=labels, output_router_logits=True)
    assert ours.logits is None and type(ours) is type(theirs)
    assert theirs.aux_loss is not None and base.router_aux_loss_coef > 0
    torch.testing.assert_close(ours.aux_loss, theirs.aux_loss, **TOL)
    torch.testing.assert_close(ours.loss, theirs.loss, **TOL)
    assert len(ours.router_logits) == len(theirs.router_logits)
    plain = model(input_ids=ids, labels=labels)  # the config's default: no auxiliary loss
    assert plain.aux_loss is None
    torch.testing.assert_close(plain.loss, base(input_ids=ids, labels=labels).loss, **TOL)


def test_qwen2_vl_patches_its_text_decoder_alone():
    """Qwen2-VL: the text decoder's attention reads text_config, which alone is switched to
    speedlight; the vision tower's blocks (other classes, their own sub-config) stay as
    they are, and unpatch restores both configs."""
    model = build("qwen2_vl")
    text, vision = model.config.text_config, model.config.vision_config
    before = (text._attn_implementation, vision._attn_implementation)
    report = apply_kinds(model)
    assert text._attn_implementation == "speedlight"
    assert vision._attn_implementation == before[1]
    assert not any(p.startswith("model.visual") for paths in report.patched.values()
                   for p in paths)
    from speedlight.patching import unpatch
    unpatch(model)
    assert (text._attn_implementation, vision._attn_implementation) == before


@pytest.mark.parametrize("name", ["granite-3.0-1b-a400m", "qwen2-vl-7b"])
def test_the_projection_builds_and_runs_the_patched_family(name):
    """The profile's projection (fake tensors, no routing values) of a patched mixture of
    experts, with its real expert count and top-k, and of Qwen2-VL's text decoder."""
    from speedlight import shapes
    from speedlight.profile import project
    mode = project.fake_mode()
    w = project.build_workload(name, batch=1, seq=64, train=True, recipe=project.RECIPES["bf16"],
                               dtype=None, layers=1, seed=0, overrides=None, mode=mode)
    m = shapes.MODELS[name]
    experts = [x for x in w.model.modules() if type(x).__name__.endswith("Experts")]
    assert [x.gate_up_proj.shape[0] for x in experts] == ([m.experts] if m.experts else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        report = apply_kinds(w.model)
    assert report.count("mlp") >= 1 and report.count("rms_norm") == 3
    pj = project.project_step(w, train=True, recipe=project.RECIPES["bf16"], mode=mode)
    gated = "moe_experts" if m.experts else "glu"
    assert any(gated in r.name for r in pj.capture.ops), sorted({r.name for r in pj.capture.ops})
