"""scripts/gpu/attention_gluon.py, gpu-check's Gluon attention section, on a CPU: the rows
it writes (the Gluon verify and fault steps skipped with the reason, the timings GPU-only),
a step that never answers recorded as a hang and the rest run in a fresh process, a spent
budget, and a verify or fault step that the Triton forward served (the Gluon kernel did
not run) failed."""

import importlib.util
from pathlib import Path

from speedlight import results

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "attention_gluon.py"


def _script():
    spec = importlib.util.spec_from_file_location("gpu_attention_gluon", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_section_writes_every_row_with_its_reason(tmp_path):
    script = _script()
    code = script.main(["--out", str(tmp_path), "--impls", "speedlight-gluon,sdpa-cudnn",
                        "--modes", "fwd", "--step-timeout-s", "120"])
    rows = results.read_jsonl(tmp_path / "attention_gluon.jsonl")
    env, verify, faults, gluon, cudnn = rows
    assert code == 0 and env["gluon_triton"] is True and env["representative"] is False
    for row in (verify, faults):
        assert row["status"] == "skipped" and "only on an NVIDIA GPU" in row["reason"]
    assert faults["step"] == "faults" and faults["faults"] == [[30, "nan"]]
    assert (gluon["implementation"], gluon["mode"], gluon["status"]) == (
        "speedlight-gluon", "fwd", "skipped")
    assert gluon["verified"] is False  # its verify was skipped here
    assert cudnn["status"] == "skipped" and "GPU only" in cudnn["reason"]


def test_a_silent_step_is_a_hang_and_the_next_runs_in_a_fresh_process():
    script = _script()
    written = []
    steps = [{"kind": "wait", "seconds": 60}, {"kind": "wait", "seconds": 0}]
    script.run_steps(steps, "cpu", timeout_s=3, deadline=float("inf"), write=written.append)
    assert [(r["step"], r["status"]) for r in written] == [("wait", "hang"), ("wait", "ok")]
    assert "no result within 3 s" in written[0]["reason"]
    written.clear()
    script.run_steps(steps, "cpu", timeout_s=3, deadline=0.0, write=written.append)
    assert [r["status"] for r in written] == ["skipped", "skipped"]
    assert "budget was spent" in written[0]["reason"]


def test_a_verify_the_triton_forward_served_fails(monkeypatch):
    """The Gluon launcher falls back to the Triton forward outside its design, which would
    pass verify: the row must say the Gluon kernel did not run."""
    import dataclasses

    from speedlight.ops import attention_gluon
    from speedlight.ops.attention import SPEC

    script = _script()
    runs_here = dataclasses.replace(SPEC.implementations["gluon"], unavailable=lambda d: None)
    monkeypatch.setitem(SPEC.implementations, "gluon", runs_here)
    monkeypatch.setattr(attention_gluon, "gluon_unavailable", lambda device: None)
    monkeypatch.setattr(attention_gluon, "check_gluon", lambda q: None)
    row = script.verify_step(script.CPU_VERIFY_CASES[0], "cpu")
    assert row["status"] == "fail" and row["gluon_ran"] is False
    assert "did not run" in row["reason"] and "_attention_fwd_kernel" in row["kernels"]
    # the fault step: the served forward keeps the rule (o and lse as the reference, the
    # fault pass run), but it is not the Gluon kernel's
    case, at = script.CPU_FAULT_CASES[0]
    row = script.faults_step(case, at, "cpu")
    assert row["status"] == "fail" and row["gluon_ran"] is False
    assert row["reason"].startswith("the Gluon kernel did not run")
    assert row["checks"]["y0"]["passed"] and row["checks"]["y1"]["passed"]
    assert "_attention_fwd_faults_kernel" in row["kernels"]
