"""Shared by the inspect tests: one compiler per session (each distinct kernel compiles
once), and the guard table printed at the end of the run."""

import pytest

from speedlight.inspect.compile import TritonCompiler
from speedlight.target import resolve

TARGET = resolve("sm_90a", sku="h100-sxm")
SKU = TARGET.sku
GUARD_TABLE: list[str] = []


@pytest.fixture(scope="session")
def compiler() -> TritonCompiler:
    return TritonCompiler()


def pytest_terminal_summary(terminalreporter):
    if GUARD_TABLE:
        terminalreporter.section(f"inspect guards ({TARGET.arch_name}, launches sized for {SKU.name})")
        for line in GUARD_TABLE:
            terminalreporter.write_line(line)
