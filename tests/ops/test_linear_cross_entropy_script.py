"""scripts/gpu/lce.py, gpu-check's linear_cross_entropy section, on a CPU at a small size:
verify first, then each implementation's row (time, extra memory, loss against float64),
peers that cannot run here skipped with the reason, and what a spent budget leaves
skipped."""

import importlib.util
from pathlib import Path

from speedlight import results

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "lce.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_lce", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_section_verifies_then_measures_against_float64(tmp_path):
    script = _script()
    small = ["--tokens", "32", "--hidden", "16", "--vocab", "128", "--reps", "1"]
    code = script.main(["--out", str(tmp_path), *small, "--verify-shape", "16,16,64",
                        "--verify-settings", "default",
                        "--impls", "speedlight,torch-eager,torch-compile"])
    assert code == 0
    rows = results.read_jsonl(tmp_path / "lce.jsonl")
    verify, loss64, ours, eager, compiled, targets = rows
    assert (verify["step"], verify["status"]) == ("verify", "pass")
    assert verify["schedule"].startswith("in-place: 4 chunks")  # the headline's rounding count
    assert verify["checks"]["grad_weight"]["passed"]
    assert ours["status"] == "ok" and ours["loss_dtype"] == "float32"
    assert ours["loss_error"] < 1e-3 and abs(ours["loss"] - eager["loss"]) < 1e-3
    assert ours["extra_bytes"] > 0 and ours["memory"].startswith("peak of tracked")
    assert ours["representative"] is False and ours["memory_budget"] > 0
    assert compiled["status"] == "skipped" and "torch.compile on a CPU" in compiled["reason"]
    assert targets["targets"] == {"default_extra_at_most_1.1GB": True}
    # a spent budget: no timing row starts, each says why
    code = script.main(["--out", str(tmp_path / "late"), *small, "--verify-settings", "",
                        "--budget-s", "0", "--impls", "speedlight,torch-eager"])
    late = results.read_jsonl(tmp_path / "late" / "lce.jsonl")
    assert code == 0 and [r["status"] for r in late[1:3]] == ["skipped", "skipped"]
    assert "budget was spent" in late[1]["reason"]
