"""Hold kernels to what they were designed to compile to (spec.KernelDesign).

A kernel falls short when: a load or store of row data is narrower than the design's
vector width; it spills; its theoretical occupancy is under the design's; a matrix kernel's
SASS lacks the tensor-core family (mma) or the TMA loads its design names, or its pipeline
has fewer stages in shared memory than min_stages; a warp-specialized kernel lacks the
worker partitions its design names or the register reallocation to them (roles); it needs
more shared memory per
program than the target allows; or a direction
moves more bytes per compulsory byte than its kernels' designs allow (or fewer than
compulsory: then it did not do what its cost counts). `speedlight inspect
--check` and the CI guards (tests/inspect/test_guards.py) use these checks.

Guard cases are chosen here too, from an op's "aligned" shapes (rows contiguous and
16-byte aligned, by OpSpec.aligned_rows; finite inputs), each captured dry (launches
recorded, nothing run): one case per kernel configuration for the compile checks, and per
launch plan the case with the most rows the interpreter can run in a budget for the bytes
checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speedlight.inspect import loops
from speedlight.inspect.case_report import CaseReport, DirectionBytes, KernelReport
from speedlight.inspect.launches import Capture, capture_case, interpreter_work
from speedlight.launch import for_target
from speedlight.spec import Case, KernelDesign, OpSpec
from speedlight.target import Target


@dataclass(frozen=True)
class Shortfall:
    kernel: str
    check: str  # vector | spill | occupancy | mma | tma | roles | stages | smem | bytes | compile
    # | error | chained-dots
    text: str

    def __str__(self) -> str:
        return f"{self.kernel}: {self.check}: {self.text}"


def check_kernel(k: KernelReport) -> list[Shortfall]:
    """Every check of one compiled kernel (Triton or CUDA C++)."""
    name, d = k.name, k.design
    if k.error:
        return [Shortfall(name, "compile", k.error)]
    out = []
    for a in k.accesses:
        if a.row_data and a.bits < d.vector_bits:
            where = f"`{a.source[:60]}`" if a.marked else f"of {a.arg}"
            out.append(Shortfall(name, "vector", f"line {a.line} {a.kind} {where}: "
                                 f"{a.sass.describe() if a.sass else 'no global access'}, "
                                 f"designed for {d.vector_bits}-bit"))
    # a pipelined loop's row loads are cp.async copies (LDGSTS): global loads too
    loads = k.mix.global_loads + k.mix.async_copies
    for kind, widths in (("load", loads), ("store", k.mix.global_stores)):
        rows = any(a.row_data and a.kind == kind for a in k.accesses)
        if rows and widths and d.vector_bits > 32 and not any(b >= d.vector_bits for b in widths):
            got = ", ".join(f"{b}-bit x{n}" for b, n in sorted(widths.items()))
            out.append(Shortfall(name, "vector", f"no {d.vector_bits}-bit global {kind} at "
                                 f"all ({got})"))
    return out + _check_resources(name, k, d) + check_matrix(k) + check_chained_dots(k)


def check_chained_dots(k: KernelReport) -> list[Shortfall]:
    """Two dots into one accumulator in a loop on tcgen05 MMA: wrong results on Blackwell
    (findings._chained_dots), whatever the case."""
    if k.cuda or k.compiled is None or not any(op.startswith("UTC") for op in k.mix.tensor_core):
        return []
    pairs = loops.chained_dots(k.compiled.text("ttir"))
    return [Shortfall(k.name, "chained-dots", f"tl.dot at lines {a} and {b} accumulate into one "
                      f"accumulator in one loop iteration: wrong results on tcgen05 MMA")
            for a, b in pairs]


def _check_resources(name: str, k: KernelReport, d: KernelDesign) -> list[Shortfall]:
    """No spills unless designed with them, the design's occupancy, and the tensor-core
    family and TMA loads a design names."""
    out = []
    if not d.spills and (k.spill_stores or k.spill_loads or sum(k.mix.local.values())):
        out.append(Shortfall(name, "spill", f"{k.spill_stores} bytes spilled "
                             f"({k.registers} registers/thread)"))
    if k.occupancy.fraction + 1e-9 < d.min_occupancy:
        out.append(Shortfall(name, "occupancy", f"{k.occupancy.fraction:.0%} theoretical "
                             f"(limited by {k.occupancy.limiter}), designed for at least "
                             f"{d.min_occupancy:.0%}"))
    tc = k.mix.tensor_core
    if d.mma and not tc.get(d.mma):
        got = ", ".join(f"{op} x{n}" for op, n in sorted(tc.items())) or "no tensor-core op"
        out.append(Shortfall(name, "mma", f"designed for {d.mma}, SASS has {got}"))
    if d.partitions and list(d.partitions) != [tuple(p) for p in k.partitions]:
        out.append(Shortfall(name, "roles", f"designed for worker partitions (warps, "
                             f"registers) {list(d.partitions)}, TTGIR has "
                             f"{k.partitions or 'no warp specialization'}"))
    missing = [r for _, r in d.partitions if r not in k.setmaxnreg]
    if d.partitions and missing:
        out.append(Shortfall(name, "roles", f"no register reallocation to {missing} in the "
                             f"SASS (USETMAXREG to {list(k.setmaxnreg) or 'none'})"))
    if d.tma and not k.mix.tma.get("UTMALDG"):
        out.append(Shortfall(name, "tma", f"designed for TMA loads, SASS has no UTMALDG "
                             f"({sum(k.mix.async_copies.values())} LDGSTS, "
                             f"{sum(k.mix.global_loads.values())} LDG)"))
    return out


def check_matrix(k: KernelReport) -> list[Shortfall]:
    """What a matrix kernel's design names beyond _check_resources (min_stages), and shared
    memory within the target's limit (any kernel)."""
    name, d, out = k.name, k.design, []
    if k.stages < d.min_stages:
        asked = getattr(k.launch, "num_stages", None)  # a Triton launch's
        out.append(Shortfall(name, "stages", f"{k.stages} pipeline stage(s) in shared memory "
                             f"(num_stages={asked}), designed for at least {d.min_stages}"))
    if k.smem_limit and k.smem > k.smem_limit:
        out.append(Shortfall(name, "smem", f"{k.smem} bytes of shared memory per program, "
                             f"over the target's {k.smem_limit}"))
    return out


# A direction that moves fewer bytes than compulsory did not do what its cost counts (an
# output it skipped, a cost out of step with the kernels): the ratio would hide a re-read.
MIN_RATIO = 0.95


def check_direction(d: DirectionBytes) -> list[Shortfall]:
    kernels = "+".join(d.kernels)
    if d.ratio < MIN_RATIO:
        return [Shortfall(kernels, "bytes", f"{d.direction} moves only {d.ratio:.3f}x its "
                          f"compulsory bytes: the run did less than its cost counts")]
    if d.ratio <= d.allowed + 1e-9:
        return []
    return [Shortfall(kernels, "bytes", f"{d.direction} moves {d.ratio:.3f}x its "
                      f"compulsory bytes, designed for at most {d.allowed:.2f}x")]


def check_report(report: CaseReport) -> list[Shortfall]:
    """Every shortfall of a case: its error (the op raised while captured, or its source
    did not compile), each kernel's, each direction's bytes."""
    if report.error:
        return [Shortfall(report.op, "error", report.error)]
    return [s for k in report.kernels for s in check_kernel(k)] + \
        [s for d in report.directions for s in check_direction(d)]


# A bytes design counts the traffic once what each program re-reads (a weight vector, a
# partial sum) is spread over its rows: it holds from this many rows per SM of the GPU the
# launches are sized for (a decode step's few rows measure launch set-up instead).
AMORTISED_ROWS_PER_SM = 4


def design_applies(spec: OpSpec, case: Case, shortfall: Shortfall, sm_count: int) -> bool:
    """Whether a design covers this case, so that falling short of it is a regression: a
    compile error always; on aligned cases (aligned() below) the vector width, spills and
    occupancy, and the bytes from AMORTISED_ROWS_PER_SM rows per SM (an error of the
    case, too, always counts). Elsewhere (a row
    width off a multiple of 16 elements, a strided or transposed view, non-finite inputs)
    narrower accesses and other block configurations are expected: information."""
    if shortfall.check in ("compile", "error", "chained-dots"):
        return True
    if not aligned(spec, case):
        return False
    if shortfall.check == "bytes":
        return spec.rows(case) >= AMORTISED_ROWS_PER_SM * sm_count
    return True


def triage(spec: OpSpec, report: CaseReport, sm_count: int) -> tuple[list[Shortfall], list[Shortfall]]:
    """(held, informational): the report's shortfalls where its designs apply, and the rest
    (bytes measured on a smaller case than the one reported are information)."""
    held, info = [], []
    elsewhere = any(d.measured_on for d in report.directions)
    for s in check_report(report):
        holds = design_applies(spec, report.case, s, sm_count) and not (elsewhere and s.check == "bytes")
        (held if holds else info).append(s)
    return held, info


# --- which cases to hold kernels to --------------------------------------------------------

def aligned(spec: OpSpec, case: Case) -> bool:
    """A case whose rows Triton can prove 16-byte aligned (OpSpec.aligned_rows: the op's
    own rule, else every width after the row count a multiple of 16 elements, contiguous)
    and whose inputs are finite. Misaligned widths compile to narrower accesses, which
    inspect reports as a finding rather than holds to the design."""
    return spec.aligned_rows(case) and not case.flag("nonfinite")


def survey(spec: OpSpec, cases: list[Case], target: Target,
           device: torch.device | str = "cpu",
           max_bytes: int = 64 * 2**20) -> list[tuple[Case, Capture]]:
    """Each of `cases` captured dry (launches recorded, not run: this costs the inputs
    only) with the launches a user of `target` gets (sized for it, with its tuned tables,
    as inspect_cases captures them), cheapest first; skipped cases and cases moving more
    than max_bytes left out."""
    device = torch.device(device)
    out = []
    with for_target(target):
        for case in sorted(cases, key=lambda c: spec.cost(c, "fwd").bytes):
            if spec.skip(case, device) or spec.cost(case, "fwd").bytes > max_bytes:
                continue
            out.append((case, capture_case(spec, case, device, arch=target.arch, mode="dry")))
    return out


def kernel_cases(surveyed: list[tuple[Case, Capture]]) -> list[Case]:
    """The fewest surveyed cases that launch every kernel configuration the others do
    (function, dtypes, block constexprs, num_warps: Launch.design_key), cheapest first."""
    keys = [{launch.design_key() for launch in capture.launches} for _, capture in surveyed]
    chosen, seen = [], set()
    while True:  # greedy cover: the case adding the most configurations, the cheapest on ties
        best = max(range(len(keys)), key=lambda i: (len(keys[i] - seen), -i), default=None)
        if best is None or not keys[best] - seen:
            break
        chosen.append(best)
        seen |= keys[best]
    return [surveyed[i][0] for i in sorted(chosen)]


def bytes_cases(spec: OpSpec, surveyed: list[tuple[Case, Capture]], target: Target, *,
                direction: str, budget: int,
                device: torch.device | str = "cpu") -> tuple[list[Case], dict[tuple, int]]:
    """One case per launch plan of `direction` (the kernels it launches: a fused kernel, a
    looped one, a split pair...): the one with the most rows (OpSpec.rows; then the fewest
    bytes) whose full interpreter run stays within `budget` program-iterations (each costs
    milliseconds on a CPU), forward only for 'fwd'.
    Most rows, because what a grid re-reads per program (a weight vector, a partial sum)
    shrinks per byte as rows grow: the case shows the traffic a design amortises, not the
    launch overhead of a decode step. Also returns the plans no case could afford, each
    with the fewest program-iterations one would take."""
    device = torch.device(device)
    plans: dict[tuple, list[Case]] = {}
    for case, capture in surveyed:
        plan = tuple(l.kernel for l in capture.direction(direction))
        if plan:
            plans.setdefault(plan, []).append(case)
    chosen, unaffordable = [], {}
    for plan, cases in plans.items():
        order = sorted(cases, key=lambda c: (-spec.rows(c), spec.cost(c, "fwd").bytes))
        least = None
        for case in order:
            with for_target(target):
                sample = capture_case(spec, case, device, arch=target.arch, mode="sample",
                                      backward=direction == "bwd")
            work = interpreter_work(sample)
            if work <= budget:
                chosen.append(case)
                break
            least = work if least is None else min(least, work)
        else:
            unaffordable[plan] = least
    return chosen, unaffordable
