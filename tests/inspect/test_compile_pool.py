"""inspect's compile workers are kept for the life of the process (their imports, torch's
and Triton's, are paid once, not once per compile call), and a worker that ended is
replaced."""

import torch

from speedlight import registry
from speedlight.inspect import compile as compile_
from speedlight.inspect.run import inspect_cases
from speedlight.target import resolve

SPEC = registry.builtin_spec("softmax")
TARGET = resolve("sm_90a")


def _registers(case) -> list[int]:
    reports = inspect_cases([(SPEC, case)], TARGET, compiler=compile_.TritonCompiler(jobs=1),
                            mode="dry")
    return [k.registers for r in reports for k in r.kernels]


def _pids() -> list[int]:
    return [w.proc.pid for w in compile_._POOL["workers"]]


def test_workers_are_kept_between_compile_calls_and_a_dead_one_is_replaced(monkeypatch):
    a, b = SPEC.cases("quick")[:2]
    a, b = a.with_(dtype=torch.bfloat16), b.with_(dtype=torch.float32)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "first")
    first = _registers(a)
    pids = _pids()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "second")  # pytest's, changing per test
    assert _registers(b) and all(first) and _pids() == pids
    compile_._POOL["workers"][0].proc.kill()
    compile_._POOL["workers"][0].proc.wait()
    # another compiler: its own memo is empty, so the kernel is compiled again
    assert _registers(a) == first and _pids() != pids
