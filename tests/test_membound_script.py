"""scripts/gpu/membound.py at a tiny size on the CPU: it verifies first, benches each shape
against a baseline with a copy of the same bytes beside it, and records a shape the budget
did not reach as skipped."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("membound", ROOT / "scripts" / "gpu" /
                                                  "membound.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_verifies_first_then_times_beside_a_copy(tmp_path):
    _script().main(["--out", str(tmp_path), "--ops", "rms_norm", "--rows", "2",
                    "--hidden", "32", "--baselines", "torch-eager", "--device", "cpu"])
    (verified,) = _rows(tmp_path / "verify.jsonl")
    assert verified["op"] == "rms_norm" and verified["status"] == "pass"
    bench = _rows(tmp_path / "bench.jsonl")
    assert {(r["implementation"], r["mode"]) for r in bench if r["status"] == "ok"} == {
        (impl, mode) for impl in ("speedlight", "torch-eager") for mode in ("fwd", "bwd")}
    copies = _rows(tmp_path / "copy.jsonl")
    costs = {r["mode"]: r["bytes"] for r in bench if r["implementation"] == "speedlight"}
    # a copy moving the op's compulsory bytes of each direction (half read, half written)
    assert {r["mode"]: r["bytes"] for r in copies} == costs
    assert all(abs(r["copied_bytes"] - r["bytes"]) <= 1 for r in copies)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["representative"] is False
    shares = summary["ops"]["rms_norm"]["rows2-hidden32"]
    assert set(shares) == {"fwd", "bwd"}
    assert all(v["copy_"]["of_copy"] == 1.0 and 0 < v["speedlight"]["of_copy"]
               for v in shares.values())


def test_a_shape_out_of_budget_is_a_skip_row(tmp_path):
    _script().main(["--out", str(tmp_path), "--ops", "softmax", "--rows", "2",
                    "--hidden", "16,32", "--baselines", "none", "--device", "cpu",
                    "--budget-s", "0"])
    bench = _rows(tmp_path / "bench.jsonl")
    assert bench and all(r["status"] == "skip" and "budget" in r["reason"] for r in bench)
    assert {r["case_label"] for r in bench} == {"rows2-cols16", "rows2-cols32"}
    assert all(r["status"] == "skip" for r in _rows(tmp_path / "copy.jsonl"))
