"""Inspect one case end to end: capture its launches (sized for the target's SKU), compile
each for the target's arch, analyse, and collect the findings."""

from __future__ import annotations

import torch

from speedlight.hardware import DeviceSpec
from speedlight.inspect import case_report, findings
from speedlight.inspect.launches import Capture, capture_case, interpreter_work
from speedlight.inspect.compile import Compiler
from speedlight.launch import for_target
from speedlight.spec import Case, OpSpec
from speedlight.target import Target

# Under the interpreter each program-iteration (one trip through a kernel's loop body, or
# a program without a loop) costs milliseconds; a case whose full run would take more than
# this many is sampled (a few programs per launch), not run in full.
RUN_WORK_LIMIT = 2000


def _capture(spec: OpSpec, case: Case, device: torch.device, target: Target, mode: str,
             backward: bool) -> tuple[Capture, str]:
    """Capture in `mode`; 'auto' samples first and runs in full when the interpreter can
    afford it (on a GPU launches always run, compiled). The launches are those a user of
    the target's SKU gets: sized for it, with its tuned tables (for_target)."""
    with for_target(target):
        if mode == "auto":
            if device.type == "cuda":
                mode = "run"
            else:
                sample = capture_case(spec, case, device, arch=target.arch, mode="sample",
                                      backward=backward)
                if interpreter_work(sample) > RUN_WORK_LIMIT:
                    return sample, "sample"
                mode = "run"
        return capture_case(spec, case, device, arch=target.arch, mode=mode,
                            backward=backward), mode


def inspect_cases(items: list[tuple[OpSpec, Case]], target: Target, *,
                  device: torch.device | str = "cpu", compiler: Compiler | None = None,
                  mode: str = "auto", backward: bool = True,
                  on_case=None) -> list[case_report.CaseReport]:
    """Everything inspect says about each (op, case) on `target` (a speedlight.target
    Target: its arch compiles, its SKU's SM count sizes the launches): every case is
    captured first, then all their distinct kernels are compiled in one batch (worker
    processes in parallel). `speedlight inspect` and the report's inspect stage both run
    through this."""
    device = torch.device(device)
    sku = target.sku
    compiler = compiler or Compiler()
    staged = []
    for spec, case in items:
        report = case_report.CaseReport(spec.name, case, target, sku)
        capture = None
        reason = spec.skip(case, device)
        if reason:
            report.skipped = reason
        else:
            try:
                capture, used = _capture(spec, case, device, target, mode, backward)
            except Exception as e:  # the op failed on this case: reported, the others go on
                report.error = f"{type(e).__name__}: {e}"
                staged.append((spec, report, None))
                continue
            if used == "sample":
                report.note = (f"sampled: a few programs of each launch ran under the "
                               f"interpreter (a full run would take over {RUN_WORK_LIMIT} "
                               f"program-iterations): access layout only, no byte counts")
            elif used == "dry":
                report.note = "dry: launches recorded, not run (no access layout, no byte counts)"
            if not capture.launches:
                report.note = "no Triton launch (empty input, or the op ran without a kernel)"
        staged.append((spec, report, capture))
        if on_case is not None:
            on_case(spec, case)
    launches = [l for _, _, c in staged if c is not None for l in c.launches]
    compiled = compiler.compile(launches, target) if launches else {}
    for spec, report, capture in staged:
        if capture is None or not capture.launches:
            continue
        for launch in capture.launches:
            c = compiled[launch.key(target.arch_name)]
            report.kernels.append(case_report.analyse_kernel(launch, c, target, sku,
                                                          spec.design(launch.kernel)))
        report.directions = case_report.direction_bytes(spec, capture)
        findings.case_findings(report)
    return [r for _, r, _ in staged]
