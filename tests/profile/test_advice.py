"""Advice: the fusions found in the default model, and what each estimate is made of."""

import dataclasses

import pytest
import torch

from speedlight import hardware
from speedlight.profile import advice
from speedlight.workloads import models
from speedlight.profile.patterns import Chain
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
    # two layers: two MLPs, RoPE on q and k in each, one norm not fed by a residual add
    assert (adv["swiglu"]["instances"], adv["rope"]["instances"], adv["rms_norm"]["instances"],
            adv["add_rms_norm"]["instances"]) == (2, 4, 1, 4)
    assert adv["rms_norm"]["modules"] == ["model.layers.0.input_layernorm"]
    # SwiGLU keeps silu(gate) for backward, cross-entropy the [tokens, vocab] log-probabilities
    seq, vocab, inter = 16, train_run["doc"]["model"]["vocab_size"], train_run["doc"]["model"]["intermediate_size"]
    assert adv["swiglu"]["memory_saved_bytes"] == 2 * seq * inter * 4
    assert adv["cross_entropy"]["memory_saved_bytes"] == seq * vocab * 4 - seq * 4  # less the lse kept
    # the lm_head and its loss fused: available, saving the logits themselves too
    lce = adv["linear_cross_entropy"]
    assert lce["status"] == "available"
    assert lce["memory_saved_bytes"] > adv["cross_entropy"]["memory_saved_bytes"]
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


def test_fused_bytes_by_hand():
    x = {"shape": [4, 16, 256], "dtype": "bf16", "stride": [4096, 256, 1]}
    w = {"shape": [256], "dtype": "bf16", "stride": [1]}
    norm = Chain("rms_norm", "", set(), None, {"x": x, "weight": w, "out": x})
    n, rows = 4 * 16 * 256 * 2, 64
    # forward: x, w, y, rstd; backward: dy, x, w, rstd, dx, dw
    assert advice.fused_bytes(norm, train=False) == (n + 512 + n + 4 * rows, 4 * rows)
    assert advice.fused_bytes(norm, train=True)[0] == (2 * n + 512 + 4 * rows) + (3 * n + 2 * 512 + 4 * rows)
    logits = {"shape": [64, 1000], "dtype": "fp32", "stride": [1000, 1]}
    target = {"shape": [64], "dtype": "int64", "stride": [1]}
    ce = Chain("cross_entropy", "", set(), None, {"logits": logits, "target": target})
    # forward: logits, targets, lse, loss; backward: logits, lse, targets, dlogits
    assert advice.fused_bytes(ce, train=True) == (
        (256000 + 512 + 256 + 4) + (256000 + 256 + 512 + 256000), 256)
    add_norm = Chain("add_rms_norm", "", set(), None, {"x": x, "weight": w, "out": x, "residual": x})
    # and the residual read, the sum written; backward reads the gradient on the sum too
    assert advice.fused_bytes(add_norm, train=True)[0] == advice.fused_bytes(norm, train=True)[0] + 3 * n
    cos = {"shape": [1, 1, 16, 64], "dtype": "fp32", "stride": [1024, 1024, 64, 1]}
    q = {"shape": [1, 4, 16, 64], "dtype": "fp32", "stride": [4096, 64, 256, 1]}
    rope = Chain("rope", "", set(), None, {"x": q, "cos": cos, "sin": cos, "out": q})
    assert advice.fused_bytes(rope, train=False) == ((4096 + 1024 + 1024 + 4096) * 4, 0)
    scores = {"shape": [64, 1000], "dtype": "bf16", "stride": [1000, 1]}
    sm = Chain("softmax", "", set(), None, {"x": logits, "out": scores})
    # read x (fp32), write y (bf16); backward reads y and dy, writes dx
    assert advice.fused_bytes(sm, train=True) == (256000 + 128000 + 3 * 128000, 0)
    kv = {"shape": [1, 2, 16, 64], "dtype": "fp32", "stride": [2048, 1024, 64, 1]}
    att = Chain("attention", "", set(), None, {"q": q, "k": kv, "v": kv, "out": q})
    lse = 4 * 4 * 16
    # forward: q, k, v, out, lse; backward: out, dout, q, k, v, lse, then dq, dk, dv
    assert advice.fused_bytes(att, train=False) == ((4096 + 2048 + 2048 + 4096) * 4 + lse, lse)
    assert advice.fused_bytes(att, train=True)[0] == (4096 + 2048 + 2048 + 4096) * 4 + lse + \
        (2 * 4096 + 4096 + 2 * 2048) * 4 + lse + (4096 + 2 * 2048) * 4
    h = {"shape": [64, 256], "dtype": "bf16", "stride": [256, 1]}
    wt = {"shape": [256, 1000], "dtype": "bf16", "stride": [1, 256]}
    flce = Chain("linear_cross_entropy", "", set(), None,
                 {"hidden": h, "weight": wt, "target": target, "logits": logits})
    # read h, W, targets, write the loss; in training also dh and dW. Kept instead of the
    # logits: what the default memory budget's schedule holds, one chunk of all 64 tokens'
    # logits in the lm_head's bf16 (d_weight summed in itself: no fp32 accumulator)
    assert advice.fused_bytes(flce, train=True) == (32768 + 512000 + 512 + 4 + 32768 + 512000,
                                                    64 * 1000 * 2)
    assert advice.fused_bytes(flce, train=False)[1] == 64 * 1000 * 2


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
