"""Compiled with torch.compile, every custom op the registry built gives the outputs and
gradients it gives eagerly (tests/compile_equal.py says why: a torch release that compiles
custom ops wrong, silently, and where CI runs each scenario). Run on every torch CI tests,
on the CPU with backend aot_eager."""

import importlib.util
import json
from pathlib import Path

import pytest

from tests import compile_equal
from tests.conftest import DEVICE

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "compile_equal.py"


def test_the_scenarios_ci_runs_hold_every_custom_op():
    held = set().union(*(compile_equal.HOLDS[s] for s in compile_equal.CI_SCENARIOS))
    registered = compile_equal.registered_custom_ops()
    assert registered - held == set(), "no compile scenario CI runs holds these custom ops"
    assert held - registered == set(), "HOLDS names ops nobody registered"
    gpu = set().union(*(compile_equal.HOLDS[s] for s in compile_equal.GPU_SCENARIOS))
    assert registered - gpu == set(), "no GPU scenario holds these custom ops"


def test_the_variants_no_model_trains_compiled_equal_eager(device):
    outcome = compile_equal.check("ops-train", "aot_eager", device)
    assert not outcome.missing, f"the compiled graphs did not hold {sorted(outcome.missing)}"
    assert not outcome.mismatch, outcome.mismatch


def test_the_gpu_script_checks_every_inference_op_and_skips_past_its_budget(tmp_path):
    """scripts/gpu/compile_equal.py runs ops-infer (its first scenario always runs) and
    records llama-train, past a budget of 0 s, as skipped."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("compile_equal_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--out", str(tmp_path), "--budget-s", "0", "--backends", "aot_eager",
                        "--scenarios", "ops-infer,llama-train", "--device", DEVICE.type])
    rows = [json.loads(line) for line in (tmp_path / "compile_equal.jsonl").read_text().splitlines()]
    assert [(r["scenario"], r["status"]) for r in rows] == [("ops-infer", "pass"),
                                                          ("llama-train", "skipped")], rows
    assert set(rows[0]["ops"]) >= compile_equal.HOLDS["ops-infer"] and rows[0]["torch"]
    assert code == 0
