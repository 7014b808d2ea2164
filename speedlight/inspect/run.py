"""Inspect cases end to end, for each of the two compilers inspect reads: Triton (capture
the launches, sized for the target's SKU; compile each for the target's arch) and nvcc
(an OpSpec's CUDA C++ launches). Both give case_report.CaseReports with their findings."""

from __future__ import annotations

import dataclasses

import torch

from speedlight.inspect import case_report, findings
from speedlight.inspect.launches import Capture, capture_case, interpreter_work, meta_input_bytes
from speedlight.inspect.compile import TritonCompiler
from speedlight.inspect.cuda_compile import NvccCompiler
from speedlight.launch import for_target
from speedlight.spec import Case, OpSpec
from speedlight.target import Target

# Under the interpreter each program-iteration (one trip through a kernel's loop body, or
# a program without a loop) costs milliseconds; a case whose full run would take more than
# this many is sampled (a few programs per launch), not run in full.
RUN_WORK_LIMIT = 2000
# Inputs a CPU draws and samples in seconds; a larger case is captured on meta tensors
# (launches recorded at its real size, nothing run: compiling needs a launch's arguments,
# not its run), and its bytes measured on a smaller case with the same kernels.
SAMPLE_INPUT_BYTES = 64 * 2**20
# The smaller cases tried for those bytes: at most this many from each source, each at most
# this large; the case itself halved is run in at most this many program-iterations (a
# GEMM's iterations cost the most: its old smaller case, at 1392, took 24 s of CPU), a
# suite case in at most RUN_WORK_LIMIT.
SMALLER_CASES, SMALLER_CASE_BYTES, SMALLER_CASE_WORK = 6, 16 * 2**20, 800
# A case's own shape halved for those bytes keeps every parameter of at most this value: a
# count of heads, a head's dim, a batch, experts; the sizes (tokens, widths) are halved.
KEPT_PARAM = 128


def _sized(target: Target):
    """The launches a user of the target's SKU gets: sized for it, with its tuned tables."""
    return for_target(target)


def _dry(spec: OpSpec, case: Case, target: Target, backward: bool) -> Capture:
    """The case's launches recorded on meta tensors (any size, in a moment); on CPU tensors
    when the op needs its inputs' values on the host (a meta tensor has none)."""
    with _sized(target):
        try:
            return capture_case(spec, case, "meta", arch=target.arch, mode="dry",
                                backward=backward)
        except Exception:  # a launcher that reads its inputs' values: on the CPU instead
            return capture_case(spec, case, "cpu", arch=target.arch, mode="dry",
                                backward=backward)


def _capture(spec: OpSpec, case: Case, device: torch.device, target: Target, mode: str,
             backward: bool) -> tuple[Capture, str]:
    """Capture in `mode`. On a CPU, 'dry' records every launch on meta tensors, and 'auto'
    does so for a case whose inputs are over SAMPLE_INPUT_BYTES (or that the interpreter
    cannot run at all); else it samples and runs in full when the interpreter can afford
    it. On a GPU 'auto' runs (compiled)."""
    if mode == "auto" and device.type == "cuda":
        mode = "run"
    if device.type != "cuda" and mode in ("auto", "dry"):
        if mode == "dry" or spec.skip(case, device) or \
                meta_input_bytes(spec, case) > SAMPLE_INPUT_BYTES:
            return _dry(spec, case, target, backward), "dry"
        with _sized(target):
            sample = capture_case(spec, case, device, arch=target.arch, mode="sample",
                                  backward=backward)
        if interpreter_work(sample) > RUN_WORK_LIMIT:
            return sample, "sample"
        mode = "run"
    with _sized(target):
        return capture_case(spec, case, device, arch=target.arch, mode=mode,
                            backward=backward), mode


def _plan(capture: Capture) -> dict:
    """Per direction, the kernels launched in order, a run of one kernel counted once (a
    loop's chunks: linear_cross_entropy launches its kernel once per chunk of tokens)."""
    plan = {}
    for d in ("fwd", "bwd"):
        kernels = [l.kernel for l in capture.direction(d)]
        if kernels:
            plan[d] = [k for i, k in enumerate(kernels) if i == 0 or kernels[i - 1] != k]
    return plan


def _halvings(spec: OpSpec, case: Case, plan: dict, target: Target, backward: bool):
    """The case itself at smaller sizes, its proportions kept: each round halves every
    shape parameter over KEPT_PARAM together, while the op still launches the same kernels
    (a dry capture on meta: a moment) and the rows stay aligned as the case's are. Yields
    each round's case that fits SMALLER_CASE_BYTES (the first, then smaller ones, should
    the interpreter find it too long to run)."""
    aligned = spec.aligned_rows(case)
    current = case
    while True:
        params = tuple((k, (v + 1) // 2 if isinstance(v, int) and v > KEPT_PARAM else v)
                       for k, v in current.params)
        if params == current.params:
            return
        current = current.with_(params=params, model=None)
        if spec.aligned_rows(current) != aligned:
            return
        try:
            if _plan(_dry(spec, current, target, backward)) != plan:
                return
        except Exception:  # the op refuses the shape
            return
        if spec.cost(current, "fwd").bytes <= SMALLER_CASE_BYTES:
            yield current


def bytes_on_a_smaller_case(spec: OpSpec, case: Case, capture: Capture, target: Target,
                            backward: bool) -> list[case_report.DirectionBytes]:
    """For a case too large to run under the interpreter: per direction, its compulsory bytes
    (OpSpec.cost at its size) beside the bytes the same kernels moved on a smaller case
    that the interpreter runs in seconds: the case itself with its shape halved
    (_halvings: the same flags and proportions) in at most SMALLER_CASE_WORK
    program-iterations, else the largest of the op's quick and model cases with the same
    dtype, layout and flags (at most SMALLER_CASE_BYTES) that launches them, in at most
    RUN_WORK_LIMIT; [] when neither is found."""
    plan = _plan(capture)
    found = [c.with_(dtype=case.dtype) for suite in ("model", "quick") if suite in spec.suites
             for c in spec.cases(suite)]
    found = [c for c in found if c.layout == case.layout and c.flags == case.flags
             and spec.cost(c, "fwd").bytes <= SMALLER_CASE_BYTES and c.id != case.id
             and not spec.skip(c, torch.device("cpu"))]
    found.sort(key=lambda c: (-spec.rows(c), spec.cost(c, "fwd").bytes))

    def suite_cases():
        for c in found:
            if _plan(_dry(spec, c, target, backward)) == plan:
                yield c

    for source, work in ((_halvings(spec, case, plan, target, backward),
                          SMALLER_CASE_WORK), (suite_cases(), RUN_WORK_LIMIT)):
        for tried, c in enumerate(source):
            if tried >= SMALLER_CASES:  # each source tries this many, then the next
                break
            if spec.skip(c, torch.device("cpu")):
                continue
            with _sized(target):
                sample = capture_case(spec, c, "cpu", arch=target.arch, mode="sample",
                                      backward=backward)
                if interpreter_work(sample) > work:
                    continue
                ran = capture_case(spec, c, "cpu", arch=target.arch, mode="run",
                                   backward=backward)
            out = case_report.direction_bytes(spec, ran)
            for d in out:
                d.measured_on = c.label
                d.size_compulsory = spec.cost(case, d.direction).bytes
            return out
    return []


def inspect_cases(items: list[tuple[OpSpec, Case]], target: Target, *,
                  device: torch.device | str = "cpu", compiler: TritonCompiler | None = None,
                  mode: str = "auto", backward: bool = True, on_case=None,
                  smaller_case_bytes: bool = False, impl: str = "triton",
                  compile_kernels: bool = True) -> list[case_report.CaseReport]:
    """Everything inspect says about each (op, case) on `target` (a speedlight.target
    Target: its arch compiles, its SKU's SM count sizes the launches): every case is
    captured first, then all their distinct kernels are compiled in one batch (worker
    processes in parallel). `speedlight inspect` and the report's inspect stage both run
    through this. With `smaller_case_bytes` (the CLI's auto and dry modes), a case not run
    in full gets its bytes from a smaller case (bytes_on_a_smaller_case). impl names the
    implementation each spec's impl runs (a Triton-compiled one: "triton", "gluon"), as
    the reports say. Without `compile_kernels`, nothing is compiled: the reports hold the
    bytes each direction moved (and the notes), no kernel."""
    device = torch.device(device)
    sku = target.sku
    compiler = compiler or TritonCompiler()
    staged = []
    for spec, case in items:
        report = case_report.CaseReport(spec.name, case, target, sku, impl=impl)
        capture = None
        # what stops a run here; a capture that runs nothing is judged as on a GPU
        runs = device.type == "cuda" or mode in ("run", "sample")
        reason = spec.skip(case, device if runs else torch.device("cuda"))
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
                report.note = ("dry: every launch recorded at the case's size, none run "
                               "(meta tensors on a CPU): no access layout; bytes as "
                               "compulsory at this size beside a smaller case's measured "
                               "ratio")
            if not capture.launches:
                report.note = "no Triton launch (empty input, or the op ran without a kernel)"
        staged.append((spec, report, capture))
        if on_case is not None:
            on_case(spec, case)
    launches = [l for _, _, c in staged if c is not None for l in c.launches]
    smaller: dict[tuple, list] = {}
    compiled = compiler.compile(launches, target) if launches and compile_kernels else {}
    for spec, report, capture in staged:
        if capture is None or not capture.launches:
            continue
        for launch in capture.launches if compile_kernels else ():
            c = compiled[launch.key(target.arch_name)]
            report.kernels.append(case_report.analyse_kernel(launch, c, target, sku,
                                                          spec.design(launch.kernel, target.arch)))
        report.directions = case_report.direction_bytes(spec, capture)
        if not capture.measured and device.type != "cuda" and smaller_case_bytes:
            c = report.case
            key = (spec.name, repr(_plan(capture)), c.dtype, c.layout, repr(c.flags))
            try:
                if key not in smaller:  # one smaller case per plan, however many cases
                    smaller[key] = bytes_on_a_smaller_case(spec, c, capture, target, backward)
                report.directions = [dataclasses.replace(
                    d, size_compulsory=spec.cost(c, d.direction).bytes) for d in smaller[key]]
                if not smaller[key]:
                    size = ", ".join(f"{d} {spec.cost(c, d).bytes:,}" for d in _plan(capture))
                    report.note += (f" (no smaller case launches the same kernels in a few "
                                    f"seconds under the interpreter: nothing measured; "
                                    f"compulsory bytes at this size: {size})")
            except Exception as e:  # the bytes are extra: the kernels are still reported
                report.note += f" (bytes on a smaller case failed: {type(e).__name__}: {e})"
        findings.case_findings(report)
    return [r for _, r, _ in staged]


def inspect_cuda_cases(items: list[tuple[OpSpec, Case]], target: Target, *,
                       backward: bool = True,
                       compiler: NvccCompiler | None = None) -> list[case_report.CaseReport]:
    """The CUDA C++ kernels (OpSpec.cuda) of each (op, case), compiled with nvcc for `target`
    (each source once) with launches sized for its SKU; without `backward`, forward
    launches only."""
    from speedlight.inspect import cuda

    compiler = compiler or NvccCompiler()
    out = []
    for spec, case in items:
        if target.vendor != "nvidia":  # reported as the case's error, the others go on
            out.append(case_report.CaseReport(
                spec.name, case, target, target.sku, impl="cuda",
                error=f"CUDA C++ kernels do not compile for {target.arch_name}: nvcc builds "
                      f"for NVIDIA GPUs only (the Triton kernels compile for it)"))
            continue
        kernels = spec.cuda
        if not backward:
            kernels = dataclasses.replace(kernels, launches=lambda c, n, f=kernels.launches: [
                l for l in f(c, n) if l.direction == "fwd"])
        out.append(cuda.inspect_case(spec.name, kernels, spec.kernels, case, target,
                                     target.sm_count, compiler))
    return out


def predict_case(spec, case, target, *, compiler=None) -> dict:
    """Per direction, the predicted time of an op's case on `target`'s SKU: every launch
    captured dry and compiled for its arch, each predicted, summed ({"fwd": {"us", "bound",
    "kernels"}, ...}; a direction with a kernel the model cannot predict carries "why").
    What bench, profile and the other tools show beside a measured time, labelled
    predicted. A case inspect cannot read gives {"why": ...}."""
    (report,) = inspect_cases([(spec, case)], target, compiler=compiler, mode="dry")
    if report.error or report.skipped:
        return {"why": report.error or report.skipped}
    out: dict = {}
    for k in report.kernels:
        d = out.setdefault(k.direction, {"us": 0.0, "kernels": [], "bound": None, "_worst": -1.0})
        if "why" in d:
            continue
        if k.predicted is None:
            d["why"] = f"{k.name}: {k.unpredicted or k.error}"
            continue
        d["us"] += k.predicted.us
        d["kernels"].append({"kernel": k.name, "us": round(k.predicted.us, 3),
                             "bound": k.predicted.bound})
        if k.predicted.us > d["_worst"]:
            d["_worst"], d["bound"] = k.predicted.us, k.predicted.bound
    for d in out.values():
        d.pop("_worst", None)
        d["us"] = round(d["us"], 3)
        d["sku"] = target.sku.name
    return out
