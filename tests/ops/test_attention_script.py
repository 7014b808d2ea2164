"""scripts/gpu/attention.py, gpu-check's attention section, on a CPU at its tiny sizes: the
verify and mask steps pass under the interpreter, the timings are skipped rows with the
reason, and a spent budget turns every step left into a skipped row."""

import importlib.util
from pathlib import Path

from speedlight import results

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "attention.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_section_verifies_then_records_every_timing_row(tmp_path):
    code = _script().main(["--out", str(tmp_path), "--device", "cpu",
                           "--impls", "speedlight,sdpa-cudnn", "--modes", "fwd,fwd+bwd"])
    rows = results.read_jsonl(tmp_path / "attention.jsonl")
    assert code == 0
    assert [(r["step"], r["status"]) for r in rows[:2]] == [("verify", "pass"),
                                                            ("mask", "pass")]
    timed = rows[2:]
    assert [(r["implementation"], r["mode"]) for r in timed] == [
        ("speedlight", "fwd"), ("sdpa-cudnn", "fwd"), ("speedlight", "fwd+bwd"),
        ("sdpa-cudnn", "fwd+bwd")]
    assert all(r["status"] == "skipped" and "GPU only" in r["reason"] for r in timed)
    assert rows[0]["representative"] is False


def test_a_spent_budget_skips_what_is_left(tmp_path):
    code = _script().main(["--out", str(tmp_path), "--device", "cpu", "--budget-s", "0",
                           "--impls", "speedlight", "--modes", "fwd"])
    rows = results.read_jsonl(tmp_path / "attention.jsonl")
    assert code == 0 and [r["step"] for r in rows] == ["verify", "mask", "time"]
    assert all(r["status"] == "skipped" and "budget" in r["reason"] for r in rows)
