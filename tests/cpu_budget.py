"""Each test's CPU budget: at most BUDGET_S seconds of CPU time for its set-up and call
(this process's threads, and the child processes it waited for), unless tests/slow_tests.py
names it with its reason. CPU time, not wall time: a test on a loaded machine takes longer
but does not cost more, so the rule does not make the suite flaky.

Child processes count whether or not they have ended: a pool of workers, or a local Ray
cluster, charges each test for the CPU its processes spent during it.

A session or module fixture is paid by the first test that asks for it, so the tests that
build the shared fixtures (the report run, the compile batches) are the ones listed.

SPEEDLIGHT_TEST_CPU_BUDGET_S sets another budget (0 turns the rule off);
SPEEDLIGHT_TEST_CPU_LOG=PATH appends one JSON line per test (id, CPU and wall seconds) to
PATH, from every worker, for a look at where the suite's time goes."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

BUDGET_S = 20.0
_START = pytest.StashKey[tuple[float, float, float]]()


def _cpu_s() -> float:
    """This process's CPU seconds, its ended children's (the ones waited for), and those of
    its descendants still running (with what they waited for): a descendant reaped between
    two readings moves from the last term to the second, so it is counted once."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime
    try:
        import psutil
    except ImportError:
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:  # ended meanwhile, or a zombie
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _budget() -> float:
    value = os.environ.get("SPEEDLIGHT_TEST_CPU_BUDGET_S")
    return BUDGET_S if value is None else float(value)


def listed(nodeid: str, slow: dict[str, str]) -> bool:
    """Whether `nodeid` (pytest's, perhaps with xdist's "@group" and a parametrization)
    is one of the slow list's entries: a test function, or one parametrization of it."""
    bare = nodeid.split("@", 1)[0]
    return bare in slow or bare.split("[", 1)[0] in slow


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = (_budget(), _cpu_s(), time.perf_counter())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or _START not in item.stash:
        return
    budget, cpu0, wall0 = item.stash[_START]
    cpu, wall = _cpu_s() - cpu0, time.perf_counter() - wall0
    log = os.environ.get("SPEEDLIGHT_TEST_CPU_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"test": item.nodeid.split("@", 1)[0], "cpu_s": round(cpu, 2),
                                "wall_s": round(wall, 2)}) + "\n")
    from tests.slow_tests import SLOW
    if report.passed and budget > 0 and cpu > budget and not listed(item.nodeid, SLOW):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {cpu:.1f} s of CPU time (wall {wall:.1f} s), "
                           f"over the {budget:g} s a test may take: make it cheaper, or name "
                           "it in tests/slow_tests.py with the reason it needs the time")
