"""The report's stages, as one table (`STAGES`) that `report` walks in order.

Each stage is a function `(run, path, **inputs)`: it does its work, writes `path` (its file
in the report folder) and returns what later stages take. `needs` names the stages whose
result it cannot run without (it is skipped, saying which one failed, when one has none);
`uses` those whose result it takes when there is one; `skip` says why it does not run in
this run, and a stage the request turns off (`--no-bench`) is skipped saying so. A stage
that raises is recorded with its error and the report still renders.
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from speedlight import arguments
from speedlight.runtime import on_gpu

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ReportRequest:
    """What `speedlight report` runs: the model and its step (as `speedlight profile`
    takes them), the target, the spec files of a team's own ops, and what each stage is
    given. `turned_off`: stages not to run (bench, inspect, model_step, projection, plan).
    `plan` is speedlight.plan (handed in by the CLI: a composer over a composer would pass
    the longest import chain the floors allow); without it the plan stage is skipped."""

    target: Any  # a speedlight.target.Target
    device: torch.device = torch.device("cpu")
    model: str | None = None
    batch: int = 2
    seq: int = 128
    dtype: str | None = None  # default: bf16 on a GPU, fp32 on a CPU
    size: str | None = None  # default: full on a GPU, small on a CPU
    layers: int | None = None
    seed: int = 0
    train: bool = True
    warmup: int = arguments.WARMUP
    steps: int = arguments.STEPS
    spec_files: tuple[str, ...] = ()
    only_spec: bool = False
    seeds: int = 2
    baselines: str | None = None  # bench's, comma-separated
    bench_budget_s: float | None = None  # default 240 on a GPU, 60 on a CPU
    model_step_budget_s: float = 300.0
    projection: str | None = None  # the family projected; default the measured model's
    turned_off: frozenset[str] = frozenset()
    plan: Callable[..., Any] | None = None


@dataclass
class ReportRun:
    """One run of the report: its request, the model built once, the ops and their cases
    at the model's shapes, and each finished stage's result by name."""

    request: ReportRequest
    out: Path
    console: Any
    dtype: torch.dtype
    workload: Any  # a workloads.models.Workload
    pristine: torch.nn.Module  # the model as built, never patched
    cfg: Any  # its shapes.ModelConfig, or None
    all_specs: list
    specs: list = field(default_factory=list)  # the ops with cases at the model's shapes
    cases: dict = field(default_factory=dict)
    cases_from: dict = field(default_factory=dict)  # op -> where its cases come from
    results: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.request.device

    def profile(self, model, notes: list[str]) -> dict:
        from speedlight.profile.command import profile_workload
        from speedlight.workloads import models

        r, w = self.request, self.workload
        wl = models.Workload(w.name, model, w.inputs, w.loss_fn, dict(w.config), list(w.notes))
        return profile_workload(wl, device=r.device, train=r.train, target=r.target,
                                warmup=r.warmup, steps=r.steps, seed=r.seed, batch=r.batch,
                                seq=r.seq, notes=notes, specs=self.all_specs)


@dataclass
class Patched:
    model: torch.nn.Module
    coverage: dict  # what was swapped (pipeline.model_check.patch_coverage)


def _write(path: Path, doc):
    from speedlight import results

    results.write_json(path, doc)
    return doc


def _profile_before(run: ReportRun, path: Path) -> dict:
    return _write(path, run.profile(run.workload.model, []))


def _patch(run: ReportRun, path: Path) -> Patched:
    import warnings

    from speedlight.patching import apply_kinds
    from speedlight.pipeline.model_check import patch_coverage

    model = copy.deepcopy(run.pristine)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        report = apply_kinds(model)
    coverage = patch_coverage(report)
    _write(path, {"model_type": report.model_type, "patched": report.patched,
                  "not_patched": [{"what": a, "why": b} for a, b in report.not_patched],
                  "layer_fusion": coverage["layer_fusion"], "text": str(report),
                  "plan_note": report.plan_note, "plan": report.plan})  # per kind: measured or not
    return Patched(model, coverage)


def _model_check(run: ReportRun, path: Path, patch: Patched) -> dict:
    from speedlight.pipeline.model_check import check_models

    w = run.workload
    doc = check_models(run.pristine, patch.model, w.inputs, w.loss_fn, train=run.request.train)
    doc["patch"] = patch.coverage  # the check ran on this patch: its kinds, the fusion
    return _write(path, doc)


def _verify(run: ReportRun, path: Path) -> list:
    from speedlight.verify.command import verify_cases

    return verify_cases(run.specs, lambda spec: [c.with_(seed=seed) for c in run.cases[spec.name]
                                                 for seed in range(run.request.seeds)],
                        run.device, path, suite="model-shapes", target=run.request.target)


def _bench(run: ReportRun, path: Path) -> list:
    from speedlight.bench.baselines import Baselines
    from speedlight.bench.command import bench_cases
    from speedlight.bench.runner import Bench, Settings

    gpu, r = on_gpu(run.device), run.request
    names = r.baselines or ("torch-eager,torch-compile,liger,torch-fused" if gpu
                            else "torch-eager")
    bench = Bench(run.device, Settings(modes=("fwd", "bwd")),
                  Baselines(tuple(n for n in names.split(",") if n and n != "none")),
                  suite="model-shapes", target=r.target)
    return bench_cases(bench, run.specs, lambda spec: run.cases[spec.name], path,
                       budget_s=r.bench_budget_s or (240.0 if gpu else 60.0))


def _inspect(run: ReportRun, path: Path) -> dict:
    from speedlight.pipeline.inspect_stage import inspect_ops

    return _write(path, inspect_ops(run.specs, run.cases, target=run.request.target,
                                    device=run.device))


def _profile_after(run: ReportRun, path: Path, patch: Patched) -> dict:
    return _write(path, run.profile(patch.model, ["patched with speedlight's ops"]))


def _projection(run: ReportRun, path: Path) -> dict:
    from speedlight.pipeline.projection_stage import family_of, project_family

    r = run.request
    name = r.projection or family_of(r.model, run.cfg.hf_model_type if run.cfg else None)
    doc = _write(path, project_family(name, train=r.train, target=r.target))
    try:
        from speedlight.profile import html
        html.write_page(doc, path.with_suffix(".html"))
    except RuntimeError:
        pass
    return doc


def _plan(run: ReportRun, path: Path, projection: dict | None):
    from speedlight import plans

    # without a GPU nothing is timed: the projection is the only estimate
    estimate = plans.projected_estimate(projection) if projection else None
    w = run.workload
    result = run.request.plan(run.pristine, w.inputs, save=False, projected=estimate)
    _write(path, result.to_json())
    return result


def _model_step(run: ReportRun, path: Path, plan) -> list:
    from speedlight.bench import model_step
    from speedlight.patching import apply_kinds

    r = run.request
    s = model_step.StepSettings(
        model=r.model, layers=r.layers or 4, batch=r.batch, seq=r.seq, dtype=run.dtype,
        device=run.device, warmup=3, steps=10, seed=r.seed, budget_s=r.model_step_budget_s)
    model_step.check_model(s)
    variants = [v for v in model_step.variants_for(s) if v != model_step.PLANNED or plan is not None]
    if plan is not None:
        s.plan = plan.to_json()  # "speedlight (planned)": the plan stage's kinds
    return model_step.run_variants(s, variants, path, patch=apply_kinds)


def _on_a_gpu(run: ReportRun) -> str | None:
    return "measured on a GPU" if on_gpu(run.device) else None


def _no_plan_function(run: ReportRun) -> str | None:
    return None if run.request.plan is not None else "speedlight.plan was not handed in"


def _step_skip(run: ReportRun) -> str | None:
    model = run.request.model
    if bool(model) and ":" in model and not model.endswith(".json"):
        return "a module:callable model has no Hugging Face variants to compare"
    if not on_gpu(run.device):
        return ("runs on a GPU only (a CPU's step times say nothing; `speedlight bench model` "
                "runs it on a CPU as a smoke test)")
    return None


@dataclass(frozen=True)
class Stage:
    name: str  # its key in the manifest
    title: str
    fn: Callable[..., Any]  # fn(run, path, **inputs) -> what later stages take
    file: str  # what it writes, in the report folder
    needs: tuple[str, ...] = ()  # stages whose result it cannot run without
    uses: tuple[str, ...] = ()  # stages whose result it takes when there is one
    skip: Callable[[ReportRun], str | None] | None = None  # why it does not run here


STAGES = (
    Stage("profile_before", "profile the model", _profile_before, "profile-before.json"),
    Stage("patch", "patch a copy with speedlight's ops", _patch, "patch.json"),
    Stage("model_check", "check the patched model against the original", _model_check,
          "model-check.json", needs=("patch",)),
    Stage("verify", "verify each op at the model's shapes", _verify, "verify.jsonl"),
    Stage("bench", "bench each op at the model's shapes", _bench, "bench.jsonl"),
    Stage("inspect", "inspect the kernels for the target", _inspect, "inspect.json"),
    Stage("profile_after", "profile the patched model", _profile_after, "profile-after.json",
          needs=("patch",)),
    Stage("projection", "project the real-size model onto several GPUs", _projection,
          "profile-projected.json", skip=_on_a_gpu),
    Stage("plan", "plan which kinds of patch to keep (timed on a GPU only)", _plan, "plan.json",
          uses=("projection",), skip=_no_plan_function),
    Stage("model_step", "time the training step against HF, torch.compile and Liger",
          _model_step, "model-step.jsonl", uses=("plan",), skip=_step_skip),
)
FILES = {s.name: s.file for s in STAGES}
OPTIONAL = ("bench", "inspect", "projection", "plan", "model_step")  # what `turned_off` may hold


class Manifest:
    """manifest.json as the stages run: each stage's status, seconds, and error or reason."""

    def __init__(self, out: Path, console):
        self.out, self.console = out, console
        self.doc: dict = {"stages": {}, "files": FILES}

    def run(self, stage: Stage, fn):
        from speedlight import results
        start = time.perf_counter()
        self.console.print(f"[bold]{stage.title}[/] ...")
        entry = {"title": stage.title, "file": stage.file}
        try:
            value = fn()
            entry["status"] = "ok"
        except Exception as e:  # the report shows it; later stages that need it are skipped
            value = None
            entry.update(status="failed", error=f"{type(e).__name__}: {e}",
                         traceback=traceback.format_exc(limit=6))
            self.console.print(f"[red]  {stage.title} failed: {type(e).__name__}: {e}[/]")
        entry["seconds"] = round(time.perf_counter() - start, 2)
        self.doc["stages"][stage.name] = entry
        results.write_json(self.out / MANIFEST, self.doc)
        return value

    def skip(self, stage: Stage, reason: str) -> None:
        from speedlight import results
        self.doc["stages"][stage.name] = {"title": stage.title, "file": stage.file,
                                          "status": "skipped", "reason": reason}
        results.write_json(self.out / MANIFEST, self.doc)  # a last stage skipped is kept

    def status(self, name: str) -> str:
        return self.doc["stages"].get(name, {}).get("status", "not run")


def op_cases(specs, own: set[str], cfg, batch: int, seq: int,
             dtype) -> tuple[list, dict, dict]:
    """The ops the report verifies, benches and inspects, with their cases: each op at the
    model's own shapes (OpSpec.for_model); an op of a --spec file (named in `own`) without
    for_model on its quick suite. Returns (specs, cases by op, where they come from)."""
    cases, origin = {}, {}
    for s in specs:
        if s.for_model is not None and cfg is not None:
            cases[s.name] = [c.with_(dtype=dtype) for c in s.for_model(cfg, batch, seq)]
            origin[s.name] = "the model's shapes"
        elif s.name in own and s.for_model is None and "quick" in s.suites:
            cases[s.name] = [c.with_(dtype=dtype) for c in s.cases("quick")]
            origin[s.name] = "its quick suite (the OpSpec has no for_model)"
    kept = [s for s in specs if cases.get(s.name)]
    return kept, {s.name: cases[s.name] for s in kept}, {s.name: origin[s.name] for s in kept}


def _start(request: ReportRequest, out: Path, console) -> ReportRun:
    """Build the model once and find the ops' cases at its shapes; a bad request exits
    (SystemExit) before any stage runs."""
    from speedlight import registry, shapes
    from speedlight.profile.command import check_steps
    from speedlight.runtime import model_defaults
    from speedlight.spec import parse_dtype
    from speedlight.workloads import models

    r = request
    unknown = sorted(set(r.turned_off) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"turned_off: {unknown} are not stages that may be turned off "
                         f"({', '.join(OPTIONAL)})")
    try:
        check_steps(r.warmup, r.steps, r.train)
        default_dtype, default_size = model_defaults(r.device)
        dtype = parse_dtype(r.dtype) if r.dtype else default_dtype
        all_specs = registry.select(None, list(r.spec_files), include_builtin=not r.only_spec)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight report: {e}")
    console.print(f"[dim]{r.target.describe()}[/]")
    try:
        w = models.build(r.model, batch=r.batch, seq=r.seq, train=r.train, dtype=dtype,
                         device=r.device, size=r.size or default_size,
                         layers=r.layers, seed=r.seed)
    except (models.ModelError, ValueError) as e:
        raise SystemExit(f"speedlight report: {e}")
    cfg = shapes.from_hf_config(w.model.config, name=w.name) if hasattr(w.model, "config") else None
    run = ReportRun(r, out, console, dtype, w, copy.deepcopy(w.model), cfg, all_specs)
    own = {s.name for s in all_specs} - {s.name for s in registry.builtin_specs()}
    run.specs, run.cases, run.cases_from = op_cases(all_specs, own, cfg, r.batch, r.seq, dtype)
    return run


def report(request: ReportRequest, out: Path) -> int:
    """Every stage of STAGES in order into the folder `out`, then the page rendered from
    their files: 0 when every stage that ran passed, 1 otherwise."""
    from speedlight import results

    console = results.make_console()
    try:
        import transformers
        transformers.logging.set_verbosity_error()
    except ImportError:
        raise SystemExit("speedlight report needs transformers: pip install 'speedlight[hf]'")
    run = _start(request, out, console)
    r, cfg = request, run.cfg
    manifest = Manifest(out, console)
    manifest.doc["run"] = {"model": run.workload.name, "mode": "train" if r.train else "infer",
                           "batch": r.batch, "seq": r.seq, "device": r.device.type,
                           "target": r.target.sku.key, "target_detail": r.target.to_json(),
                           "spec_files": list(r.spec_files),
                           "model_config": cfg.__dict__ if cfg else None}
    manifest.doc["cases"] = {k: [c.id for c in v] for k, v in run.cases.items()}
    manifest.doc["cases_from"] = run.cases_from
    for stage in STAGES:
        reason = (f"--no-{stage.name.replace('_', '-')}" if stage.name in r.turned_off
                  else stage.skip(run) if stage.skip else None)
        missing = next((n for n in stage.needs if run.results.get(n) is None), None)
        if reason is None and missing is not None:
            reason = f"{missing} {manifest.status(missing)}"
        if reason is not None:
            manifest.skip(stage, reason)
            continue
        inputs = {n: run.results.get(n) for n in stage.needs + stage.uses}
        run.results[stage.name] = manifest.run(
            stage, lambda: stage.fn(run, out / stage.file, **inputs))

    from speedlight.report import render
    render.render(out)
    render.print_summary(out, console)
    failed = [k for k, v in manifest.doc["stages"].items() if v["status"] == "failed"]
    return 1 if failed or render.has_failures(out) else 0
