"""The Liger-Kernel mapping: each speedlight op (through the Liger function its OpSpec
names) to the Liger call computing the same thing, with the reason when a case has no
Liger counterpart."""

import dataclasses

from types import SimpleNamespace

import pytest
import torch

from speedlight import registry
from speedlight.candidates import liger
from speedlight.spec import Case


class StubF:
    """Records the Liger functional call an adapter makes."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("liger_"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return args[0]
        return call


CASE = Case("x", {"rows": 2})


def adapter(op):
    """The Liger adapter of built-in op `op`, through its OpSpec's peers."""
    return liger.ADAPTERS[registry.builtin_spec(op).peers["liger"]]


def _adapt(op, inputs, case=CASE):
    f = StubF()
    fn, mutates = adapter(op)(f, inputs, case)
    fn(**inputs)
    (call,) = f.calls
    return call, mutates


def test_rms_norm_llama_and_gemma_casting():
    x, w = torch.randn(2, 8), torch.randn(8)
    (name, args, kw), mutates = _adapt("rms_norm", {"x": x, "weight": w, "eps": 1e-5, "offset": 0.0})
    assert name == "liger_rms_norm" and args[:3] == (x, w, 1e-5)
    assert kw == {"offset": 0.0, "casting_mode": "llama", "in_place": False} and not mutates
    (_, _, kw), _ = _adapt("rms_norm", {"x": x, "weight": w, "eps": 1e-5, "offset": 0.0,
                                        "in_place": True})
    assert kw["in_place"] is True  # the case's in_place is Liger's
    (_, _, kw), _ = _adapt("rms_norm", {"x": x, "weight": w, "eps": 1e-6, "offset": 1.0})
    assert kw["casting_mode"] == "gemma" and kw["offset"] == 1.0
    with pytest.raises(liger.Unsupported, match="weight"):
        adapter("rms_norm")(StubF(), {"x": x, "weight": None}, CASE)


def test_cross_entropy_says_it_writes_its_inputs():
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    (name, args, kw), mutates = _adapt("cross_entropy", {"logits": logits, "target": target,
                                                         "ignore_index": -1})
    assert name == "liger_cross_entropy" and mutates and kw["ignore_index"] == -1


def test_rope_follows_the_layout_of_q():
    b, h, s, d = 1, 2, 5, 4
    cos, sin = torch.randn(1, s, d), torch.randn(1, s, d)
    q_bhsd, k_bhsd = torch.randn(b, h, s, d), torch.randn(b, 1, s, d)
    inputs = {"q": q_bhsd, "k": k_bhsd, "cos": cos, "sin": sin, "position_ids": None,
              "unsqueeze_dim": 1, "interleaved": False}
    (name, args, _), _ = _adapt("rope", inputs)
    assert name == "liger_rope" and args[0] is q_bhsd
    # [batch, seq, heads, dim]: Liger gets the [batch, heads, seq, dim] view, and back
    q_bshd, k_bshd = torch.randn(b, s, h, d), torch.randn(b, s, 1, d)
    f = StubF()
    fn, _ = adapter("rope")(f, dict(inputs, q=q_bshd, k=k_bshd, unsqueeze_dim=2), CASE)
    f.__dict__["liger_rope"] = lambda q, k, cos, sin: (q * 2, k * 3)
    qo, ko = fn(q=q_bshd, k=k_bshd, cos=cos, sin=sin)
    torch.testing.assert_close(qo, q_bshd * 2)
    torch.testing.assert_close(ko, k_bshd * 3)
    with pytest.raises(liger.Unsupported, match="interleaved"):
        adapter("rope")(f, dict(inputs, interleaved=True), CASE)
    with pytest.raises(liger.Unsupported, match="position_ids"):
        adapter("rope")(f, dict(inputs, position_ids=torch.zeros(1, s)), CASE)


def test_the_mapping_takes_the_inputs_the_registered_ops_make():
    """For every built-in op Liger has a counterpart of, the adapter understands the inputs
    of the op's quick cases (so a renamed input shows here, not on the GPU); what it turns
    down, it turns down for a reason of the case, not of the names."""
    for spec in registry.builtin_specs():
        if "liger" not in spec.peers:
            continue
        accepted = 0
        for case in spec.cases("quick"):
            inputs = spec.make_inputs(case, "cpu")
            try:
                adapter(spec.name)(StubF(), inputs, case)
                accepted += 1
            except liger.Unsupported as e:
                assert "takes inputs" not in str(e), (spec.name, str(e))
        assert accepted, f"the Liger mapping of {spec.name} accepts none of its quick cases"


@pytest.mark.parametrize("op,inputs,fn", [
    ("swiglu", {"gate": 1, "up": 2}, "liger_swiglu"),
    ("geglu", {"gate": 1, "up": 2}, "liger_geglu"),
    ("layer_norm", {"x": 1, "weight": 2, "bias": 3, "eps": 1e-5}, "liger_layer_norm"),
    ("add_rms_norm", {"x": 1, "residual": 2, "weight": 3, "eps": 1e-6}, "liger_fused_add_rms_norm"),
])
def test_other_ops_call_their_liger_function(op, inputs, fn):
    (name, args, _), _ = _adapt(op, inputs)
    assert name == fn and args[0] == 1


def test_unexpected_input_names_are_an_explained_unsupported():
    with pytest.raises(liger.Unsupported, match=r"takes inputs \(gate, up\).*gives \(a, b\)"):
        adapter("swiglu")(StubF(), {"a": 1, "b": 2}, CASE)
    spec = registry.builtin_spec("softmax")
    with pytest.raises(liger.Unsupported, match="no counterpart of my_op"):
        liger.adapt(dataclasses.replace(spec, name="my_op", peers={}), {}, CASE)
    with pytest.raises(liger.Unsupported, match="names Liger's liger_nope, which"):
        liger.adapt(dataclasses.replace(spec, peers={"liger": "liger_nope"}), {}, CASE)


def test_every_liger_peer_named_by_an_op_has_an_adapter():
    named = {s.peers["liger"] for s in registry.builtin_specs() if "liger" in s.peers}
    assert named == set(liger.ADAPTERS)


def test_softmax_over_another_dim_is_unsupported():
    with pytest.raises(liger.Unsupported, match="last dim"):
        adapter("softmax")(StubF(), {"x": torch.randn(3, 4), "dim": 0}, CASE)


def test_real_liger_softmax_matches_torch_on_the_interpreter():
    pytest.importorskip("liger_kernel")
    x = torch.randn(3, 100)
    fn, _ = liger.adapt(registry.builtin_spec("softmax"), {"x": x, "dim": -1}, CASE)
    torch.testing.assert_close(fn(x=x, dim=-1), torch.softmax(x, -1))


def test_cross_entropy_passes_weight_z_loss_and_extras_to_liger():
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    w = torch.rand(10)
    inputs = {"logits": logits, "target": target, "weight": w, "label_smoothing": 0.1,
              "return_token_accuracy": True}
    f, seen = StubF(), {}

    def liger_cross_entropy(logits, target, **kw):
        seen.update(kw)
        return SimpleNamespace(loss=1, z_loss=None, token_accuracy=2, predicted_tokens=None)
    f.__dict__["liger_cross_entropy"] = liger_cross_entropy
    fn, _ = adapter("cross_entropy")(f, inputs, CASE)
    assert fn(**inputs) == (1, None, 2, None)
    assert seen["weight"] is w and seen["return_token_accuracy"] and seen["label_smoothing"] == 0.1
    with pytest.raises(liger.Unsupported, match="z-loss ignores the class weights"):
        adapter("cross_entropy")(StubF(), dict(inputs, z_loss=1e-3), CASE)
    target[0] = -100
    with pytest.raises(liger.Unsupported, match="-1 at ignored"):
        adapter("cross_entropy")(StubF(), dict(inputs, return_predicted_tokens=True), CASE)


def test_real_liger_cross_entropy_extras_match_speedlight():
    """(Liger's weighted path does not run under the Triton interpreter: it calls .to on a
    Python float; the stub test above checks the weight is passed.)"""
    pytest.importorskip("liger_kernel")
    import speedlight

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    target = torch.randint(0, 50, (6,), generator=g)
    kw = dict(reduction="mean", label_smoothing=0.1, z_loss=1e-3, return_z_loss=True,
              return_token_accuracy=True, return_predicted_tokens=True)
    fn, _ = liger.adapt(registry.builtin_spec("cross_entropy"),
                        {"logits": logits, "target": target, **kw}, CASE)
    theirs = fn(logits=logits.clone(), target=target, **kw)
    ours = speedlight.cross_entropy(logits, target, **kw)
    torch.testing.assert_close(theirs[0], ours.loss)
    torch.testing.assert_close(theirs[1], ours.z_loss)
    torch.testing.assert_close(theirs[2], ours.token_accuracy)
    assert torch.equal(theirs[3], ours.predicted_tokens)


def test_linear_cross_entropy_baselines_map_the_op_inputs():
    """Liger's fused linear cross-entropy gets the op's inputs by name; torch's own
    F.linear_cross_entropy (where torch has it) computes the reference's loss, and says
    why not where it has no such option."""
    from speedlight import reference
    from speedlight.candidates import Unsupported
    from speedlight.candidates.torch_ops import ADAPTERS

    h, w = torch.randn(6, 8), torch.randn(20, 8)
    t = torch.randint(0, 20, (6,))
    inputs = {"hidden": h, "weight": w, "target": t, "bias": None, "label_smoothing": 0.1}
    (name, args, kw), _ = _adapt("linear_cross_entropy", inputs)
    assert name == "liger_fused_linear_cross_entropy" and args[0] is h and args[1] is w
    assert kw["label_smoothing"] == 0.1
    with pytest.raises(Unsupported, match="smoothing|no F.linear_cross_entropy"):
        ADAPTERS["linear_cross_entropy"](inputs)
    inputs["label_smoothing"] = 0.0
    try:
        fn = ADAPTERS["linear_cross_entropy"](inputs)
    except Unsupported as e:
        pytest.skip(str(e))
    torch.testing.assert_close(fn(**inputs), reference.linear_cross_entropy(h, w, t))
    t_all = torch.full((6,), -100)
    assert fn(**dict(inputs, target=t_all)).item() == 0.0
    with pytest.raises(Unsupported, match="softcap"):
        ADAPTERS["linear_cross_entropy"](dict(inputs, softcap=30.0))
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_gated_units_with_multipliers_are_unsupported_by_liger(op):
    """Liger's gated units have no gate or down multiplier: such a case is no Liger row."""
    gate, up = torch.randn(2, 8), torch.randn(2, 8)
    (name, args, _), _ = _adapt(op, {"gate": gate, "up": up})
    assert name == f"liger_{op}" and args == (gate, up)
    with pytest.raises(liger.Unsupported, match="multiplier"):
        adapter(op)(StubF(), {"gate": gate, "up": up, "gate_multiplier": 0.75,
                              "down_multiplier": 2.5}, CASE)


def _moe_inputs(tokens=8, hidden=32, inter=16, experts=4, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    return {"hidden": torch.randn(tokens, hidden, generator=g),
            "top_k_index": index,
            "top_k_weights": torch.softmax(torch.randn(tokens, k, generator=g), -1),
            "gate_up_proj": torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5,
            "down_proj": torch.randn(experts, hidden, inter, generator=g) * inter ** -0.5,
            "activation": "silu", "interleaved": False}


@pytest.mark.parametrize("change,match", [
    ({"activation": "gelu"}, "SwiGLU only; this case's gate unit is gelu"),
    ({"interleaved": True}, "not interleaved rows"),
    ({"gate_up_bias": torch.zeros(4, 32), "down_multiplier": 0.5},
     "no gate_up_bias, down_multiplier"),
    ({"top_k_index": torch.tensor([[0, 4]] * 8)}, "expert-parallel sentinels"),
])
def test_fused_moe_cases_liger_cannot_compute_are_unsupported(change, match):
    with pytest.raises(liger.Unsupported, match=match):
        adapter("moe_experts")(StubF(), dict(_moe_inputs(), **change), CASE)


def test_real_liger_fused_moe_matches_moe_experts_on_the_interpreter():
    """The mapping computes the op: output and every gradient (the routing weights'
    included) as speedlight.moe_experts gives them, in fp32."""
    pytest.importorskip("liger_kernel.ops.fused_moe")
    import speedlight

    inputs = _moe_inputs()
    grads = ("hidden", "top_k_weights", "gate_up_proj", "down_proj")
    for name in grads:
        inputs[name].requires_grad_(True)
    fn, mutates = liger.adapt(registry.builtin_spec("moe_experts"), inputs, CASE)
    out = fn(**inputs)
    ref = speedlight.moe_experts(**{k: v for k, v in inputs.items() if k != "activation"})
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, [inputs[n] for n in grads], dout)
    want = torch.autograd.grad(ref, [inputs[n] for n in grads], dout)
    for name, a, b in zip(grads, got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    assert not mutates
