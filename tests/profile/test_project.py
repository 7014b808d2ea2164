"""The projection: a real-size step recorded on fake tensors, computing nothing.

Proof that it records what a run records: FLOPs per op agree with torch's flop_counter on
the same fake run; the matmul FLOPs of three real configurations equal 6 x (parameters
outside the embedding, lm_head included) x tokens, and attention its formula; the op list
of a small model equals the measured profile's; parameter, gradient and optimizer bytes
equal their exact counts."""

from collections import Counter

import pytest
import torch
from torch.utils import flop_counter

from speedlight import shapes, target
from speedlight.profile import capture, compare, project
from speedlight.workloads import models
from speedlight.profile.command import make_step

transformers = pytest.importorskip("transformers")
BF16 = project.RECIPES["bf16"]


def _fake(name, *, seq, layers=2, batch=1, train=True, recipe=BF16, overrides=None):
    mode = project.fake_mode()
    w = project.build_workload(name, batch=batch, seq=seq, train=train, recipe=recipe, dtype=None,
                               layers=layers, seed=0, overrides=overrides, mode=mode)
    return w, mode


def test_flops_per_op_agree_with_flop_counter_on_the_same_fake_run():
    w, mode = _fake("llama-3-8b", seq=256, layers=1)
    pj = project.project_step(w, train=True, recipe=BF16, mode=mode)
    ours = Counter()
    for r in pj.capture.ops:
        if r.cost is not None and r.cost.flops and r.cost.formula in ("matmul", "attention", "conv"):
            # flop_counter counts the masked half of causal attention; speedlight does not
            causal = r.cost.formula == "attention" and "is_causal=True" in r.scalars
            ours[r.name] += r.cost.flops * (2 if causal else 1)
    counter = flop_counter.FlopCounterMode(display=False)
    with mode, project.GpuDispatch((9, 0)), project._one_sequence_per_row(), counter:
        w.loss_fn(w.call()).backward()
    theirs = Counter({k.__name__: v for k, v in counter.get_flop_counts()["Global"].items()})
    assert {"mm", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_backward"} <= set(theirs)
    for name, n in theirs.items():
        assert ours[name] == n, f"{name}: ours {ours[name]}, flop_counter {n}"


def _matmul_parameters(model) -> int:
    """Parameters outside the embedding, lm_head included (tied or not)."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return total - embed.numel() + (head.numel() if head is embed else 0)


@pytest.mark.parametrize("name", ["llama-3-8b", "qwen2.5-7b", "gemma-2-9b"])
def test_matmul_flops_are_6_n_d_and_attention_its_formula(name):
    batch, seq, layers = 1, 512, 2
    w, mode = _fake(name, seq=seq, layers=layers, batch=batch)
    pj = project.project_step(w, train=True, recipe=BF16, mode=mode)
    cfg = w.model.config
    weights = sum(r.cost.flops for r in pj.capture.ops if r.name in ("mm", "addmm"))
    expect = 6 * _matmul_parameters(w.model) * batch * seq
    assert abs(weights - expect) / expect < 0.03, (weights, expect)
    heads, d = cfg.num_attention_heads, cfg.head_dim
    per_layer = batch * heads * seq * seq * d
    if pj.attention:  # fused kernel, causal: forward 4·BHS²D / 2, backward 10·BHS²D / 2
        assert [a["backend"] for a in pj.attention] == ["flash"]
        attn = sum(r.cost.flops for r in pj.capture.ops if r.cost and r.cost.formula == "attention")
        assert attn == layers * 7 * per_layer
    else:  # eager attention (Gemma 2's soft-capping): QKᵀ and PV, each with two backward bmms
        attn = sum(r.cost.flops for r in pj.capture.ops if r.name == "bmm")
        assert attn == layers * 12 * per_layer


def _layout(t):
    """Shape, dtype and strides; a size-1 dimension's stride addresses nothing, and torch's
    CPU and meta kernels pick different ones."""
    return t["shape"], t["dtype"], [st if n != 1 else None for n, st in zip(t["shape"], t["stride"])]


def _signature(ops):
    """Each op with its module and tensors. Host reads of values (no kernel) are left out; so
    are lift_fresh's outputs: it returns its constant input itself, which fake mode hands
    back as a new (fake) tensor object."""
    return [(r.op, r.phase, r.module,
             [_layout(t) for t in r.inputs + ([] if r.name == "lift_fresh" else r.outputs)])
            for r in ops if r.name != "_local_scalar_dense"]


@pytest.mark.parametrize("train", [True, False], ids=["train", "infer"])
def test_projected_op_list_and_shapes_equal_the_measured_profile(train):
    fp32 = project.RECIPES["fp32"]
    kw = dict(batch=1, seq=16, train=train, dtype=torch.float32, size="small", layers=1, seed=0)
    real = models.build("llama-3-8b", device=torch.device("cpu"), **kw)
    opt = torch.optim.AdamW(real.model.parameters(), lr=1e-4) if train else None
    cap = capture.capture(real.model, make_step(real, opt, train), device=torch.device("cpu"),
                          warmup=1, steps=1, train=train, optimizer=opt, inputs=real.inputs)
    mode = project.fake_mode()
    with mode:
        fake = models.build("llama-3-8b", device=torch.device("cpu"), **kw)
    pj = project.project_step(fake, train=train, recipe=fp32, dispatch="here", mode=mode)
    measured, projected = _signature(cap.ops), _signature(pj.capture.ops)
    assert len(projected) == len(measured)
    for a, b in zip(measured, projected):
        assert a == b


@pytest.mark.parametrize("recipe", ["bf16", "bf16-master", "fp32"])
def test_parameter_gradient_and_optimizer_memory_are_exact(recipe):
    r = project.RECIPES[recipe]
    w, mode = _fake("llama-3-8b", seq=128, layers=1, recipe=r)
    pj = project.project_step(w, train=True, recipe=r, mode=mode)
    mem, exact = pj.capture.memory, project.exact_state_bytes(w.model, r, True)
    n = exact["elements"]
    assert mem["parameters_bytes"] == exact["parameters"] == n * r.params.itemsize
    assert mem["gradients_bytes"] == exact["gradients"] == n * r.params.itemsize
    steps = 4 * len(list(w.model.parameters()))
    per = 2 * r.states.itemsize + (4 if r.master else 0)
    assert mem["optimizer_state_bytes"] == exact["optimizer_state"] == n * per + steps


def test_targets_and_shard_arithmetic():
    w, mode = _fake("llama-3-8b", seq=128, layers=1)
    pj = project.project_step(w, train=True, recipe=BF16, mode=mode)
    c = compare.per_target(pj, w.model, ["h100-sxm", "h200", "b200"], shard=8, train=True, tokens=128)
    rows = {r["target"]: r for r in c["rows"]}
    assert rows["b200"]["floor_s"] < rows["h200"]["floor_s"] < rows["h100-sxm"]["floor_s"]
    mem = pj.capture.memory
    state = sum(mem["at_peak"][k] for k in compare.STATE)
    assert rows["h200"]["sharded_peak_bytes"] == (mem["peak_bytes"] - state + state // 8
                                                  + 2 * c["largest_layer_bytes"])
    assert c["largest_layer"] in ("model.embed_tokens", "lm_head")


def test_vary_moves_the_floor_and_the_memory():
    tgt = target.resolve("h100-sxm")
    v = compare.vary("llama-3-8b", compare.parse_vary(["seq=64,128", "num_key_value_heads=8,2"]),
                     base={"batch": 1, "seq": 64}, target=tgt, train=True, recipe=BF16,
                     dtype=None, layers=1, seed=0)
    by = {(r["field"], r["value"]): r for r in v["rows"]}
    assert by["seq", 128]["floor_s"] > by["seq", 64]["floor_s"]
    assert by["num_key_value_heads", 2]["parameters"] < by["num_key_value_heads", 8]["parameters"]
    assert by["num_key_value_heads", 2]["peak_bytes"] < by["num_key_value_heads", 8]["peak_bytes"]


def test_bad_vary_and_recipe_fail_with_the_argument_named():
    with pytest.raises(ValueError, match="--vary"):
        compare.parse_vary(["seq"])
    with pytest.raises(models.ModelError, match="no field 'not_a_field'"):
        _fake("llama-3-8b", seq=16, layers=1, overrides={"not_a_field": 1})


def test_sdpa_backend_follows_torch_rules():
    q = torch.empty(1, 8, 16, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(1, 2, 16, 128, dtype=torch.bfloat16, device="meta")
    assert project.sdpa_backend(q, k, k, None, 0.0, True, (9, 0))[0] == "flash"
    assert project.sdpa_backend(q, k, k, torch.empty(16, 16, device="meta"), 0.0, False, (9, 0))[0] == "efficient"
    q32, k32 = q.float(), k.float()
    assert project.sdpa_backend(q32, k32, k32, None, 0.0, True, (9, 0))[0] == "efficient"
    odd = torch.empty(1, 8, 16, 7, dtype=torch.float32, device="meta")
    assert project.sdpa_backend(odd, odd, odd, None, 0.0, True, (9, 0))[0] == "math"
    assert shapes.MODELS  # the configurations the projection builds from


def test_command_writes_a_labelled_projection_with_its_comparisons(tmp_path, monkeypatch):
    from speedlight import cli
    from speedlight.profile import schema

    asked = []

    def predictor(spec, case, target):  # inspect's, which compiles: a stand-in here
        asked.append((spec.name, case.id, target.sku.key))
        return {"fwd": {"us": 2.0, "bound": "memory", "sku": target.sku.name},
                "bwd": {"why": "iterations unknown"}}

    monkeypatch.setattr(cli, "_predict", predictor)

    # 512 tokens: below a few hundred, a 1-layer step's floor is the lm_head weight's
    # traffic, and linear_cross_entropy's in-place scaling of d_weight in the backward (a
    # read and a write of it) costs more than the logits it saves
    code = cli.main(["profile", "--model", "llama-3-8b", "--size", "full", "--layers", "1",
                     "--seq", "512", "--train", "--targets", "h100-sxm,h200,b200", "--shard", "4",
                     "--vary", "seq=32,64", "--top", "3", "--predict", "--out", str(tmp_path)])
    assert code == 0
    stem = tmp_path / "profile-llama-3-8b-train-projected"
    doc = __import__("json").loads(stem.with_suffix(".json").read_text())
    assert schema.check(doc) == []
    assert doc["measured"]["time"] == "projected" and "not a step time" in doc["measured"]["note"]
    assert doc["projection"]["label"] == "projected floor"
    assert doc["summary"]["step_time_s"] is None  # nothing ran: no step time to report
    assert [r["target"] for r in doc["comparison"]["rows"]] == ["h100-sxm", "h200", "b200"]
    assert [r["value"] for r in doc["variations"]["rows"]] == [32, 64]
    ws = doc["with_speedlight"]  # the projected model patched with speedlight's ops
    assert "patched rms_norm" in ws["patch"] and 0 < ws["floor_s"] < doc["summary"]["floor_s"]
    assert "patched attention" in ws["patch"]  # run on fake tensors: no values to unpad by
    assert all(0 < r["patched_floor_s"] < r["floor_s"] for r in doc["comparison"]["rows"])
    # --predict: each speedlight op's case asked once, beside its projected floor
    predicted = ws["predicted"]
    assert asked and len(asked) == len(set(asked)) and {a[2] for a in asked} == {"h100-sxm"}
    assert {p["op"] for p in predicted} >= {"add_rms_norm", "swiglu"}
    fwd = [p for p in predicted if p["direction"] == "fwd"]
    assert all(p["predicted_us"] == 2.0 and p["floor_us"] > 0 and p["predicted"] for p in fwd)
    assert all(p["step_predicted_us"] == 2.0 * p["calls"] for p in fwd)
    assert all(p["why"] == "iterations unknown" for p in predicted if p["direction"] == "bwd")
    page = stem.with_suffix(".html").read_text()
    assert "projected floor" in page and page.count("<svg") >= 4


def test_mixture_of_experts_projects_with_uniform_routing_stated(tmp_path):
    import json

    cfg = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "vocab_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    seq = 128
    w, mode = _fake(str(path), seq=seq, layers=None)
    pj = project.project_step(w, train=True, recipe=BF16, mode=mode)
    assert [r.op for r in pj.capture.ops if r.cost is None] == []
    experts = sum(r.cost.flops for r in pj.capture.ops if r.name == "_grouped_mm")
    per_token = cfg["num_experts_per_tok"] * 3 * cfg["hidden_size"] * cfg["intermediate_size"]
    assert experts == 6 * per_token * seq  # whatever the routing: rows x one expert's matrices
    doc = project.projected_document(w, pj, target.resolve("h200"), train=True, batch=1, seq=seq,
                                     seed=0, top=5, notes=[])
    assert doc["projection"]["moe"] and any("uniform routing" in n for n in doc["notes"])
    # the expert block's share of the step, its bound and floor: the experts module's ops,
    # forward and backward, the expert GEMMs among them
    block = doc["projection"]["moe"]["block"]
    assert block["classes"] == ["MixtralExperts"] and 0 < block["share"] < 1
    assert experts <= block["flops"] < 1.1 * experts
    assert block["bound"] in ("compute", "memory", "launch")
    assert block["floor_s"] == pytest.approx(block["share"] * doc["summary"]["floor_s"])
    # the grouped_mm chain the installed transformers runs is what moe_experts replaces
    (moe,) = [a for a in doc["advice"] if a["op"] == "moe_experts"]
    assert "grouped_mm" in moe["pattern"] and moe["status"] == "available"


def _expert_rows(pj, phase):
    return [r for r in pj.capture.ops if r.name == "mm" and r.phase == phase
            and (r.module or "").endswith("mlp.experts")]


def test_hf_experts_loop_projects_at_routed_sizes_and_advice_names_moe_experts():
    """Mixtral-8x7B's real widths (one layer, a small vocabulary) with the Hugging Face
    per-expert loop, whose nonzero a fake tensor cannot answer: every expert's GEMMs get
    the rows uniform routing gives (500 pairs over 8 experts: 63 x 4, 62 x 4), so the
    expert GEMMs' FLOPs are 2 x tokens x k x 3 x H x I forward and twice that backward, and
    the advice names moe_experts with its floor against the loop's."""
    m = shapes.MODELS["mixtral-8x7b"]
    tokens, k, hidden, inter = 250, m.experts_per_token, m.hidden, m.intermediate
    w, mode = _fake("mixtral-8x7b", seq=tokens, layers=1, overrides={"vocab_size": 1024})
    w.model.set_experts_implementation("eager")
    pj = project.project_step(w, train=True, recipe=BF16, mode=mode)
    assert pj.experts_loops == 1
    assert [r.op for r in pj.capture.ops if r.cost is None] == []
    fwd = _expert_rows(pj, "forward")
    gate_up = sorted(r.inputs[0]["shape"][0] for r in fwd if r.outputs[0]["shape"][1] == 2 * inter)
    assert gate_up == [62] * 4 + [63] * 4  # tokens x k rows in all, never all tokens per expert
    gemm = 2 * tokens * k * 3 * hidden * inter
    assert sum(r.cost.flops for r in fwd) == gemm
    assert sum(r.cost.flops for r in _expert_rows(pj, "backward")) == 2 * gemm
    h200 = target.resolve("h200")
    doc = project.projected_document(w, pj, h200, train=True, batch=1, seq=tokens, seed=0, top=5,
                                     notes=[])
    assert any("uniform routing" in n and "per-expert loop" in n for n in doc["notes"])
    assert doc["projection"]["moe"]["implementation"] == ["loop"]
    (moe,) = [a for a in doc["advice"] if a["op"] == "moe_experts"]
    assert moe["status"] == "available" and "per-expert loop" in moe["pattern"]
    assert moe["instances"] == 1 and moe["launches_removed"] > 8 * 10
    assert moe["time_saved_s"] == pytest.approx(moe["unfused_floor_s"] - moe["fused_floor_s"])
    assert 3 * gemm / h200.roof.flops["bf16"] <= moe["fused_floor_s"] < moe["unfused_floor_s"]
    # its gated units are moe_experts' to replace, not swiglu's
    assert not any(a["op"] == "swiglu" and any("experts" in p for p in a["modules"])
                   for a in doc["advice"])


def test_uniform_routing_rows_and_what_an_experts_module_runs():
    from speedlight.workloads import moe

    assert moe.routed_rows(3, 2, 8) == [1] * 6 + [0] * 2  # fewer pairs than experts
    assert moe.routed_rows(5, 2, 4) == [3, 3, 2, 2]
    assert moe.expert_gemm_flops(5, 2, 7, 3) == 2 * 5 * 2 * 3 * 7 * 3
    with pytest.raises(ValueError, match="k=3"):
        moe.routed_rows(4, 3, 2)
    with pytest.raises(TypeError, match="tokens"):
        moe.routed_rows(4.0, 1, 2)

    class Experts(torch.nn.Module):  # transformers 5.x's layout, its own loop (as in 5.17)
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(torch.empty(4, 6, 5, device="meta"))
            self.down_proj = torch.nn.Parameter(torch.empty(4, 5, 3, device="meta"))
            self.act_fn = torch.nn.SiLU()

        def forward(self, hidden_states, top_k_index, top_k_weights):
            raise AssertionError("not run")

    e = Experts()
    assert moe.layout(e) == (4, 5, 3, False) and moe.implementation(e) == "loop"
    assert moe.layout(torch.nn.Linear(2, 2)) is None
    e.forward = lambda *a: None  # speedlight.patch's module path
    assert moe.implementation(e) == "replaced"
