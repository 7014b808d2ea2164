"""CI guards: every built-in memory-bound kernel, compiled for sm_90a and sm_100a (no GPU
needed) at aligned model shapes with the launches an H100 (a B200) user gets, is held to
its design
(spec.KernelDesign): 128-bit global loads and stores on its row data, no spills, the
theoretical occupancy it was designed for; and the bytes each forward moves, counted
under the interpreter, are within 5% of compulsory (or the declared two-pass ratio).
Backward ratios are held to their declared designs and printed in the guard table.

Ops are taken from the registry, so ops added later are guarded without a change here.
"""

import pytest
import torch

from speedlight import registry
from speedlight.inspect import guard
from speedlight.inspect.run import inspect_cases
from speedlight.target import resolve
from tests.inspect.conftest import GUARD_TABLE, TARGET

TARGETS = [pytest.param(TARGET, id="sm_90a"), pytest.param(resolve("sm_100a"), id="sm_100a")]

DTYPE = torch.bfloat16
FWD_BUDGET = 1200  # program-iterations of a full interpreter run (milliseconds each)
BWD_BUDGET = 600

SPECS = [s for s in registry.builtin_specs() if s.family == "memory-bound"]


# The suites whose configurations each target compiles: on sm_90a the model suite's and
# the quick suite's (small shapes that reach block configurations the model shapes only
# reach at sizes too big for CI); on sm_100a the model suite's, the configurations users'
# shapes launch (what differs there is the arch's ptxas, not the configuration).
SUITES = {"sm_90a": ("model", "quick"), "sm_100a": ("model",)}


def candidates(spec, suites=SUITES["sm_90a"]):
    """Aligned cases of the op's suites."""
    out = []
    for suite in suites:
        out += [c.with_(dtype=DTYPE) for c in spec.cases(suite) if guard.aligned(spec, c)]
    return out


_SURVEYS: dict = {}


def surveyed(spec, suites=SUITES["sm_90a"]):
    if (spec.name, suites) not in _SURVEYS:
        _SURVEYS[spec.name, suites] = guard.survey(spec, candidates(spec, suites), TARGET)
    return _SURVEYS[spec.name, suites]


def _widths(counter) -> str:
    return " ".join(f"{w}x{n}" for w, n in sorted(counter.items(), reverse=True))


def _config(launch) -> str:
    declared = [f"{a.name}={a.value}" for a in launch.args if a.name in launch.declared]
    return " ".join(declared + [f"warps={launch.num_warps}"])


def _note_unmeasured(spec, direction, unaffordable, budget):
    for plan, work in unaffordable.items():
        GUARD_TABLE.append(f"{spec.name:9s} {direction} bytes {', '.join(plan):60s} not measured: "
                           f"its cheapest aligned case takes {work} program-iterations "
                           f"(budget {budget})")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_kernels_compile_to_their_design(spec, target, compiler):
    cases = guard.kernel_cases(surveyed(spec, SUITES[target.arch_name]))
    assert cases, f"{spec.name}: no aligned case to compile"
    reports = inspect_cases([(spec, c) for c in cases], target, compiler=compiler,
                            mode="sample")
    short, seen = [], set()
    for r in reports:
        for k in r.kernels:
            rows = [a for a in k.accesses if a.row_data]
            key = k.launch.design_key()
            if key not in seen:
                seen.add(key)
                GUARD_TABLE.append(
                    f"{target.arch_name} {spec.name:9s} {k.launch.kernel:34s} "
                    f"{_config(k.launch):46s} "
                    f"regs {k.registers:3d} spill {k.spill_stores:3d} "
                    f"occ {k.occupancy.fraction:4.0%} (min {k.design.min_occupancy:.0%}) "
                    f"LDG {_widths(k.mix.global_loads)} | STG {_widths(k.mix.global_stores)}"
                    f"  [{r.case.label}]")
            short += [f"{r.case.label}: {s}" for s in guard.check_kernel(k)]
            if not rows:
                short.append(f"{r.case.label}: {k.launch.kernel}: no row-data access seen")
    assert not short, "\n".join(short)


def _bytes_guard(spec, compiler, direction: str, budget: int) -> list:
    """Measure each launch plan of `direction` at its affordable case; record the ratios in
    the guard table; return the directions measured and the shortfalls."""
    cases, unaffordable = guard.bytes_cases(spec, surveyed(spec), TARGET,
                                            direction=direction, budget=budget)
    _note_unmeasured(spec, direction, unaffordable, budget)
    assert cases, f"{spec.name}: no aligned case the interpreter can run within the budget"
    # the bytes are counted under the interpreter: nothing to compile (the test before
    # compiles every configuration)
    reports = inspect_cases([(spec, c) for c in cases], TARGET, compiler=compiler,
                            mode="run", backward=direction == "bwd", compile_kernels=False)
    measured, short = [], []
    for r in reports:
        (d,) = [d for d in r.directions if d.direction == direction]
        measured.append(d)
        GUARD_TABLE.append(f"{spec.name:9s} {direction} bytes {', '.join(d.kernels):60s} "
                           f"{d.ratio:.4f}x compulsory (allowed {d.allowed:.2f})  [{r.case.label}]")
        short += [f"{r.case.label}: {s}" for s in guard.check_direction(d)]
    return measured, short


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_forward_bytes_within_5_percent_of_compulsory(spec, compiler):
    measured, short = _bytes_guard(spec, compiler, "fwd", FWD_BUDGET)
    assert not short, "\n".join(short)
    assert any(d.allowed <= 1.05 for d in measured), f"{spec.name}: no single-pass forward measured"


@pytest.mark.parametrize("spec", [s for s in SPECS if s.grad_inputs],
                         ids=[s.name for s in SPECS if s.grad_inputs])
def test_backward_bytes_are_measured_and_within_their_design(spec, compiler):
    _, short = _bytes_guard(spec, compiler, "bwd", BWD_BUDGET)
    assert not short, "\n".join(short)
