"""The suite's CPU budget per test (tests/cpu_budget.py) fails a test that spends more CPU
than allowed, in the process or in a child, and lets the slow list's tests through."""

from pathlib import Path

from tests.cpu_budget import listed
from tests.slow_tests import SLOW

pytest_plugins = ["pytester"]

BURN = """
import subprocess, sys, time

def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass

def test_cheap():
    pass

def test_burns_in_the_process():
    burn(0.6)

def test_burns_in_a_child():
    subprocess.run([sys.executable, "-c",
                    "import time\\nend = time.process_time() + 0.6\\n"
                    "while time.process_time() < end: pass"], check=True)
"""


def test_a_test_over_its_cpu_budget_fails_naming_the_slow_list(pytester, monkeypatch):
    monkeypatch.setenv("SPEEDLIGHT_TEST_CPU_BUDGET_S", "0.3")
    pytester.makepyfile(test_burn=BURN)
    result = pytester.runpytest("-p", "tests.cpu_budget", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*test_burns_in_the_process took * s of CPU time*",
                                 "*test_burns_in_a_child took * s of CPU time*slow_tests.py*"])


def test_the_slow_list_names_tests_with_their_reasons():
    assert len(SLOW) <= 25
    root = Path(__file__).resolve().parent.parent
    for test, reason in SLOW.items():
        assert test.startswith("tests/") and "::" in test and len(reason) > 20, test
        path, name = test.split("::")[0], test.split("::")[1].split("[")[0]
        assert f"def {name}(" in (root / path).read_text(), f"{test}: no such test"
    assert listed("tests/a.py::test_x[p1]@report", {"tests/a.py::test_x": "why"})
    assert listed("tests/a.py::test_x[p1]", {"tests/a.py::test_x[p1]": "why"})
    assert not listed("tests/a.py::test_x[p2]", {"tests/a.py::test_x[p1]": "why"})
    assert not listed("tests/a.py::test_xy", {"tests/a.py::test_x": "why"})
