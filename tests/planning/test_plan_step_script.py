"""scripts/gpu/plan_step.py, gpu-check's plan and training-step section, on a CPU at a tiny
size: a row per candidate (verified, nothing timed), the merged plan file, the training
step's planned row on that plan (hf's and Liger's rows beside it are bench model's own);
a spent budget leaves skipped rows."""

import importlib.util
from pathlib import Path

from speedlight import plans, results

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "plan_step.py"
TINY = ["--models", "default", "--plan-batch", "1", "--plan-seq", "8", "--kinds",
        "rms_norm,decoder_layer", "--candidates", "torch-fused", "--step-model", "default",
        "--layers", "1", "--step-batch", "1", "--step-seq", "8", "--warmup", "0", "--steps", "1"]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_plan_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_section_plans_then_steps_on_the_plan(tmp_path):
    script = _script()
    assert script.main(["--out", str(tmp_path), *TINY, "--variants",
                        "speedlight-planned"]) == 0
    rows = results.read_jsonl(tmp_path / "plan.jsonl")
    by = {(r["kind"], r["candidate"]): r for r in rows}
    assert by[("rms_norm", "torch-fused")]["status"] == "admitted"
    assert by[("rms_norm", "torch-fused")]["error_ratio"] is not None
    assert by[("rms_norm", "model")]["verdict"] == "unmeasured"  # nothing timed on a CPU
    assert ("decoder_layer", "model") in by and rows[0]["representative"] is False
    plan = plans.load_plan(tmp_path / "plan-default.json")
    assert set(plan.decisions) == {"rms_norm", "decoder_layer"}
    step = {r["variant"]: r for r in results.read_jsonl(tmp_path / "model-step.jsonl")}
    assert step["speedlight-planned"]["status"] == "ok"
    assert "the plan given" in step["speedlight-planned"]["plan_note"]


def test_a_spent_budget_leaves_skipped_rows(tmp_path):
    script = _script()
    assert script.main(["--out", str(tmp_path), *TINY, "--budget-s", "0",
                        "--variants", "speedlight-planned"]) == 0
    rows = results.read_jsonl(tmp_path / "plan.jsonl")
    assert {r["status"] for r in rows} == {"skipped"} and len(rows) == 2
    assert "budget was spent" in rows[0]["reason"]
    step, = results.read_jsonl(tmp_path / "model-step.jsonl")
    assert step["status"] == "skipped" and "no plan of default" in step["reason"]
