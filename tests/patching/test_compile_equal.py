"""Compiled with torch.compile, every custom op the registry built gives the outputs and
gradients it gives eagerly, in a patched model and alone (tests/patching/compile_equal.py
says why: a torch release that compiles custom ops wrong, silently). Run on every torch CI
tests, on the CPU through AOT autograd (backend aot_eager: the graphs inductor is handed,
without its code generation); scripts/gpu/compile_equal.py runs the same scenarios on a
GPU, inductor too. The model scenarios run in test_compile.py, over its three forms of
input."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tests.conftest import DEVICE
from tests.patching import compile_equal

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "compile_equal.py"


def test_the_scenarios_hold_every_custom_op():
    held = set().union(*(compile_equal.HOLDS[s] for s in compile_equal.CI_SCENARIOS))
    registered = compile_equal.registered_custom_ops()
    assert registered - held == set(), "no compile scenario holds these custom ops"
    assert held - registered == set(), "HOLDS names ops nobody registered"


def test_every_op_trained_compiled_equals_eager(device):
    outcome = compile_equal.check("ops-train", "aot_eager", device)
    assert not outcome.missing, f"the compiled graphs did not hold {sorted(outcome.missing)}"
    assert not outcome.mismatch, outcome.mismatch


def test_the_gpu_script_checks_every_inference_op_and_skips_past_its_budget(tmp_path):
    """scripts/gpu/compile_equal.py runs ops-infer (its first scenario always runs) and
    records llama-train, past a budget of 0 s, as skipped."""
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
