"""scripts/gpu/moe.py (the MoE block's GPU check) at --tiny on a CPU: it verifies, then
benches at "4096" and "32768" tokens (verified by bench, then not), writing each step's row
and every measurement; with no time left it records the cases and steps it skipped."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_moe", ROOT / "scripts" / "gpu" / "moe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tiny_run_verifies_then_times_each_step(tmp_path):
    assert _script().main(["--out", str(tmp_path), "--device", "cpu", "--tiny",
                           "--budget-s", "600"]) == 0
    steps = {r["step"]: r for r in _rows(tmp_path / "moe.jsonl")}
    assert list(steps) == ["verify", "bench-4k", "bench-32k"]
    assert all(r["status"] == "done" and r["rows"] > 0 for r in steps.values()), steps
    (verified,) = _rows(tmp_path / "verify.jsonl")
    assert verified["status"] == "pass" and "gpt-oss-20b" not in verified["case_id"]
    assert "clamped_swiglu" in verified["case_id"]
    ours = [r for r in _rows(tmp_path / "bench.jsonl") if r["implementation"] == "speedlight"]
    assert [r["status"] for r in ours] == ["ok", "ok"]
    # bench verifies its 4096-token step before timing; the 32768-token step runs unverified
    assert [r["verify_status"] for r in ours] == ["pass", "not run"]
    assert all("shared1" in r["case_id"] for r in ours)


def test_a_spent_budget_is_recorded_as_skipped(tmp_path):
    script = _script()
    assert script.main(["--out", str(tmp_path), "--device", "cpu", "--tiny",
                        "--budget-s", "1e-9"]) == 0
    steps = _rows(tmp_path / "moe.jsonl")
    assert [r["status"] for r in steps] == ["skipped"] * 3
    assert all("budget" in r["reason"] for r in steps)
    # a verification case not started before its step's deadline is a skip row, not a gap
    assert script.run_verify(script.verify_cases(tiny=True), "cpu", tmp_path / "v.jsonl",
                             deadline=0.0) == 1
    (case,) = _rows(tmp_path / "v.jsonl")
    assert case["status"] == "skip" and "budget" in case["reason"]
