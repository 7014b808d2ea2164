"""The versions speedlight is tested with (speedlight/versions.py): one warning at import for
torch, Triton or transformers outside them, nothing inside."""

import os
import subprocess
import sys

import pytest

from speedlight import versions


@pytest.mark.parametrize("found", [
    pytest.param({"torch": "2.11.0+cu130", "triton": "3.6.0", "transformers": "5.17.0"},
                 id="oldest"),
    pytest.param({"torch": "2.15.2", "triton": "3.9.1", "transformers": "5.25.3"}, id="newest"),
    pytest.param({"torch": "2.13.0.dev20260901+cpu", "triton": None, "transformers": None},
                 id="a-nightly-and-packages-missing"),
])
def test_versions_inside_the_tested_range_say_nothing(found):
    assert versions.untested(found) is None


def test_versions_outside_are_named_with_which_way_and_the_range():
    text = versions.untested({"torch": "2.16.0", "triton": "3.5.0", "transformers": "5.25.0"})
    assert "torch 2.16.0 (newer than tested)" in text
    assert "triton 3.5.0 (older than tested)" in text and "transformers 5.25" not in text
    assert ("tested with torch 2.11 to 2.15, triton 3.6 to 3.9, transformers 5.17 to 5.25"
            in text)


# a process whose metadata reports versions outside the range, importing speedlight twice
_OUTSIDE = """
import importlib.metadata as md
real = md.version
md.version = lambda name: {"torch": "2.16.0", "transformers": "5.16.1"}.get(name) or real(name)
import speedlight
import speedlight.versions
print(speedlight.__version__)
"""


def test_an_untested_environment_gets_one_warning_at_import_and_still_imports():
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    out = subprocess.run([sys.executable, "-c", _OUTSIDE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == __import__("speedlight").__version__
    lines = [line for line in out.stderr.splitlines() if "UntestedVersionWarning" in line]
    assert len(lines) == 1, out.stderr
    assert "torch 2.16.0 (newer than tested)" in lines[0]
    assert "transformers 5.16.1 (older than tested)" in lines[0]


def test_pyproject_pins_the_range_versions_states():
    """pyproject.toml's dependency bounds and versions.TESTED name one range: the oldest
    minor tested as the floor, the next minor after the newest as the ceiling."""
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for r in project["optional-dependencies"]["hf"]]
    pins = {r.name: r.specifier for r in requirements}
    for package, ((lo_major, lo_minor), (hi_major, hi_minor)) in versions.TESTED.items():
        spec = {(s.operator, s.version) for s in pins[package]}
        assert spec == {(">=", f"{lo_major}.{lo_minor}"), ("<", f"{hi_major}.{hi_minor + 1}")}, (
            package, pins[package])
