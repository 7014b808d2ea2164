"""Advice: the fusions found in the default model, and what each estimate is made of."""

import dataclasses

import pytest
import torch

from speedlight import hardware
from speedlight.profile import advice
from speedlight.workloads import models
from speedlight.spec import Case
from tests.bench.toy_specs import TOY
from tests.profile.util import profile_model


def by_op(doc):
    return {a["op"]: a for a in doc["advice"]}


def test_default_model_training_lists_the_fusions_with_estimates(train_run):
    adv = by_op(train_run["doc"])
    assert {"rms_norm", "add_rms_norm", "swiglu", "rope", "cross_entropy"} <= set(adv)
    for op in ("rms_norm", "swiglu", "rope", "cross_entropy"):
        a = adv[op]
        assert a["bytes_removed"] > 0 and a["time_saved_s"] > 0, op
        assert a["time_saved_s"] == pytest.approx(a["bytes_removed"] / train_run["doc"]["target"]["bandwidth"])
        assert a["launches_removed"] > 0, op
    # two layers: two MLPs, RoPE on q and k in each (one rope call rotates both), one norm
    # not fed by a residual add
    assert (adv["swiglu"]["instances"], adv["rope"]["instances"], adv["rms_norm"]["instances"],
            adv["add_rms_norm"]["instances"]) == (2, 2, 1, 4)
    assert adv["rms_norm"]["modules"] == ["model.layers.0.input_layernorm"]
    # SwiGLU keeps silu(gate) for backward, cross-entropy the [tokens, vocab] log-probabilities;
    # speedlight's keep nothing besides their gradients (Cost.saved 0)
    seq, vocab, inter = 16, train_run["doc"]["model"]["vocab_size"], train_run["doc"]["model"]["intermediate_size"]
    assert adv["swiglu"]["memory_saved_bytes"] == 2 * seq * inter * 4
    assert adv["cross_entropy"]["memory_saved_bytes"] == seq * vocab * 4
    # the lm_head and its loss fused: available, saving the logits themselves too ...
    lce = adv["linear_cross_entropy"]
    assert lce["status"] == "available"
    # ... less the chunk of logits its schedule holds: at 16 tokens one chunk is all of them
    assert lce["memory_saved_bytes"] == adv["cross_entropy"]["memory_saved_bytes"]
    saved = [a["time_saved_s"] for a in train_run["doc"]["advice"]]
    assert saved == sorted(saved, reverse=True)


def test_inference_has_no_cross_entropy(infer_run):
    adv = by_op(infer_run["doc"])
    assert {"rms_norm", "swiglu", "rope"} <= set(adv) and "cross_entropy" not in adv


def test_swiglu_estimate_by_hand():
    """silu(gate) * up on [N, I] fp32, forward and backward: the chain moves
    silu 2, mul 3, two backward muls 3 each, silu_backward 3 = 14 x N·I·4 bytes; the fused
    op reads gate, up and writes out (3), then reads dy, gate, up and writes dgate, dup (5)."""
    torch.manual_seed(0)
    w = models.build("llama-3-8b", batch=1, seq=8, train=True, dtype=torch.float32,
                     device=torch.device("cpu"), layers=1)
    _, res, _ = profile_model(w.model, w.inputs, loss_fn=lambda out: out.loss)
    n = 8 * w.config["intermediate_size"] * 4
    roof = hardware.roof_for(hardware.DEVICES["h100-sxm"])
    (swiglu,) = [a for a in advice.advise(res["rows"], [], roof) if a["op"] == "swiglu"]
    assert (swiglu["unfused_bytes"], swiglu["fused_bytes"]) == (14 * n, 8 * n)
    assert swiglu["time_saved_s"] == 6 * n / roof.bandwidth


def test_each_chain_is_costed_by_its_opspec_at_the_case_it_recognised():
    """One count of each cost: the bytes advice gives a fused op are its OpSpec's cost of
    the Case its recogniser built from the chain's tensors (forward and backward), the
    memory it holds its Cost.saved; the Cases, by hand, for one Llama layer of 8 tokens."""
    from speedlight import registry
    from speedlight.profile.patterns import find_chains

    torch.manual_seed(0)
    w = models.build("llama-3-8b", batch=1, seq=8, train=True, dtype=torch.float32,
                     device=torch.device("cpu"), layers=1)
    cap, res, _ = profile_model(w.model, w.inputs, loss_fn=lambda out: out.loss)
    roof = hardware.roof_for(hardware.DEVICES["h100-sxm"])
    cfg = w.config
    heads, dim = cfg["num_attention_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    expected = {
        "add_rms_norm": {"rows": 8, "hidden": cfg["hidden_size"]},
        "rms_norm": {"rows": 8, "hidden": cfg["hidden_size"]},
        "swiglu": {"rows": 8, "intermediate": cfg["intermediate_size"]},
        "rope": {"batch": 1, "seq": 8, "heads": heads, "kv": cfg["num_key_value_heads"],
                 "dim": dim, "rot": dim},
        "cross_entropy": {"tokens": 8, "vocab": cfg["vocab_size"]},
        "linear_cross_entropy": {"tokens": 8, "hidden": cfg["hidden_size"],
                                 "vocab": cfg["vocab_size"]},
    }
    seen = set()
    for c in find_chains(res["rows"], cap.calls, registry.builtin_specs()):
        spec = registry.builtin_spec(c.op)
        fwd, bwd = spec.cost(c.case, "fwd"), spec.cost(c.case, "bwd")
        got = advice.savings(spec, c, res["rows"], roof, train=True)
        assert got["fused_bytes"] == fwd.bytes + bwd.bytes, c.op
        assert c.case.dtype == torch.float32 and c.case.op == c.op
        if c.op in expected:
            assert c.case.shape == expected[c.op], c.op
            seen.add(c.op)
    assert seen == set(expected)
    # the forward's rstd is what an RMSNorm keeps for its backward
    assert registry.builtin_spec("rms_norm").cost(
        Case("rms_norm", (("rows", 64), ("hidden", 256))), "fwd").saved == 4 * 64


def test_gemma_geglu_offset_norm_and_eager_attention():
    torch.manual_seed(0)
    w = models.build("gemma-2-9b", batch=1, seq=8, train=True, dtype=torch.float32,
                     device=torch.device("cpu"), layers=1)
    _, res, _ = profile_model(w.model, w.inputs, loss_fn=lambda out: out.loss)
    adv = {a["op"]: a for a in advice.advise(res["rows"], [], hardware.roof_for(hardware.DEVICES["h200"]))}
    assert {"geglu", "attention", "rope", "cross_entropy"} <= set(adv)
    assert adv["attention"]["status"] == "available" and adv["attention"]["memory_saved_bytes"] > 0
    team = [dataclasses.replace(TOY, name="attention")]  # a team's own attention (--spec FILE)
    roof = hardware.roof_for(hardware.DEVICES["h200"])
    adv = {a["op"]: a for a in advice.advise(res["rows"], [], roof, specs=team)}
    assert adv["attention"]["status"] == "available"


def test_module_class_chains_need_the_module_calls():
    torch.manual_seed(0)
    w = models.build("gemma-2-9b", batch=1, seq=8, train=False, dtype=torch.float32,
                     device=torch.device("cpu"), layers=1)
    cap, res, _ = profile_model(w.model, w.inputs, train=False)
    adv = {a["op"]: a for a in advice.advise(res["rows"], cap.calls, hardware.roof_for(hardware.DEVICES["h200"]))}
    assert "offset=1" in adv["rms_norm"]["note"]


def test_sdpa_attention_is_offered_as_attention():
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    _, res, _ = profile_model(Block(), {"q": q, "k": k, "v": v}, train=False)
    adv = {a["op"]: a for a in advice.advise(res["rows"], [], hardware.roof_for(hardware.DEVICES["h200"]))}
    assert adv["attention"]["status"] == "available"
    assert adv["attention"]["pattern"].startswith("SDPA") and "kernel speed" in adv["attention"]["note"]
