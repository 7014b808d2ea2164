"""`speedlight tune`: choose an op's launch configuration per GPU and shape, ahead of time.

    speedlight tune matmul                          # CPU: prune the quick suite for the default GPU
    speedlight tune matmul --suite model --cases m4096 --target h100-sxm
    speedlight tune rms_norm --suite model          # on a GPU: prune, time, verify, write the table

On a CPU (or for a target that is not the GPU in use) it prunes and lists the survivors
with each rejection's reason; on the target GPU it also times the survivors, verifies the
fastest, and writes the winners into the user's tuned table (speedlight/tuning.py), which
the op reads at its next launch. Rows go to <out>/tune.jsonl, the winners also to
<out>/tuned/<sku>.json (the file to commit as a shipped table).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from speedlight import arguments, cluster


def configure(p: argparse.ArgumentParser) -> None:
    from speedlight.tune.sweep import DEFAULT_MAX_COMPILES

    p.add_argument("op", help="the op to tune (one that declares a configuration space: "
                              "matmul, gated_matmul, rms_norm)")
    p.add_argument("--suite", default="quick", choices=("quick", "model", "full"),
                   help="the shapes to tune (default quick)")
    p.add_argument("--cases", default=None, metavar="TEXT[,TEXT]",
                   help="only the suite's cases whose label contains one of these "
                        "(e.g. m4096-n4096 or hidden4096)")
    arguments.add_dtypes(p, "bf16")
    arguments.add_target(p)
    p.add_argument("--max-compiles", type=int, default=DEFAULT_MAX_COMPILES, metavar="N",
                   help=f"candidates compiled and judged in the whole sweep, shared by the "
                        f"shapes (default {DEFAULT_MAX_COMPILES}; about 1-3 s each on a CPU, "
                        f"nothing for one whose kernel another already compiled)")
    p.add_argument("--no-install", action="store_true",
                   help="on a GPU, do not write the winners into the user's tuned table "
                        "(the cache the ops read); they still go to <out>/tuned/")
    arguments.add_spec(p)
    p.add_argument("--jobs", type=int, default=None, help="compile worker processes")
    arguments.add_out(p, "speedlight-results", "folder for tune.jsonl and tuned/<sku>.json")
    arguments.add_ray(p)


def _select_cases(spec, suite: str, dtypes, filters):
    if suite not in spec.suites:
        raise ValueError(f"{spec.name} has no {suite} suite (it has {', '.join(spec.suites)})")
    cases = [c.with_(dtype=d) for c in spec.cases(suite) for d in dtypes if d in spec.dtypes]
    if filters:
        cases = [c for c in cases if any(f in c.label for f in filters)]
        if not cases:
            raise ValueError(f"no case of {spec.name}'s {suite} suite matches --cases "
                             f"{','.join(filters)}")
    return cases


def run(args: argparse.Namespace) -> int:
    import torch

    from speedlight import registry, results, tuning
    from speedlight.inspect.compile import TritonCompiler
    from speedlight.spec import parse_dtype
    from speedlight.tune import display, sweep

    console = results.make_console()
    if args.max_compiles < 1:
        raise SystemExit(f"speedlight tune: --max-compiles must be at least 1, got "
                         f"{args.max_compiles}")
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"speedlight tune: --jobs must be at least 1, got {args.jobs}")
    ray = arguments.ray_sweep(args, "tune")
    device = torch.device(args.device)
    tgt = arguments.resolve_target(args, "tune")
    try:
        spec = registry.select([args.op], args.spec, include_builtin=not args.only_spec)[0]
        sweep.configurable(spec, tgt.arch)
        dtypes = [parse_dtype(d) for d in args.dtypes.split(",")]
        filters = [f.strip() for f in args.cases.split(",") if f.strip()] if args.cases else []
        cases = _select_cases(spec, args.suite, dtypes, filters)
        out = results.writable_folder(args.out)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight tune: {str(e).strip(chr(39))}")
    timing = device.type == "cuda" and tgt.in_use
    tasks = sweep.tasks(spec, cases, tgt, max_compiles=args.max_compiles, time=timing,
                        spec_files=args.spec)
    if ray is None:  # on Ray, on_cluster says which GPUs the workers tune for
        console.print(f"[dim]{tgt.describe()}[/]")
        if not timing:
            why = ("no GPU in use" if device.type != "cuda" else
                   f"the GPU in use is not the target {tgt.sku.name}")
            console.print(f"[dim]{why}: configurations are pruned by what the compiled kernels "
                          f"for {tgt.arch_name} show (launches sized for {tgt.sku.name}); "
                          f"timing is skipped.[/]")
    console.print(f"[dim]{len(tasks)} shapes sharing {args.max_compiles} compiles "
                  f"(--max-compiles){': the rule alone on some' if len(tasks) * 2 > args.max_compiles else ''}[/]")

    from rich.progress import Progress

    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("capturing, then compiling every shape's candidates",
                                total=len(tasks))

        def advance(task, rows):
            progress.update(bar, description=f"judged {task.case.label}")
            progress.advance(bar)

        if ray is None:
            rows = sweep.run_tasks(tasks, device, compiler=TritonCompiler(jobs=args.jobs),
                                   on_task=advance)
        else:
            from speedlight.tune import on_cluster
            try:
                rows, timing = on_cluster.tune_on_ray(
                    tasks, ray, jobs=args.jobs, target=args.target, on_task=advance,
                    say=console.print,
                    on_total=lambda n: progress.update(bar, total=n))
            except cluster.ClusterError as e:
                raise SystemExit(f"speedlight tune: {e}")

    display.print_sweep(rows, console, timed=timing)
    env = results.environment(device)
    run_id = uuid.uuid4().hex[:12]
    path = results.append_jsonl(Path(out) / "tune.jsonl",
                                [dict(env, **r, run=run_id) for r in rows])
    console.print(f"[dim]rows written to {path}[/]")
    for sku, entries in sweep.winners(rows).items():
        written = tuning.write(Path(out) / "tuned" / f"{sku}.json", sku, entries)
        console.print(f"[dim]tuned table written to {written}[/]")
        if not args.no_install:
            installed = tuning.write(tuning.user_path(sku), sku, entries)
            tuning.reload()
            console.print(f"[green]{sum(len(b) for b in entries.values())} entries installed "
                          f"in {installed}[/] (the ops read it at their next launch)")
    errors = [r for r in rows if r.get("status") == "error"]
    return 1 if errors else 0
