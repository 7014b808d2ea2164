"""`speedlight report`: the main job, end to end on one model.

This package sits on top, beside cli.py (it imports the tools; no tool imports it), and
runs the tools in order, each writing its JSON into one
report folder; `speedlight.report` then renders those files (and nothing else) into
index.html and summary.md:

  1 profile-before.json  profile the model as it is
  2 patch.json           patch a copy with speedlight's ops (what was and was not swapped)
  3 model-check.json     the patched model against the original: logits, loss and every
                         parameter gradient, both judged against a float64 copy
  4 verify.jsonl         every op the model uses, verified at the model's own shapes (and
                         the ops of --spec files)
  5 bench.jsonl          the same cases timed against PyTorch (and torch.compile, Liger)
  6 inspect.json         the kernels of those cases compiled for the target GPU
  7 profile-after.json   profile the patched model
  8 profile-projected.json  without a GPU: the real-size configuration of the model's
                         family (Llama-3-8B by default) at 4096 tokens, projected onto
                         several GPUs (and profile-projected.html, its page)
  9 plan.json            which of patch's kinds to keep (speedlight.plan, handed in by the
                         CLI as args.plan): on a GPU each kind timed on the model's first
                         decoder layer against what it replaces; without one nothing is timed
                         and the plan carries the projection's floors, labelled projected
 10 model-step.jsonl     on a GPU only: the model's training step (forward, backward,
                         AdamW) timed for HF, torch.compile, Liger, speedlight.patch (all
                         kinds, and the kinds plan.json keeps) and patch + compile
                         (`speedlight bench model`), at --layers (default 4)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from speedlight import arguments

MANIFEST = "manifest.json"
FILES = {"profile_before": "profile-before.json", "patch": "patch.json",
         "model_check": "model-check.json", "verify": "verify.jsonl", "bench": "bench.jsonl",
         "inspect": "inspect.json", "profile_after": "profile-after.json",
         "model_step": "model-step.jsonl", "projection": "profile-projected.json",
         "plan": "plan.json"}


def configure(p: argparse.ArgumentParser) -> None:
    arguments.add_model_run(p, train=True)
    arguments.add_seeds(p)
    p.add_argument("--baselines", default=None,
                   help="bench baselines (default: torch-eager,torch-compile,liger,torch-fused on a GPU; "
                        "torch-eager on a CPU, where compiling each case costs more than the report)")
    p.add_argument("--bench-budget", type=float, default=None,
                   help="seconds for the bench stage (default 240 on a GPU, 60 on a CPU)")
    p.add_argument("--no-bench", action="store_true", help="skip the bench stage")
    p.add_argument("--no-inspect", action="store_true", help="skip the inspect stage")
    p.add_argument("--no-model-step", action="store_true",
                   help="skip the training-step comparison (which runs on a GPU only)")
    p.add_argument("--model-step-budget", type=float, default=300.0,
                   help="seconds for the training-step comparison; variants not started in "
                        "time are recorded as skipped (default 300)")
    p.add_argument("--projection", default=None, metavar="NAME",
                   help="without a GPU, the real-size model projected beside the small measured one "
                        "(default: the measured model's family, Llama-3-8B for the default model)")
    p.add_argument("--no-projection", action="store_true", help="skip the real-size projection")
    p.add_argument("--no-plan", action="store_true",
                   help="skip the plan (on a GPU it times each kind of patch on one decoder "
                        "layer, about a minute for an 8B-class layer)")
    arguments.add_out(p, "speedlight-report", "the report folder")


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


class Stages:
    """Runs stages in order; a stage that fails is recorded with its error and the report
    still renders, saying which stage failed and why."""

    def __init__(self, out: Path, console):
        self.out, self.console = out, console
        self.manifest: dict = {"stages": {}, "files": FILES}

    def run(self, name: str, title: str, fn):
        from speedlight import results
        start = time.perf_counter()
        self.console.print(f"[bold]{title}[/] ...")
        entry = {"title": title, "file": FILES.get(name)}
        try:
            value = fn()
            entry["status"] = "ok"
        except Exception as e:  # the report shows it; later stages that need it are skipped
            value = None
            entry.update(status="failed", error=f"{type(e).__name__}: {e}",
                         traceback=traceback.format_exc(limit=6))
            self.console.print(f"[red]  {title} failed: {type(e).__name__}: {e}[/]")
        entry["seconds"] = round(time.perf_counter() - start, 2)
        self.manifest["stages"][name] = entry
        results.write_json(self.out / MANIFEST, self.manifest)
        return value

    def skip(self, name: str, title: str, reason: str) -> None:
        from speedlight import results
        self.manifest["stages"][name] = {"title": title, "file": FILES.get(name),
                                         "status": "skipped", "reason": reason}
        results.write_json(self.out / MANIFEST, self.manifest)  # a last stage skipped is kept


# what a report folder holds, all written by speedlight: the stage files, the manifest,
# the projection's own page, and render's two
REPORT_FILES = frozenset([*FILES.values(), MANIFEST, "profile-projected.html", "index.html",
                          "summary.md"])


def run(args: argparse.Namespace) -> int:
    final = Path(args.out)
    try:
        with built_beside(final) as out:
            code = _run(args, out)
    except KeyboardInterrupt:
        print(f"speedlight report: interrupted; {final} is as it was before this run")
        return 130
    print(f"report: {final / 'index.html'}  (and summary.md, with the JSON of each stage)")
    return code


@contextlib.contextmanager
def built_beside(final: Path):
    """A new folder beside `final` to build the report in, which replaces `final` only when
    the block completes, so at every moment `final` holds a whole report, old or new.

    Refused up front (SystemExit) when `final` is a file or holds files speedlight did not
    write, which are never deleted. On an error or Ctrl-C the partial folder is removed and
    `final` is untouched; one left by a killed run is removed by the next run. The swap is
    one atomic exchange of the two folders where Linux offers it (renameat2), else two
    renames; then the old report's files, all speedlight's, are deleted.
    """
    final = final.resolve() if final.is_symlink() else final.absolute()
    if final.exists():
        if not final.is_dir():
            raise SystemExit(f"speedlight report: --out {str(final)!r} is a file, not a folder")
        foreign = sorted(p.name for p in final.iterdir() if p.name not in REPORT_FILES)
        if foreign:
            raise SystemExit(f"speedlight report: --out {str(final)!r} holds files speedlight "
                             f"did not write ({', '.join(foreign[:5])}): give a new folder, an "
                             f"empty one, or that of an earlier report")
    prefix = f".{final.name}.partial-"
    for stale in final.parent.glob(prefix + "*"):  # left by a run that was killed
        if stale.name[len(prefix):].isdigit() and not _alive(int(stale.name[len(prefix):])):
            shutil.rmtree(stale, ignore_errors=True)
    try:
        build = final.parent / f"{prefix}{os.getpid()}"
        build.mkdir(parents=True)
    except OSError as e:
        raise SystemExit(f"speedlight report: cannot write beside --out {str(final)!r}: "
                         f"{e.strerror or e}") from None
    try:
        yield build
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    if final.exists() and _exchange(build, final):
        old = build  # the two folders traded places
    else:
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        try:
            os.rename(build, final)
        except OSError:
            if old.exists():
                os.rename(old, final)  # put the earlier report back
            raise
    for p in old.iterdir() if old.is_dir() else ():
        if p.name in REPORT_FILES and p.is_file():
            p.unlink()
    with contextlib.suppress(OSError):
        old.rmdir()  # fails, keeping them, if files speedlight did not write appeared


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux renameat2 RENAME_EXCHANGE); False where that is
    not available, and nothing moved."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _run(args: argparse.Namespace, out: Path) -> int:
    import warnings

    import torch

    from speedlight import registry, results, shapes
    from speedlight.bench.command import bench_cases
    from speedlight.workloads import models
    from speedlight.profile.command import check_steps, profile_workload
    from speedlight.spec import parse_dtype
    from speedlight.verify.command import verify_cases
    console = results.make_console()
    try:
        import transformers
        transformers.logging.set_verbosity_error()
    except ImportError:
        raise SystemExit("speedlight report needs transformers: pip install 'speedlight[hf]'")
    device = torch.device(args.device)
    train = args.train
    tgt = arguments.resolve_target(args, "report")
    try:
        check_steps(args.warmup, args.steps, train)
        dtype = parse_dtype(args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda"
                                                            else torch.float32)
        all_specs = registry.select(None, args.spec, include_builtin=not args.only_spec)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight report: {e}")
    console.print(f"[dim]{tgt.describe()}[/]")
    stages = Stages(out, console)
    try:
        w = models.build(args.model, batch=args.batch, seq=args.seq, train=train, dtype=dtype,
                         device=device, size=args.size or ("full" if device.type == "cuda" else "small"),
                         layers=args.layers, seed=args.seed)
    except (models.ModelError, ValueError) as e:
        raise SystemExit(f"speedlight report: {e}")
    pristine = copy.deepcopy(w.model)
    cfg = shapes.from_hf_config(w.model.config, name=w.name) if hasattr(w.model, "config") else None
    stages.manifest["run"] = {"model": w.name, "mode": "train" if train else "infer",
                              "batch": args.batch, "seq": args.seq, "device": device.type,
                              "target": tgt.sku.key, "target_detail": tgt.to_json(),
                              "spec_files": list(args.spec),
                              "model_config": cfg.__dict__ if cfg else None}

    def profile(model, notes):
        wl = models.Workload(w.name, model, w.inputs, w.loss_fn, dict(w.config), list(w.notes))
        return profile_workload(wl, device=device, train=train, target=tgt, warmup=args.warmup,
                                steps=args.steps, seed=args.seed, batch=args.batch, seq=args.seq,
                                notes=notes, specs=all_specs)

    before = stages.run("profile_before", "profile the model", lambda: profile(w.model, []))
    if before is not None:
        results.write_json(out / FILES["profile_before"], before)

    coverage: dict = {}  # what the patch stage swapped, for the model check's record

    def do_patch():
        from speedlight.patching import apply_kinds
        from speedlight.pipeline.model_check import patch_coverage
        model = copy.deepcopy(pristine)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            report = apply_kinds(model)
        coverage.update(patch_coverage(report))
        doc = {"model_type": report.model_type, "patched": report.patched,
               "not_patched": [{"what": a, "why": b} for a, b in report.not_patched],
               "layer_fusion": coverage["layer_fusion"], "text": str(report),
               "plan_note": report.plan_note, "plan": report.plan}  # per kind: measured or not
        results.write_json(out / FILES["patch"], doc)
        return model
    patched = stages.run("patch", "patch a copy with speedlight's ops", do_patch)

    if patched is not None:
        def do_check():
            from speedlight.pipeline.model_check import check_models
            doc = check_models(pristine, patched, w.inputs, w.loss_fn, train=train)
            doc["patch"] = coverage  # the check ran on this patch: its kinds, the fusion
            results.write_json(out / FILES["model_check"], doc)
            return doc
        stages.run("model_check", "check the patched model against the original", do_check)
    else:
        stages.skip("model_check", "check the patched model against the original", "patch failed")

    own = {s.name for s in all_specs} - {s.name for s in registry.builtin_specs()}
    specs, cases, origin = op_cases(all_specs, own, cfg, args.batch, args.seq, dtype)
    stages.manifest["cases"] = {k: [c.id for c in v] for k, v in cases.items()}
    stages.manifest["cases_from"] = origin

    stages.run("verify", "verify each op at the model's shapes", lambda: verify_cases(
        specs, lambda spec: [c.with_(seed=seed) for c in cases[spec.name]
                             for seed in range(args.seeds)],
        device, out / FILES["verify"], suite="model-shapes", target=tgt))

    if args.no_bench:
        stages.skip("bench", "bench each op at the model's shapes", "--no-bench")
    else:
        def do_bench():
            from speedlight.bench.baselines import Baselines
            from speedlight.bench.runner import Bench, Settings
            names = args.baselines or ("torch-eager,torch-compile,liger,torch-fused"
                                       if device.type == "cuda"
                                       else "torch-eager")
            bench = Bench(device, Settings(modes=("fwd", "bwd")),
                          Baselines(tuple(n for n in names.split(",") if n and n != "none")),
                          suite="model-shapes", target=tgt)
            budget = args.bench_budget or (240.0 if device.type == "cuda" else 60.0)
            return bench_cases(bench, specs, lambda spec: cases[spec.name], out / FILES["bench"],
                               budget_s=budget)
        stages.run("bench", "bench each op at the model's shapes", do_bench)

    if args.no_inspect:
        stages.skip("inspect", "inspect the kernels for the target", "--no-inspect")
    else:
        def do_inspect():
            from speedlight.pipeline.inspect_stage import inspect_ops
            doc = inspect_ops(specs, cases, target=tgt, device=device)
            results.write_json(out / FILES["inspect"], doc)
            return doc
        stages.run("inspect", "inspect the kernels for the target", do_inspect)

    if patched is not None:
        after = stages.run("profile_after", "profile the patched model",
                           lambda: profile(patched, ["patched with speedlight's ops"]))
        if after is not None:
            results.write_json(out / FILES["profile_after"], after)
    else:
        stages.skip("profile_after", "profile the patched model", "patch failed")

    projection = None
    if device.type == "cuda" or args.no_projection:
        stages.skip("projection", "project the real-size model onto several GPUs",
                    "--no-projection" if args.no_projection else "measured on a GPU")
    else:
        def do_projection():
            from speedlight.pipeline.projection_stage import family_of, project_family
            name = args.projection or family_of(args.model, cfg.hf_model_type if cfg else None)
            doc = project_family(name, train=train, target=tgt)
            results.write_json(out / FILES["projection"], doc)
            try:
                from speedlight.profile import html
                html.write_page(doc, out / "profile-projected.html")
            except RuntimeError:
                pass
            return doc
        projection = stages.run("projection", "project the real-size model onto several GPUs",
                                do_projection)

    plan_title = "plan which kinds of patch to keep (timed on a GPU only)"
    planned = None
    if args.no_plan:
        stages.skip("plan", plan_title, "--no-plan")
    else:
        def do_plan():
            from speedlight import plans
            # without a GPU nothing is timed: the projection above is the only estimate
            estimate = plans.projected_estimate(projection) if projection else None
            result = args.plan(pristine, w.inputs, save=False, projected=estimate)
            results.write_json(out / FILES["plan"], result.to_json())
            return result
        planned = stages.run("plan", plan_title, do_plan)

    step_title = "time the training step against HF, torch.compile and Liger"
    callable_model = bool(args.model) and ":" in args.model and not args.model.endswith(".json")
    if device.type != "cuda" or args.no_model_step or callable_model:
        stages.skip("model_step", step_title, "--no-model-step" if args.no_model_step else
                    "a module:callable model has no Hugging Face variants to compare"
                    if callable_model else
                    "runs on a GPU only (a CPU's step times say nothing; `speedlight bench "
                    "model` runs it on a CPU as a smoke test)")
    else:
        def do_model_step():
            from speedlight.bench import model_step
            from speedlight.patching import apply_kinds
            s = model_step.StepSettings(
                model=args.model, layers=args.layers or 4, batch=args.batch, seq=args.seq,
                dtype=dtype, device=device, warmup=3, steps=10, seed=args.seed,
                budget_s=args.model_step_budget)
            model_step.check_model(s)
            variants = [v for v in model_step.variants_for(s) if v != model_step.PLANNED or planned is not None]
            if planned is not None:
                s.plan = planned.to_json()  # "speedlight (planned)": the plan stage's kinds
            return model_step.run_variants(s, variants, out / FILES["model_step"],
                                           patch=apply_kinds)
        stages.run("model_step", step_title, do_model_step)

    from speedlight.report import render
    render.render(out)
    render.print_summary(out, console)
    failed = [k for k, v in stages.manifest["stages"].items() if v["status"] == "failed"]
    return 1 if failed or render.has_failures(out) else 0
