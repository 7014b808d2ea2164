"""scripts/fuzz_under_load.py names a test whose outcome differs between runs, and only
such a test: two runs of a tiny pytest file, one quiet and one under load."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "fuzz_under_load", ROOT / "scripts" / "fuzz_under_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TESTS = """
from pathlib import Path

COUNT = Path(__file__).with_name("runs.txt")

def test_steady():
    assert 1 + 1 == 2

def test_flips():  # passes the first time, fails the second
    n = int(COUNT.read_text()) if COUNT.exists() else 0
    COUNT.write_text(str(n + 1))
    assert n == 0
"""


@pytest.mark.skipif(sys.platform == "win32", reason="busy processes by fork")
def test_a_varying_outcome_is_named_and_a_steady_one_is_not(tmp_path):
    tests = tmp_path / "test_toy.py"
    tests.write_text(TESTS)
    out = tmp_path / "summary.json"
    code = _script().main(["--tests", str(tests), "--runs", "2", "--load", "1",
                           "--workers", "0", "--out", str(out)])
    summary = json.loads(out.read_text())
    assert code == 1
    assert [r["load"] for r in summary["runs"]] == [0, 1]
    assert [r["counts"] for r in summary["runs"]] == [{"passed": 2}, {"passed": 1, "failed": 1}]
    # a test's class name is its module's path from pytest's rootdir, which depends on
    # the folders above tmp_path
    [(name, seen)] = summary["varying"].items()
    assert name.endswith("test_toy::test_flips") and seen == ["passed", "failed"]


def test_a_test_missing_from_a_run_varies():
    runs = [{"outcomes": {"a": "passed", "b": "skipped"}}, {"outcomes": {"a": "passed"}}]
    assert _script().varying(runs) == {"b": ["skipped", "absent"]}


@pytest.mark.parametrize("argv,named", [(["--runs", "1"], "--runs"), (["--load", "0"], "--load"),
                                        (["--tests", ","], "--tests")])
def test_bad_options_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as raised:
        _script().main(argv)
    assert raised.value.code == 2
    assert named in capsys.readouterr().err
