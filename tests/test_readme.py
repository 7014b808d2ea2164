"""The README's first commands are the ones a new user runs; keep them true."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _first_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_install_and_test_commands():
    install, test = _first_block()[:2]
    assert "pip install" in install and "speedlight " in install
    assert test.startswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _first_block()[1] in [line.strip() for line in ci]


def test_readme_says_to_set_the_interpreter_before_anything_imports_triton():
    """Set after triton's import, the interpreter cannot call triton's own functions
    (tests/test_import.py holds the error speedlight gives then)."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "set `TRITON_INTERPRET=1` before anything imports triton" in text
    assert "before speedlight's ops are first used" not in text
