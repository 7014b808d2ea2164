"""Shared by the inspect tests: one compiler per session (each distinct kernel compiles
once), and the guard table printed at the end of the run."""

import pytest

from speedlight import hardware
from speedlight.inspect.compile import Compiler, parse_target

TARGET = parse_target("sm_90a")
SKU = hardware.get_device_spec("h100-sxm")
GUARD_TABLE: list[str] = []


@pytest.fixture(scope="session")
def compiler() -> Compiler:
    return Compiler()


def pytest_terminal_summary(terminalreporter):
    if GUARD_TABLE:
        terminalreporter.section(f"inspect guards ({TARGET.name}, launches sized for {SKU.name})")
        for line in GUARD_TABLE:
            terminalreporter.write_line(line)
