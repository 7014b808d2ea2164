"""Inspect CUDA C++ kernels as Triton kernels are inspected: each launch an op's
CudaKernels names, compiled for the target (inspect/cuda_compile.py), with its resources,
occupancy, waves, SASS mix and access widths per source line, its findings and the guard
against its KernelDesign.

    report = inspect_case("rms_norm", spec.cuda, spec.kernels, case, target, sm_count)
    held, info = judge(spec, report)                      # what --check fails on

Launch geometry is not captured from a run (a CPU machine cannot run the kernels): the
OpSpec's CudaKernels.launches(case, sm_count) returns what its launcher would launch (the
kernel, its template instance, grid, threads, dynamic shared memory), sized by the same
functions the launcher calls (speedlight.launch.cuda_row_launch).

Access widths: every global load and store of a kernel is grouped by source line. A line
whose accesses are scalar by design (the scalar tail after a row's 16-byte vectors, a row
on the misaligned path, a per-row statistic) says so with the comment
`// speedlight: scalar` on that line, or on a line opening the block that holds it; every
other line is row data, held to its KernelDesign.vector_bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from speedlight.inspect import sass
from speedlight.inspect.cuda_compile import Binary, Compiler, CudaToolError, Function
from speedlight.inspect.findings import ERROR, INFO, WARN, Finding
from speedlight.inspect.guard import Shortfall, check_resources
from speedlight.inspect.occupancy import Occupancy, Waves, occupancy
from speedlight.spec import Case, CudaKernels, CudaLaunch, KernelDesign
from speedlight.target import Target

SCALAR_MARK = "speedlight: scalar"


# --- one launch, judged ------------------------------------------------------------------

@dataclass
class LineAccess:
    """The global loads or stores one source line compiled to."""

    kind: str
    file: str
    line: int
    source: str
    sass: sass.LineAccess
    scalar: bool  # marked `// speedlight: scalar`: narrower than the design by design

    @property
    def bits(self) -> int:
        return self.sass.narrowest

    def to_json(self) -> dict:
        return {"kind": self.kind, "file": os.path.basename(self.file), "line": self.line,
                "source": self.source, "sass": dict(self.sass.widths), "scalar": self.scalar}


@dataclass
class CudaKernelReport:
    """One CUDA launch of a case: its kernel's resources, occupancy, waves, SASS and the
    findings, against its KernelDesign."""

    launch: CudaLaunch
    design: KernelDesign
    function: Function | None
    error: str = ""
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0  # static + the launch's dynamic shared memory, bytes per block
    occupancy: Occupancy | None = None
    waves: Waves | None = None
    mix: sass.Mix | None = None
    accesses: list[LineAccess] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def name(self) -> str:
        l = self.launch
        return f"{l.kernel}<{l.instance}>" if l.instance else l.kernel

    def to_json(self) -> dict:
        l = self.launch
        out = {"direction": l.direction, "kernel": self.name, "grid": l.grid,
               "threads": l.threads, "dynamic_smem": l.smem, "error": self.error or None,
               "function": self.function.demangled if self.function else None}
        if not self.error:
            out.update(registers=self.registers, spill_stores=self.spill_stores,
                       spill_loads=self.spill_loads, stack=self.stack, smem=self.smem,
                       occupancy=self.occupancy.to_json(), waves=self.waves.to_json(),
                       sass=self.mix.to_json(), accesses=[a.to_json() for a in self.accesses])
        out["findings"] = [f.to_json() for f in self.findings]
        return out


@dataclass
class CudaCaseReport:
    op: str
    case: Case
    target: Target
    sm_count: int
    source: str
    kernels: list[CudaKernelReport] = field(default_factory=list)
    error: str = ""
    binary_folder: Path | None = None  # the cached cubin, SASS and ptxas log


def _source_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []


def scalar_lines(lines: list[str]) -> set[int]:
    """The 1-based lines `// speedlight: scalar` covers: the marked line, and when its code
    opens a block ('{'), every line to the brace that closes it."""
    out: set[int] = set()
    for i, text in enumerate(lines):
        if SCALAR_MARK not in text:
            continue
        out.add(i + 1)
        code = text.split("//")[0]
        if "{" not in code:
            continue
        depth = 0
        for j in range(i, len(lines)):
            part = lines[j].split("//")[0]
            depth += part.count("{") - part.count("}")
            out.add(j + 1)
            if depth <= 0:
                break
    return out


def analyse(launch: CudaLaunch, design: KernelDesign, binary: Binary, target: Target,
            sm_count: int) -> CudaKernelReport:
    """Resources, occupancy, waves, SASS mix and per-line access widths of one launch,
    with its findings."""
    report = CudaKernelReport(launch, design, None)
    if binary.error:
        report.error = binary.error
    else:
        fn = binary.find(launch.kernel, launch.instance)
        if fn is None:
            report.error = (f"no kernel {report.name} in {os.path.basename(binary.source)} "
                            f"(it has {', '.join(binary.kernels()) or 'none'})")
        report.function = fn
    if report.error:
        report.findings = [Finding("compile-error", ERROR, f"{report.name} did not compile "
                                   f"for {target.arch_name}: {report.error}", report.name)]
        return report
    fn = report.function
    p = fn.ptxas
    report.registers, report.stack = p.get("registers", 0), p.get("stack", 0)
    report.spill_stores, report.spill_loads = p.get("spill_stores", 0), p.get("spill_loads", 0)
    report.smem = p.get("smem_static", 0) + launch.smem
    warps = -(-launch.threads // 32)
    report.occupancy = occupancy(target.limits, warps, report.registers, report.smem)
    report.waves = Waves(launch.grid, sm_count, report.occupancy.blocks_per_sm)
    instrs = fn.instrs
    report.mix = sass.mix(instrs)
    text_of: dict[str, tuple[list[str], set[int]]] = {}
    for (file, line, kind), acc in sorted(sass.accesses_by_line(instrs).items()):
        if file not in text_of:
            lines = _source_lines(file)
            text_of[file] = (lines, scalar_lines(lines))
        lines, scalar = text_of[file]
        src = lines[line - 1].split("//")[0].strip() if 0 < line <= len(lines) else ""
        report.accesses.append(LineAccess(kind, file, line, src, acc, line in scalar))
    report.findings = findings(report, target.arch_name)
    return report


def findings(k: CudaKernelReport, target_name: str) -> list[Finding]:
    """What findings.py says of a Triton kernel, for a CUDA one: narrow row accesses (by
    source line), spills, tensor-core family, occupancy, the last wave and idle SMs."""
    name, d, out = k.name, k.design, []
    scalar = []
    for a in k.accesses:
        if a.bits >= d.vector_bits:
            continue
        if a.scalar:
            scalar.append(a)
            continue
        out.append(Finding(
            "narrow-access", WARN, f"line {a.line} `{a.source[:60]}`: {a.kind}s of row data "
            f"are {a.bits}-bit ({a.sass.describe()}), designed for {d.vector_bits}-bit",
            name, {"line": a.line, "sass": dict(a.sass.widths), "scalar": False}))
    if scalar:
        lines = sorted({a.line for a in scalar})
        out.append(Finding(
            "narrow-access", INFO, f"{len(scalar)} narrower accesses on lines marked scalar by "
            f"design ({', '.join(map(str, lines))}: `// {SCALAR_MARK}`)", name,
            {"lines": lines, "scalar": True}))
    local = sum(k.mix.local.values())
    if k.spill_stores or k.spill_loads or local:
        out.append(Finding(
            "spill", WARN, f"{k.spill_stores} bytes spilled to local memory ({k.spill_loads} "
            f"bytes reloaded): {k.registers} registers/thread, {k.stack}-byte stack frame, "
            f"{k.mix.local.get('STL', 0)} STL / {k.mix.local.get('LDL', 0)} LDL instructions",
            name, {"spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
                   "registers": k.registers, "stack": k.stack}))
    tc = k.mix.tensor_core
    if d.mma and not tc.get(d.mma):
        got = ", ".join(f"{op} x{n}" for op, n in sorted(tc.items())) or "no tensor-core op"
        out.append(Finding("no-wgmma", WARN, f"designed for {d.mma} on {target_name}, SASS has "
                           f"{got}", name, {"tensor_core": dict(tc)}))
    if d.tma and not k.mix.tma.get("UTMALDG"):
        out.append(Finding("no-tma", WARN, f"designed for TMA loads but the SASS on "
                           f"{target_name} has no UTMALDG", name, {"tma": dict(k.mix.tma)}))
    occ = k.occupancy
    if occ.fraction + 1e-9 < d.min_occupancy:
        out.append(Finding(
            "occupancy", WARN, f"theoretical occupancy {occ.fraction:.0%} ({occ.warps_per_sm} "
            f"of {occ.max_warps_per_sm} warps per SM, {occ.blocks_per_sm} blocks of "
            f"{k.launch.threads} threads), limited by {occ.limiter} ({k.registers} registers/"
            f"thread, {k.smem} bytes of shared memory); designed for at least "
            f"{d.min_occupancy:.0%}", name, occ.to_json()))
    w = k.waves
    if w.programs > w.per_wave and w.idle_share >= 0.5:
        out.append(Finding("last-wave", WARN, f"grid of {w.programs} blocks on {w.sms} SMs x "
                           f"{w.per_sm} resident: {w.waves:.2f} waves, the last one "
                           f"{w.idle_share:.0%} idle", name, w.to_json()))
    elif w.programs < w.sms:
        out.append(Finding("idle-sms", INFO, f"grid of {w.programs} blocks on {w.sms} SMs: "
                           f"{w.sms - w.programs} SMs have no work", name, w.to_json()))
    return out


def check(k: CudaKernelReport) -> list[Shortfall]:
    """The guard (guard.check_kernel's checks for a CUDA kernel): a compile error; a
    row-data line narrower than vector_bits; no access of vector_bits at all in a kernel
    designed for vectors; spills; occupancy; the tensor-core family and TMA a design names."""
    name, d = k.name, k.design
    if k.error:
        return [Shortfall(name, "compile", k.error)]
    out = []
    for a in k.accesses:
        if not a.scalar and a.bits < d.vector_bits:
            out.append(Shortfall(name, "vector", f"line {a.line} {a.kind} `{a.source[:60]}`: "
                                 f"{a.sass.describe()}, designed for {d.vector_bits}-bit"))
    for kind, widths in (("load", k.mix.global_loads), ("store", k.mix.global_stores)):
        if widths and d.vector_bits > 32 and not any(b >= d.vector_bits for b in widths):
            got = ", ".join(f"{b}-bit x{n}" for b, n in sorted(widths.items()))
            out.append(Shortfall(name, "vector", f"no {d.vector_bits}-bit global {kind} at "
                                 f"all ({got})"))
    return out + check_resources(name, k, d)


def inspect_case(op: str, kernels: CudaKernels, designs, case: Case, target: Target,
                 sm_count: int, compiler: Compiler | None = None) -> CudaCaseReport:
    """Every launch kernels.launches(case, sm_count) names, compiled for `target` and judged
    against designs[kernel] (an OpSpec's kernels; KernelDesign() for one not named)."""
    compiler = compiler or Compiler()
    report = CudaCaseReport(op, case, target, sm_count, str(kernels.source)[:200])
    try:
        binary = compiler.get(kernels.source, target.arch, kernels.include_dirs)
        launches = list(kernels.launches(case, sm_count))
    except (CudaToolError, FileNotFoundError, ValueError) as e:
        report.error = str(e)
        return report
    report.source, report.binary_folder = binary.source, binary.folder
    for launch in launches:
        report.kernels.append(analyse(launch, designs.get(launch.kernel, KernelDesign()),
                                      binary, target, sm_count))
    return report


def judge(spec, report: CudaCaseReport) -> tuple[list[Shortfall], list[Shortfall]]:
    """(held, informational), as guard.judge for Triton kernels: a compile error always
    counts; the designs cover aligned cases (guard.aligned: contiguous rows, 16-byte
    aligned widths, finite inputs); elsewhere a shortfall is information."""
    from speedlight.inspect import guard

    found = [Shortfall(report.op, "compile", report.error)] if report.error else \
        [s for k in report.kernels for s in check(k)]
    covered = guard.aligned(spec, report.case)
    held = [s for s in found if s.check == "compile" or covered]
    return held, [s for s in found if s not in held]


# --- output --------------------------------------------------------------------------------

def rows(report: CudaCaseReport, base: dict,
         implementation: str = "speedlight-cuda") -> list[dict]:
    """inspect.jsonl rows of a report (`base`: the fields every row of the run carries;
    `implementation`: what verify and bench rows call the op's CUDA implementation,
    OpSpec.label)."""
    base = dict(base, op=report.op, implementation=implementation, impl="cuda",
                language="cuda", case_id=report.case.id,
                case=report.case.to_json(), target=report.target.arch_name,
                sm_count=report.sm_count, source=report.source)
    if report.error or not report.kernels:
        return [dict(base, level="case", status="error" if report.error else "no-launch",
                     reason=report.error or "no CUDA launch for this case")]
    return [dict(base, level="kernel", **k.to_json()) for k in report.kernels]


def print_case(report: CudaCaseReport, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = (f"{report.op} {report.case.id} (CUDA C++, "
             f"{os.path.basename(report.source)}) on {report.target.arch_name}, launches "
             f"sized for {report.sm_count} SMs")
    if report.error:
        console.print(f"[red]{escape(title)}: {escape(report.error)}[/]", highlight=False)
        return
    t = Table(title=title, title_justify="left")
    for col in ("dir", "kernel", "grid x threads", "regs", "spills", "smem", "occupancy",
                "waves", "global loads", "global stores"):
        t.add_column(col)
    for k in report.kernels:
        l = k.launch
        if k.error:
            t.add_row(l.direction, escape(k.name), f"{l.grid} x {l.threads}", "", "", "", "",
                      "", f"[red]{escape(k.error)}[/]", "")
            continue
        widths = lambda c: ", ".join(f"{b}b x{n}" for b, n in sorted(c.items(), reverse=True))
        t.add_row(l.direction, escape(k.name), f"{l.grid} x {l.threads}", str(k.registers),
                  str(k.spill_stores), str(k.smem), f"{k.occupancy.fraction:.0%}",
                  f"{k.waves.waves:.2f}", widths(k.mix.global_loads),
                  widths(k.mix.global_stores))
    console.print(t)
    for k in report.kernels:
        for f in k.findings:
            style = {"error": "red", "warn": "yellow"}.get(f.severity, "dim")
            console.print(f"[{style}]{f.severity}[/] {escape(f.kernel)}: {f.code}: "
                          f"{escape(f.text)}", highlight=False)


def print_summary(reports: list[CudaCaseReport], console) -> None:
    """One row per kernel of every case (`inspect --all --impl cuda`), then the warnings."""
    from rich.markup import escape
    from rich.table import Table

    if not reports:
        return
    r0 = reports[0]
    t = Table(title=f"CUDA C++ kernels on {r0.target.arch_name} (launches sized for "
                    f"{r0.sm_count} SMs)", title_justify="left")
    for col in ("op", "case", "dir", "kernel", "grid x threads", "regs", "spills",
                "occupancy", "waves", "128-bit loads", "warnings"):
        t.add_column(col)
    for r in reports:
        if r.error:
            t.add_row(r.op, r.case.id, "", "", "", "", "", "", "", "",
                      f"[red]{escape(r.error[:80])}[/]")
            continue
        for k in r.kernels:
            l = k.launch
            warns = sum(f.severity != INFO for f in k.findings)
            if k.error:
                t.add_row(r.op, r.case.id, l.direction, escape(k.name), "", "", "", "", "", "",
                          f"[red]{escape(k.error[:80])}[/]")
                continue
            loads = sum(k.mix.global_loads.values())
            wide = sum(n for b, n in k.mix.global_loads.items() if b >= 128)
            t.add_row(r.op, r.case.id, l.direction, escape(k.name), f"{l.grid} x {l.threads}",
                      str(k.registers), str(k.spill_stores), f"{k.occupancy.fraction:.0%}",
                      f"{k.waves.waves:.2f}", f"{wide}/{loads}",
                      f"[yellow]{warns}[/]" if warns else "0")
    console.print(t)
    for r in reports:
        for k in r.kernels:
            for f in k.findings:
                if f.severity != INFO:
                    console.print(f"[yellow]{f.severity}[/] ({r.case.id}) {escape(f.kernel)}: "
                                  f"{f.code}: {escape(f.text)}", highlight=False)
