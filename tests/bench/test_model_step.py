"""`speedlight bench model`: a training step of the default model on the CPU for HF and
speedlight.patch, its loss curves agreeing, rows and chart written; the agreement check
catching a curve that is off; bad arguments refused in one line; the report's section."""


import pytest
import torch

pytest.importorskip("transformers")

from speedlight import cli, results
from speedlight.bench import model_step


def test_default_model_on_cpu_hf_and_speedlight_agree_and_write_rows_and_chart(tmp_path):
    pytest.importorskip("matplotlib")
    earlier = {"tool": "bench-model", "variant": "earlier-run", "status": "ok"}
    results.append_jsonl(tmp_path / model_step.FILE, [earlier])
    code = cli.main(["bench", "model", "--device", "cpu", "--variants", "hf,speedlight",
                     "--warmup", "0", "--steps", "2", "--seq", "16", "--out", str(tmp_path)])
    assert code == 0
    rows = results.read_jsonl(tmp_path / model_step.FILE)
    assert rows[0] == earlier  # appended, not overwritten
    hf, ours = rows[1:]
    assert (hf["variant"], ours["variant"]) == ("hf", "speedlight")
    for r in (hf, ours):
        assert r["status"] == "ok" and r["representative"] is False
        assert r["model"] == "llama-tiny" and r["dtype"] == "fp32" and r["layers"] == 2
        assert len(r["samples_s"]) == 2 and r["median_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * r["seq"] / r["median_s"])
        assert r["peak_bytes"] is None and r["peak_method"].startswith("n/a")
        assert len(r["losses"]) == 2 and all(6 < x < 9 for x in r["losses"])  # ~ln(2048)
        assert r["loss_dtype"] == "fp32" and r["loss_agrees"] is True
    # the model check's rule: k x hf's own first-step error against its float64 copy
    own = abs(hf["losses"][0] - hf["loss_float64"]) / hf["loss_float64"]
    assert 0 < own < 1e-5 and "float64 copy" in ours["loss_rule"]
    assert ours["loss_tolerance"] == pytest.approx(4 * max(own, 2.0 ** -24))
    assert ours["loss_max_rel_diff"] <= ours["loss_tolerance"] and hf["loss_max_rel_diff"] == 0
    assert (tmp_path / model_step.CHART).stat().st_size > 10_000


@pytest.mark.parametrize("moe,name,experts,modules", [
    pytest.param(True, "qwen3-30b-a3b", 8, 1, id="qwen3-30b-a3b"),
    pytest.param("gpt-oss-20b", "gpt-oss-20b", 8, 1, id="gpt-oss-20b"),
])
def test_moe_on_cpu_runs_tiny_with_the_experts_patched_and_the_loop_beside(moe, name, experts,
                                                                           modules, tmp_path):
    """--moe on a CPU: Qwen3-30B-A3B's architecture scaled down to 8 experts, one layer
    (gpt-oss-20B's too: its transposed, biased experts found by their shapes and clamped
    unit); the speedlight row runs the experts on moe_experts, hf-loop on HF's per-expert
    loop, and both rows say so; the step agrees with the loop's. (The patch is the experts'
    kind alone: the other kinds' interpreter time says nothing more here.)"""
    import functools

    from speedlight.patching import apply_kinds

    experts_only = functools.partial(apply_kinds, rms_norm=False, rope=False, cross_entropy=False,
                                     attention=False, linear_cross_entropy=False,
                                     decoder_layer=False)
    d = model_step.defaults(torch.device("cpu"), moe=moe)
    s = model_step.StepSettings(model=d["model"], layers=d["layers"], batch=1, seq=8,
                                dtype=d["dtype"], device=torch.device("cpu"), warmup=0, steps=1,
                                overrides=d["overrides"])
    model_step.run_variants(s, ["speedlight", "hf-loop"], tmp_path / "m.jsonl",
                            patch=experts_only)
    ours, loop = results.read_jsonl(tmp_path / "m.jsonl")
    assert (loop["variant"], ours["variant"]) == ("hf-loop", "speedlight")
    for r in (loop, ours):
        assert r["status"] == "ok" and r["representative"] is False
        assert r["model"] == f"{name}-scaled" and r["layers"] == 1
        assert r["experts"]["experts"] == experts and r["experts"]["k"] == 2
        assert r["experts"]["modules"] == modules and len(r["losses"]) == 1
        assert name != "qwen3-30b-a3b" or any("num_experts=8" in n for n in r["notes"])
    assert loop["experts"]["implementation"] == ["loop"] and "patched" not in loop
    assert ours["experts"]["implementation"] in (["speedlight"], ["replaced"])
    assert ours["patched"] == {"mlp": 1}  # the experts' module, on moe_experts
    assert ours["losses"][0] == pytest.approx(loop["losses"][0], rel=1e-3)


def test_moe_names_its_model_and_sizes_it_per_device(tmp_path):
    """--moe NAME: each of MOE_MODELS at its GPU size (DeepSeek-V3 with 32 of its routed
    experts and its MoE layer first), scaled down on a CPU; an unknown name is refused."""
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert model_step.defaults(gpu, moe=True)["model"] == "qwen3-30b-a3b"
    ds = model_step.defaults(gpu, moe="deepseek-v3")
    assert (ds["layers"], ds["batch"], ds["seq"]) == (1, 2, 4096)
    assert ds["overrides"] == {"n_routed_experts": 32, "first_k_dense_replace": 0}
    assert model_step.defaults(gpu, moe="gpt-oss-20b")["dtype"] == torch.bfloat16
    assert model_step.defaults(cpu, moe="deepseek-v3")["overrides"] == {"first_k_dense_replace": 0}
    assert all(model_step.names_moe(n) for n in model_step.MOE_MODELS)
    with pytest.raises(SystemExit, match="--moe takes qwen3-30b-a3b, deepseek-v3, gpt-oss-20b"):
        cli.main(["bench", "model", "--moe", "mixtral", "--device", "cpu",
                  "--out", str(tmp_path / "o")])


def test_hf_loop_is_skipped_for_a_dense_model_and_moe_refuses_a_named_model(tmp_path):
    s = model_step.StepSettings(model=None, layers=1, batch=1, seq=4, dtype=torch.float32,
                                device=torch.device("cpu"), warmup=0, steps=1)
    assert "hf-loop" not in model_step.variants_for(s)
    assert "hf-loop" in model_step.variants_for(
        model_step.StepSettings(**{**vars(s), "model": "mixtral-8x7b"}))
    (row,) = model_step.run_variants(s, ["hf-loop"], tmp_path / "m.jsonl")
    assert row["status"] == "skipped" and "no experts" in row["reason"]
    with pytest.raises(SystemExit, match="--moe picks the mixture of experts"):
        cli.main(["bench", "model", "--moe", "--model", "llama-3-8b", "--device", "cpu",
                  "--out", str(tmp_path / "o")])


def _row(variant, losses, median=1.0, peak=None, loss_dtype="fp32", loss64=None):
    return {"variant": variant, "status": "ok", "losses": losses, "median_s": median,
            "peak_bytes": peak, "loss_dtype": loss_dtype, "loss_float64": loss64}


# bf16 without a float64 copy: k x bf16's unit roundoff, 4 x 2^-8 = 1.5625%; fp32 with one
# whose first-step loss is off by 1e-6: 4e-6
@pytest.mark.parametrize("dtype,loss64,off,agrees", [
    pytest.param(torch.bfloat16, None, 0.0155, True, id="bf16-1.55pct"),
    pytest.param(torch.bfloat16, None, 0.0157, False, id="bf16-1.57pct"),
    pytest.param(torch.float32, 8.0 * (1 + 1e-6), 3.9e-6, True, id="fp32-3.9e-6"),
    pytest.param(torch.float32, 8.0 * (1 + 1e-6), 4.1e-6, False, id="fp32-4.1e-6"),
])
def test_loss_agreement_is_judged_step_by_step(dtype, loss64, off, agrees):
    ref = [8.0, 7.5, 7.0]
    bad = [8.0, 7.5 * (1 + off), 7.0]  # only the middle step is off
    rows = [_row("hf", ref, 2.0, 400, loss64=loss64), _row("speedlight", bad, 1.0, 200),
            {"variant": "liger", "status": "unavailable", "reason": "not installed"}]
    model_step.agree(rows, dtype)
    assert rows[1]["loss_agrees"] is agrees
    assert rows[1]["loss_max_rel_diff"] == pytest.approx(off)
    assert rows[1]["speedup_vs_hf"] == 2.0 and rows[1]["memory_vs_hf"] == 0.5
    assert "loss_agrees" not in rows[2]
    assert bool(model_step.step_failures(rows)) is not agrees


def test_a_loss_in_another_dtype_does_not_agree():
    """speedlight's loss once came back in bf16 (12.5625 at every step while hf's moved
    between 12.548 and 12.584): within 1.6% of hf's, but in the wrong dtype."""
    hf = [12.548, 12.584, 12.561]
    rows = [_row("hf", hf, loss_dtype="fp32"), _row("speedlight", [12.5625] * 3, loss_dtype="bf16")]
    model_step.agree(rows, torch.bfloat16)
    assert rows[1]["loss_max_rel_diff"] < 0.01 and rows[1]["loss_agrees"] is False
    assert "loss in bf16, hf's in fp32" in model_step.step_failures(rows)[0]


def test_a_shorter_curve_does_not_agree():
    rows = [_row("hf", [8.0, 7.5]), _row("speedlight", [8.0])]
    model_step.agree(rows, torch.float32)
    assert rows[1]["loss_agrees"] is False


def test_compiled_variants_liger_and_the_plan_are_skipped_on_cpu_with_the_reason(tmp_path):
    s = model_step.StepSettings(model=None, layers=None, batch=1, seq=8, dtype=torch.float32,
                                device=torch.device("cpu"), warmup=0, steps=1)
    rows = model_step.run_variants(
        s, ["hf-compile", "speedlight-compile", "liger", "speedlight-planned"], tmp_path / "m.jsonl")
    assert [r["status"] for r in rows] == ["skipped"] * 4
    assert all("torch.compile on a CPU" in r["reason"] for r in rows[:2])
    assert "Triton interpreter" in rows[2]["reason"]
    assert "nothing is timed there" in rows[3]["reason"]  # a CPU plan keeps every kind
    assert len(results.read_jsonl(tmp_path / "m.jsonl")) == 4
    assert model_step.step_failures(rows) == []


def test_a_peer_that_fails_is_unavailable_and_ours_is_an_error():
    rows = [{"variant": "liger", "status": "unavailable", "reason": "x"},
            {"variant": "speedlight", "status": "error", "reason": "RuntimeError: y"}]
    assert model_step.step_failures(rows) == ["speedlight: RuntimeError: y"]


@pytest.mark.parametrize("argv,says", [
    pytest.param(["--batch", "0"], "--batch must be at least 1", id="batch0"),
    pytest.param(["--layers", "0"], "--layers must be at least 1", id="layers0"),
    pytest.param(["--steps", "0"], "--steps must be at least 1", id="steps0"),
    pytest.param(["--variants", "hf,fast"], "--variants takes", id="variant-unknown"),
    pytest.param(["--variants", ","], "--variants takes", id="variants-empty"),
    pytest.param(["--dtype", "fp64"], "--dtype takes fp32, bf16 or fp16", id="dtype-fp64"),
    pytest.param(["--dtype", "int3"], "--dtype: unknown dtype", id="dtype-unknown"),
    pytest.param(["--model", "no-such-model"], "--model 'no-such-model'", id="model-unknown"),
    pytest.param(["--lr", "-1"], "--lr must be more than 0", id="lr-negative"),
    pytest.param(["extra.jsonl"], "model takes no paths", id="path"),
    pytest.param(["--plan", "no-such-plan.json"],
                 "--plan: plan file 'no-such-plan.json': cannot be read",
                 id="plan-missing"),
])
def test_bad_arguments_are_one_line_errors_before_any_work(tmp_path, argv, says):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "model", *argv, "--device", "cpu", "--out", str(tmp_path / "o")])
    message = str(e.value)
    assert message.startswith("speedlight bench: ") and says in message
    assert "\n" not in message
    assert not (tmp_path / "o" / model_step.FILE).exists()


def test_the_report_shows_the_training_step_table(tmp_path):
    pytest.importorskip("jinja2")
    from speedlight.pipeline import FILES, MANIFEST
    from speedlight.report import render
    rows = [_row("hf", [8.0, 7.9], 2.0, 4 * 2 ** 30), _row("speedlight", [8.0, 7.95], 1.0, 2 ** 31),
            {"variant": "liger", "status": "unavailable", "reason": "liger-kernel is not installed"}]
    model_step.agree(rows, torch.bfloat16)
    common = {"model": "llama-3-8b", "dtype": "bf16", "batch": 4, "seq": 4096, "layers": 4,
              "device": "NVIDIA H200", "method": "cuda-events", "stop": "10 steps",
              "warmup_steps": 3, "peak_method": "torch.cuda.max_memory_allocated",
              "tokens_per_s": 1.0}
    results.append_jsonl(tmp_path / FILES["model_step"], [{**common, **r} for r in rows])
    results.write_json(tmp_path / MANIFEST, {"stages": {}, "files": FILES, "run": {}})
    render.render(tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "## The training step, end to end" in md
    assert "| speedlight | 1 s | 1 | 2.00x | 2 GiB | 0.50x | yes |" in md
    assert "| liger | unavailable: liger-kernel is not installed |" in md
    html = (tmp_path / "index.html").read_text()
    assert 'id="model-step"' in html and "model-step.jsonl" in html
