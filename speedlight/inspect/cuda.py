"""The CUDA C++ compiler's side of inspect: each launch an op's CudaKernels names, compiled
with nvcc for the target (inspect/cuda_compile.py), read into the same KernelReport and
CaseReport as a Triton kernel (case_report.py); findings, the guard, the rows and the
tables are then the ones every kernel goes through.

    report = inspect_case("rms_norm", spec.cuda, spec.kernels, case, target, sm_count)
    held, info = guard.triage(spec, report, sm_count)      # what --check fails on

Launch geometry is not captured from a run (a CPU machine cannot run the kernels): the
OpSpec's CudaKernels.launches(case, sm_count) returns what its launcher would launch (the
kernel, its template instance, grid, threads, dynamic shared memory), sized by the same
functions the launcher calls (speedlight.ops.rms_norm_cuda.cuda_row_launch).

Access widths: every global load and store of a kernel is grouped by source line. A line
whose accesses are scalar by design (the scalar tail after a row's 16-byte vectors, a row
on the misaligned path, a per-row statistic) says so with the comment
`// speedlight: scalar` on that line, or on a line opening the block that holds it; every
other line is row data, held to its KernelDesign.vector_bits.
"""

from __future__ import annotations

import os
from pathlib import Path

from speedlight.inspect import loops, sass
from speedlight.inspect.case_report import Access, CaseReport, KernelReport, read_resources
from speedlight.inspect.cuda_compile import Binary, CudaToolError, NvccCompiler
from speedlight.inspect.findings import case_findings
from speedlight.spec import Case, CudaKernels, CudaLaunch, KernelDesign
from speedlight.target import Target

SCALAR_MARK = "speedlight: scalar"


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
            sm_count: int) -> KernelReport:
    """Resources, occupancy, waves, SASS mix and per-line access widths of one launch
    (findings are filled by findings.case_findings)."""
    report = KernelReport(launch, design, error=binary.error)
    if not binary.error:
        fn = binary.find(launch.kernel, launch.instance)
        if fn is None:
            report.error = (f"no kernel {report.name} in {os.path.basename(binary.source)} "
                            f"(it has {', '.join(binary.kernels()) or 'none'})")
        report.function = fn
    if report.error:
        return report
    fn = report.function
    report.num_warps = -(-launch.threads // 32)
    instrs = fn.instrs
    read_resources(report, fn.ptxas, fn.ptxas.get("smem_static", 0) + launch.smem, instrs,
                   target, sm_count)
    report.loops = loops.kernel_loops(fn.listing, num_warps=report.num_warps)
    text_of: dict[str, tuple[list[str], set[int]]] = {}
    for (file, line, kind), acc in sorted(sass.accesses_by_line(instrs).items()):
        if file not in text_of:
            lines = _source_lines(file)
            text_of[file] = (lines, scalar_lines(lines))
        lines, scalar = text_of[file]
        src = lines[line - 1].split("//")[0].strip() if 0 < line <= len(lines) else ""
        report.accesses.append(Access(kind, "-", file, line, src, 0, acc, None, marked=True,
                                      scalar=line in scalar))
    return report


def inspect_case(op: str, kernels: CudaKernels, designs, case: Case, target: Target,
                 sm_count: int, compiler: NvccCompiler | None = None) -> CaseReport:
    """Every launch kernels.launches(case, sm_count) names, compiled for `target`, with its
    findings against designs[kernel] (an OpSpec's kernels; KernelDesign() for one not
    named)."""
    compiler = compiler or NvccCompiler()
    report = CaseReport(op, case, target, target.sku, impl="cuda",
                        source=str(kernels.source)[:200], sm_count=sm_count)
    try:
        binary = compiler.get(kernels.source, target.arch, kernels.include_dirs)
        launches = list(kernels.launches(case, sm_count))
    except (CudaToolError, FileNotFoundError, ValueError) as e:
        report.error = str(e)
        return report
    report.source, report.binary_folder = binary.source, binary.folder
    for launch in launches:
        design = designs.get(launch.kernel, KernelDesign()).for_arch(target.arch)
        report.kernels.append(analyse(launch, design, binary, target, sm_count))
    case_findings(report)
    return report
