"""The plan prior: written by code from benchmarks/results (the shipped file is exactly what
the code writes), read by patch(plan="auto") on a GPU with no cached plan (the nearest
measured architecture's when its own has none), a kind measured slower not applied unless
named; on a CPU the report's note names the prior's source and date."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from speedlight import plan_prior, plans
from speedlight.planning import prior
from speedlight.patching import planned, unpatch
from speedlight.patching.patcher import apply_kinds
from tests.patching import tiny_models

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
OFF = {k: False for k in plans.KINDS}


def test_the_shipped_prior_is_what_the_measured_results_give():
    assert plan_prior.PRIOR_PATH.read_text() == prior.text(prior.build_prior(RESULTS)), (
        "speedlight/tuned/plan-prior.json is stale or edited: python scripts/plan_prior.py")


def test_the_prior_drops_what_measured_slower_from_rows(tmp_path):
    """A run whose speedlight attention is slower than SDPA's flash backend, and whose norm
    is faster than eager: attention dropped, rms_norm kept, with the fastest named."""
    run = tmp_path / "h100-sxm" / "2030-01-01-run1"
    run.mkdir(parents=True)

    def row(op, impl, us, case="c1"):
        return json.dumps({"op": op, "implementation": impl, "case_id": case, "mode": "fwd+bwd",
                           "median_us": us, "status": "ok", "representative": True,
                           "timestamp": "2030-01-01T00:00:00+00:00", "device": "NVIDIA H100",
                           "git": "abcdef0123"})
    (run / "bench.jsonl").write_text("\n".join([
        row("attention", "speedlight", 20.0), row("attention", "sdpa-flash", 10.0),
        row("attention", "sdpa-cudnn", 5.0), row("rms_norm", "speedlight", 1.0),
        row("rms_norm", "torch-eager", 4.0), row("rms_norm", "speedlight", 2.0, "c2"),
        row("rms_norm", "torch-eager", 2.0, "c2")]))
    doc = prior.build_prior(tmp_path)
    kinds = doc["archs"]["sm_90"]["kinds"]
    assert (kinds["attention"]["verdict"], kinds["attention"]["ratio"]) == ("dropped", 2.0)
    assert kinds["attention"]["fastest"] == "sdpa-cudnn"
    assert kinds["rms_norm"]["verdict"] == "kept"
    assert kinds["rms_norm"]["ratio"] == 0.5  # the geometric mean of 1/4 and 2/2
    assert doc["archs"]["sm_90"]["date"] == "2030-01-01"


@pytest.fixture(scope="module")
def llama():
    return tiny_models.build("llama")


def _doc(verdicts: dict[str, str]) -> dict:
    return {"format": plan_prior.PRIOR_FORMAT, "archs": {"sm_90": {
        "device": "NVIDIA H200", "date": "2026-12-04", "runs": ["h200/run"],
        "kinds": {k: {"verdict": v, "ratio": 1.2 if v == "dropped" else 0.5,
                      "reason": "measured"} for k, v in verdicts.items()}}}}


def test_the_prior_is_applied_and_a_kind_measured_slower_is_not_unless_named(llama):
    doc = _doc({"attention": "dropped", "rms_norm": "kept"})
    plan, note = plan_prior.prior_plan(llama, "sm_90", doc)
    assert note == "the prior measured on sm_90: NVIDIA H200, 2026-12-04"
    report = apply_kinds(llama, plan=plan, **(OFF | {"attention": True, "rms_norm": True}))
    unpatch(llama)
    assert "attention" not in report.patched and report.count("rms_norm") == 5
    assert report.plan["attention"].startswith("dropped by the prior (time x1.200; measured")
    assert report.plan["rms_norm"].startswith("kept by the prior (time x0.500")
    # asked for by name, the kind is applied whatever the prior says
    report = apply_kinds(llama, plan=plan, **(OFF | {"attention": "speedlight"}))
    unpatch(llama)
    assert report.count("attention") == 2
    assert report.plan["attention"].startswith("speedlight applied as asked; dropped by the prior")


def test_a_gpu_without_a_measured_plan_takes_the_nearest_measured_arch(llama, monkeypatch,
                                                                      tmp_path):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))  # no cached plan
    monkeypatch.setattr(planned, "_on_gpu", lambda model: True)
    monkeypatch.setattr(plan_prior, "arch_of", lambda device: "sm_100")
    monkeypatch.setattr(plan_prior, "load_prior",
                        lambda path=None: _doc({"attention": "dropped"}))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        report = apply_kinds(llama, plan="auto", **(OFF | {"attention": True}))
    unpatch(llama)
    assert any(w.category is plans.PlanHint for w in got)
    assert report.plan_note.startswith(plans.HINT)
    assert ("meanwhile the prior of the nearest measured architecture, sm_90: NVIDIA H200, "
            "2026-12-04 (none measured on sm_100)") in report.plan_note
    assert "attention" not in report.patched
    assert plan_prior.nearest_arch("sm_80", ["sm_90", "sm_70"]) == "sm_70"  # a tie: the lower
    assert plan_prior.nearest_arch("gfx942", ["sm_90"]) is None


def test_on_a_cpu_the_note_names_the_prior_s_source_and_date(llama):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = apply_kinds(llama, plan="auto", **OFF)
    unpatch(llama)
    assert "the prior for GPUs: sm_90: NVIDIA H200, 2026-12-04 (h200/2026-12-04-run1" \
        in report.plan_note


def test_a_damaged_prior_is_named_and_ignored(tmp_path):
    bad = tmp_path / "prior.json"
    bad.write_text(json.dumps({"format": 1, "archs": {"sm_90": {"kinds": {"rms_nrom": {
        "verdict": "kept"}}}}}))
    with pytest.warns(plans.PlanWarning, match="not a prior of format 1"):
        assert plan_prior.load_prior(bad) is None
    bad.write_bytes(b"\xff")
    with pytest.warns(plans.PlanWarning, match="cannot be read"):
        assert plan_prior.load_prior(bad) is None
    assert plan_prior.load_prior(tmp_path / "missing.json") is None
    assert torch.device("cpu").type == "cpu" and plan_prior.arch_of(torch.device("cpu")) is None
