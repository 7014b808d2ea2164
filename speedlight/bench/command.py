"""`speedlight bench`: time speedlight's ops against PyTorch eager, torch.compile and
Liger-Kernel; compare two runs; plot; render the README's performance table.

    speedlight bench [run] [--suite model] [--ops a,b] ...   time a suite (default action)
    speedlight bench compare OLD NEW [--threshold 0.05]      exit 1 on a significant regression
    speedlight bench plot RESULTS... [--out DIR]             GB/s or TFLOP/s against shape
    speedlight bench table [ROOT] [--readme README.md]       the README's table from ROOT
    speedlight bench model [--model NAME | --moe [NAME]] [--layers N] [--batch B --seq S] [--plan FILE]
                                                             a model's training step against
                                                             HF, torch.compile, Liger;
                                                             speedlight (all) and (planned)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from speedlight import arguments, cluster

# bench/baselines.py's BASELINES, spelled out so the command parser imports no torch
_BASELINES = ("torch-eager", "torch-compile", "liger", "torch-fused", "sdpa-flash",
              "sdpa-efficient", "sdpa-cudnn", "flex-attention", "flash-attn",
              "torch-grouped-mm", "torch-scaled-mm", "cublas-bf16")

ACTIONS = ("run", "compare", "plot", "table", "model")


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("action", nargs="?", default="run", choices=ACTIONS,
                   help="run (default), compare, plot, table or model")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="compare: OLD NEW; plot: results files or folders; table: results root")
    r = p.add_argument_group("run")
    r.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    r.add_argument("--suite", default="model", choices=("quick", "model", "full"))
    arguments.add_dtypes(r, "bf16")
    r.add_argument("--modes", default="fwd,bwd,fwd+bwd", help="comma-separated: fwd,bwd,fwd+bwd")
    r.add_argument("--baselines", default=",".join(_BASELINES),
                   help=f"comma-separated, from {','.join(_BASELINES)} (torch-fused: torch's "
                        "own fused function where it has one; sdpa-* to flash-attn apply "
                        "to attention only, sdpa-math when named, torch-scaled-mm and cublas-bf16 to fp8 matmul "
                        "only, torch-grouped-mm to grouped_matmul only); 'none' for none")
    arguments.add_spec(r)
    arguments.add_target(r)
    r.add_argument("--predict", action="store_true",
                   help="beside each measured time, the time predicted for the target GPU from "
                        "the compiled kernels (speedlight inspect's model; compiles each case's "
                        "kernels for the target, no GPU needed), labelled predicted")
    r.add_argument("--cases", default=None, metavar="REGEX", help="only cases whose id matches")
    r.add_argument("--limit", type=int, default=None, help="at most this many cases per op")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--impl", default="", metavar="NAMES",
                   help="comma-separated implementations run only when named (e.g. gluon: "
                        "no GPU has verified it yet), timed beside the others")
    r.add_argument("--no-verify", action="store_true",
                   help="do not verify cases first (then no speedup is reported)")
    r.add_argument("--graph", default="auto", choices=("auto", "always", "never"),
                   help="CUDA-graph timing: auto = forward cases moving <= --graph-max-mib")
    r.add_argument("--graph-max-mib", type=float, default=8.0)
    r.add_argument("--rse", type=float, default=None,
                   help="stop sampling at this relative standard error of the median "
                        "(default 0.01 on GPU, 0.05 on CPU)")
    r.add_argument("--min-samples", type=int, default=None)
    r.add_argument("--max-samples", type=int, default=None)
    r.add_argument("--time-cap", type=float, default=None, metavar="S",
                   help="seconds of sampling per measurement (default 1 on GPU, 0.25 on CPU)")
    r.add_argument("--budget-s", type=float, default=None,
                   help="total seconds for the run, shared among the ops; cases not started "
                        "in time are recorded as skipped")
    r.add_argument("--max-gib", type=float, default=None,
                   help="device memory a case may use (default: half the free GPU memory)")
    r.add_argument("--cpu-max-mib", type=float, default=4.0,
                   help="on CPU, skip cases moving more than this per forward (default 4)")
    r.add_argument("--compile-backend", default="inductor")
    r.add_argument("--compile-shapes", default="static", choices=("static", "auto"),
                   help="torch.compile baseline: static (a kernel per shape, the default) or "
                        "auto (torch's automatic dynamic shapes)")
    r.add_argument("--compile-mode", default=None, help="torch.compile mode, e.g. max-autotune")
    arguments.add_ray(r)
    p.add_argument("--out", default=None,
                   help="run: folder for bench.jsonl (default speedlight-results); "
                        "plot: folder for the PNGs (default: plots/ beside the results)")
    c = p.add_argument_group("compare")
    c.add_argument("--threshold", type=float, default=0.05,
                   help="slower by more than this fraction to count (default 0.05)")
    c.add_argument("--alpha", type=float, default=0.01,
                   help="significance level of the one-sided Mann-Whitney U test (default 0.01)")
    c.add_argument("--impls", default="speedlight",
                   help="implementations to compare (default speedlight; 'all' for every one)")
    m = p.add_argument_group("model (a training step: forward, backward, AdamW)")
    m.add_argument("--model", default=None, metavar="NAME|config.json",
                   help="a name from speedlight.shapes.MODELS at its real widths (default "
                        "llama-3-8b on a GPU; on a CPU the small default model, and a name is "
                        "scaled down)")
    m.add_argument("--moe", nargs="?", const=True, default=False, metavar="NAME",
                   help="a mixture of experts instead of the dense default: qwen3-30b-a3b "
                        "(the default: 128 experts, top-8, at 4 layers), deepseek-v3 (its widths, "
                        "32 of its 256 routed experts and its shared expert, one MoE layer) or "
                        "gpt-oss-20b (4 layers) on a GPU; the architecture scaled down, one layer, "
                        "on a CPU; adds the hf-loop variant (HF's per-expert loop)")
    m.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default 4 on a GPU, the model's 2 on a CPU)")
    m.add_argument("--batch", type=int, default=None, help="sequences per step (default 4 on a "
                                                           "GPU, 1 on a CPU)")
    m.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 4096 on a "
                                                         "GPU, 32 on a CPU)")
    m.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default bf16 on a GPU, "
                                                 "fp32 on a CPU)")
    m.add_argument("--variants", default=None,
                   help="comma-separated, from hf,speedlight,speedlight-planned,hf-compile,"
                        "speedlight-compile,liger,hf-loop (default: all, hf-loop for a mixture of "
                        "experts only; on a CPU the compiled ones, liger and speedlight-planned are "
                        "skipped, with the reason, unless named)")
    m.add_argument("--plan", default="measure", metavar="measure|auto|FILE",
                   help="the plan of speedlight-planned (speedlight (planned), beside "
                        "speedlight (all)): measure it on the variant's model and first batch "
                        "(default), the cached plan (auto), or a plan file from `speedlight plan "
                        "--out`")
    m.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3 on a "
                                                            "GPU, 1 on a CPU)")
    m.add_argument("--steps", type=int, default=None, help="timed steps (default 10 on a GPU, 3 "
                                                           "on a CPU)")
    m.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    t = p.add_argument_group("table")
    t.add_argument("--readme", default=None, help="write the table between the README's markers")
    t.add_argument("--check", action="store_true", help="exit 1 if the README's table is stale")
    t.add_argument("--include-cpu", action="store_true",
                   help="also summarize rows timed on the CPU interpreter (labelled so)")


def run(args: argparse.Namespace, *, patch=None, predictor=None) -> int:
    """`speedlight bench ACTION`; `patch` (speedlight.patch) serves `bench model`'s
    speedlight variants and `predictor` (inspect's predicted time) `bench run --predict`,
    both handed in by the CLI."""
    if args.action == "run":
        return _run(args, predictor)
    if args.action == "model":
        return _model(args, patch)
    return {"compare": _compare, "plot": _plot, "table": _table}[args.action](args)


def _fail(message: str):
    raise SystemExit(f"speedlight bench: {message}")


def _list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# --- run --------------------------------------------------------------------------------------

def bench_cases(bench, specs, cases_of, out_path: Path, *, budget_s: float | None = None,
                on_case=None) -> list[dict]:
    """Time every op's cases with `bench` (a runner.Bench, which holds the device, target,
    settings and baselines), appending each case's rows to out_path as it finishes: the
    rows. `speedlight bench` and the report's bench stage both run through this.
    on_case(spec, case, rows) follows each case (progress)."""
    from speedlight import results

    rows: list[dict] = []

    def done(spec, case, case_rows):
        results.append_jsonl(out_path, case_rows)  # atomically, case by case
        rows.extend(case_rows)
        if on_case is not None:
            on_case(spec, case, case_rows)
    bench.run(specs, cases_of, budget_s=budget_s, on_case=done)
    return rows


def _run(args: argparse.Namespace, predictor=None) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speedlight import registry, results
    from speedlight.bench import display
    from speedlight.bench.baselines import Baselines, CompileOptions
    from speedlight.bench.runner import MODES, Bench, Settings
    from speedlight.bench.timer import default_rule
    from speedlight.spec import parse_dtype

    if args.paths:
        _fail(f"run takes no paths (got {' '.join(args.paths)}); did you mean compare or plot?")
    device = torch.device(args.device)
    console = results.make_console(display.CONSOLE_WIDTH)
    modes = tuple(_list(args.modes))
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        _fail(f"--modes takes {', '.join(MODES)}; got {args.modes!r}")
    names = [n for n in _list(args.baselines) if n != "none"]
    try:
        dtypes = [parse_dtype(d) for d in _list(args.dtypes)]
        specs = registry.select(_list(args.ops) if args.ops else None, args.spec,
                                include_builtin=not args.only_spec)
        baselines = Baselines(tuple(names), CompileOptions(
            args.compile_backend, False if args.compile_shapes == "static" else None, args.compile_mode))
        pattern = re.compile(args.cases) if args.cases else None
    except re.error as e:
        _fail(f"--cases {args.cases!r} is not a regular expression: {e}")
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    for flag, value, least in (("--rse", args.rse, 0.0), ("--time-cap", args.time_cap, 0.0),
                               ("--budget-s", args.budget_s, 0.0), ("--max-gib", args.max_gib, 0.0),
                               ("--cpu-max-mib", args.cpu_max_mib, 0.0),
                               ("--min-samples", args.min_samples, 0),
                               ("--max-samples", args.max_samples, 0), ("--limit", args.limit, 0)):
        if value is not None and not value > least:  # NaN too
            _fail(f"{flag} must be more than {least:g}, got {value:g}")
    if args.max_gib is not None and args.max_gib == float("inf"):
        _fail("--max-gib must be a finite number of GiB")
    if args.graph_max_mib < 0:
        _fail(f"--graph-max-mib must be at least 0, got {args.graph_max_mib:g}")
    ray = arguments.ray_sweep(args, "bench")
    if ray is not None and args.budget_s is not None:
        _fail("--budget-s shares one machine's time among the ops; with --ray, leave it out "
              "(or bound the sweep with --limit and --cases)")
    try:  # before any work, not at the first write after a case was timed
        out_dir = results.writable_folder(args.out or "speedlight-results")
    except ValueError as e:
        _fail(f"--out {e}")
    rule = default_rule(device)
    overrides = {k: v for k, v in (("target_rse", args.rse), ("min_samples", args.min_samples),
                                    ("max_samples", args.max_samples), ("time_cap_s", args.time_cap))
                 if v is not None}
    if overrides:
        import dataclasses
        rule = dataclasses.replace(rule, **overrides)
    settings = Settings(modes=modes, rule=rule, graph=args.graph,
                        graph_max_bytes=int(args.graph_max_mib * 2 ** 20), verify=not args.no_verify,
                        max_bytes=int(args.max_gib * 2 ** 30) if args.max_gib else None,
                        cpu_max_bytes=int(args.cpu_max_mib * 2 ** 20),
                        named=tuple(n.strip() for n in args.impl.split(",") if n.strip()))
    tgt = arguments.resolve_target(args, "bench")
    bench = Bench(device, settings, baselines, suite=args.suite, target=tgt)

    def cases(spec):
        out = [c.with_(dtype=d, seed=args.seed) for c in spec.cases(args.suite) for d in dtypes]
        out = [c for c in out if pattern is None or pattern.search(c.id)]
        return out[: args.limit] if args.limit is not None else out

    if ray is None:
        if device.type == "cpu":
            console.print(f"[bold yellow]{display.NOT_REPRESENTATIVE}[/]")
        console.print(f"[dim]{tgt.describe()}; % of speed-of-light: {bench.roof_note}[/]")
    out_path = out_dir / "bench.jsonl"
    total = sum(len(cases(s)) for s in specs)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    rows: list[dict] = []
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("bench", total=total)

            def on_case(spec, case, case_rows):
                rows.extend(case_rows)
                progress.update(task, description=f"{spec.name} {case.id}")
                progress.advance(task)
            if ray is None:
                bench_cases(bench, specs, cases, out_path, budget_s=args.budget_s, on_case=on_case)
            else:
                from speedlight.bench import on_cluster
                on_cluster.bench_on_ray(specs, cases, out_path, ray, settings=settings,
                                        rule_overrides=overrides, baselines=baselines,
                                        suite=args.suite, spec_files=args.spec,
                                        include_builtin=not args.only_spec, target=args.target,
                                        sku=args.sku, run_id=bench.run_id, on_case=on_case,
                                        say=console.print,
                                        on_total=lambda n: progress.update(task, total=n))
    except cluster.ClusterError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: the {len(rows)} rows of the cases finished are in "
                      f"{out_path}[/]")
        return 130
    if args.predict and predictor is not None:
        _add_predictions(rows, specs, tgt, predictor, out_dir, console)
    display.print_bench(rows, console)
    console.print(f"results: {out_path}")
    errors = [r for r in rows if r.get("implementation") == "speedlight" and r.get("status") == "error"]
    bugs = [r for r in rows if r.get("sol_bug")]
    return 1 if errors or bugs else 0


# --- compare ------------------------------------------------------------------------------------

def _add_predictions(rows, specs, tgt, predictor, out_dir, console) -> None:
    """Each speedlight row's predicted time on the target (fwd, bwd, their sum for fwd+bwd),
    from `predictor` (inspect's, handed in by the CLI); written to predicted.jsonl."""
    from speedlight import results
    from speedlight.spec import Case, parse_dtype

    by_name = {s.name: s for s in specs}
    done: dict = {}
    written = []
    for r in rows:
        if r.get("implementation") != "speedlight" or r["op"] not in by_name:
            continue
        c = r["case"]
        key = r["case_id"]
        if key not in done:
            case = Case(c["op"], c["params"], dtype=parse_dtype(c["dtype"]), layout=c["layout"],
                        flags=c.get("flags") or {}, seed=c.get("seed", 0), model=c.get("model"))
            console.print(f"[dim]predicting {r['op']} {r.get('case_label', key)} for "
                          f"{tgt.sku.name}[/]")
            done[key] = predictor(by_name[r["op"]], case, tgt)
        got = done[key]
        parts = [got.get(d) for d in (("fwd", "bwd") if r["mode"] == "fwd+bwd" else (r["mode"],))]
        if got.get("why") or not all(parts) or any("why" in p for p in parts):
            why = got.get("why") or next((p["why"] for p in parts if p and "why" in p),
                                         "no launch in this direction")
            r["predicted"] = {"why": why, "predicted": True}
        else:
            r["predicted"] = {"us": round(sum(p["us"] for p in parts), 3), "predicted": True,
                              "bound": max(parts, key=lambda p: p["us"])["bound"],
                              "sku": tgt.sku.name}
        written.append({"tool": "bench-predicted", "op": r["op"], "case_id": key,
                        "mode": r["mode"], **r["predicted"]})
    results.append_jsonl(out_dir / "predicted.jsonl", written)


def _compare(args: argparse.Namespace) -> int:
    from speedlight import results
    from speedlight.bench import compare, display

    if len(args.paths) != 2:
        _fail("compare takes two paths: OLD NEW (results files or folders)")
    try:
        old, new = (compare.load_bench_rows(p) for p in args.paths)
        for side, path, rows in (("OLD", args.paths[0], old), ("NEW", args.paths[1], new)):
            if not rows:
                _fail(f"{side} {str(path)!r} holds no bench rows (bench*.jsonl files "
                      f"written by `speedlight bench`)")
        comps = compare.compare(old, new, threshold=args.threshold, alpha=args.alpha,
                                implementations=None if args.impls == "all" else _list(args.impls))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console = results.make_console(display.CONSOLE_WIDTH)
    title = display.title_for(old + new, "speedlight bench compare") + (
        f": regression = slower by > {100 * args.threshold:g}% and one-sided Mann-Whitney U "
        f"p < {args.alpha:g}")
    console.print(display.compare_table(comps, title))
    regressed = compare.regressions(comps)
    judged = [c for c in comps if c.verdict in ("regression", "improvement", "unchanged")]
    if not judged:
        console.print("[yellow]no case was timed in both runs: nothing to compare[/]")
        return 2
    console.print(f"{len(regressed)} regression(s), "
                  f"{sum(c.verdict == 'improvement' for c in comps)} improvement(s), "
                  f"{sum(c.verdict == 'unchanged' for c in comps)} unchanged, of {len(judged)} compared")
    return 1 if regressed else 0


# --- plot -----------------------------------------------------------------------------------------

def _plot(args: argparse.Namespace) -> int:
    from speedlight.bench import compare, plots

    if not args.paths:
        _fail("plot takes one or more results files or folders")
    try:
        rows = compare.load_bench_rows(args.paths)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    first = Path(args.paths[0])
    out = Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "plots"
    written = plots.plot(rows, out)
    if not written:
        _fail("no timed rows to plot")
    print(f"{len(written)} plot(s) in {out}")
    return 0


# --- table ------------------------------------------------------------------------------------------

def _table(args: argparse.Namespace) -> int:
    from speedlight.bench import table

    root = args.paths[0] if args.paths else "benchmarks/results"
    if len(args.paths) > 1:
        _fail("table takes one results root")
    body = table.markdown(table.collect(root), source=str(root).rstrip("/"),
                          include_cpu=args.include_cpu)
    if args.include_cpu and args.readme:
        _fail("--include-cpu is for a smoke run's summary; the README takes GPU rows only")
    if not args.readme:
        print(body)
        return 0
    readme = Path(args.readme)
    try:
        current = readme.read_text()
        wanted = table.replace_section(current, body)
    except (OSError, ValueError) as e:
        _fail(str(e))
    if args.check:
        if wanted != current:
            print(f"{readme}: the performance table is stale; run "
                  f"`speedlight bench table {root} --readme {readme}`", file=sys.stderr)
            return 1
        return 0
    changed = table.update_readme(readme, body)
    print(f"{readme}: {'updated' if changed else 'already up to date'}")
    return 0


# --- model ------------------------------------------------------------------------------------------

def _model(args: argparse.Namespace, patch=None) -> int:
    import torch

    from speedlight import results
    from speedlight.bench import display, model_step
    from speedlight.workloads.models import ModelError
    from speedlight.spec import parse_dtype

    if args.paths:
        _fail(f"model takes no paths (got {' '.join(args.paths)}); name it with --model")
    device = torch.device(args.device)
    moe = getattr(args, "moe", False)
    if moe and args.model is not None:
        _fail(f"--moe picks the mixture of experts ({model_step.MOE_MODEL} or another of "
              f"{', '.join(model_step.MOE_MODELS)}); with --model {args.model} leave --moe out")
    if moe not in (False, True) and moe not in model_step.MOE_MODELS:
        _fail(f"--moe takes {', '.join(model_step.MOE_MODELS)} (or nothing: "
              f"{model_step.MOE_MODEL}); got {moe!r}")
    d = model_step.defaults(device, moe=moe)
    for flag, value in (("--layers", args.layers), ("--batch", args.batch), ("--seq", args.seq),
                        ("--steps", args.steps)):
        if value is not None and value < 1:
            _fail(f"{flag} must be at least 1, got {value}")
    if args.warmup is not None and args.warmup < 0:
        _fail(f"--warmup must be at least 0, got {args.warmup}")
    if not 0 < args.lr < float("inf"):  # NaN too
        _fail(f"--lr must be more than 0 and finite, got {args.lr:g}")
    if args.budget_s is not None and args.budget_s <= 0:
        _fail(f"--budget-s must be more than 0, got {args.budget_s:g}")
    named = _list(args.variants) if args.variants else []
    bad = [v for v in named if v not in model_step.VARIANTS]
    if bad or (args.variants is not None and not named):
        _fail(f"--variants takes {','.join(model_step.VARIANTS)}; got {args.variants!r}")
    try:
        dtype = parse_dtype(args.dtype) if args.dtype else d["dtype"]
    except ValueError as e:
        _fail(f"--dtype: {e}")
    if dtype not in model_step.STEP_DTYPES:
        _fail(f"--dtype takes fp32, bf16 or fp16; got {args.dtype!r}")
    plan = args.plan
    if plan not in ("measure", "auto"):
        from speedlight import plans
        try:
            plan = plans.load_plan(plan).to_json()
        except (ValueError, KeyError, TypeError) as e:
            _fail(f"--plan: {e}")
    named_model = args.model is not None
    s = model_step.StepSettings(
        model=args.model if named_model else d["model"],
        layers=args.layers if args.layers is not None else (d["layers"] if not named_model or
                                                            device.type == "cuda" else None),
        batch=args.batch or d["batch"], seq=args.seq or d["seq"], dtype=dtype, device=device,
        warmup=d["warmup"] if args.warmup is None else args.warmup,
        steps=args.steps or d["steps"], seed=args.seed, lr=args.lr,
        compile_backend=args.compile_backend, compile_mode=args.compile_mode,
        budget_s=args.budget_s, overrides=None if named_model else d["overrides"], plan=plan)
    try:
        model_step.check_model(s)
    except ModelError as e:
        _fail(str(e))
    try:
        out_dir = results.writable_folder(args.out or "speedlight-results")
    except ValueError as e:
        _fail(f"--out {e}")
    console = results.make_console(display.CONSOLE_WIDTH)
    if device.type == "cpu":
        console.print(f"[bold yellow]{display.NOT_REPRESENTATIVE}[/]")
    out_path = out_dir / model_step.FILE

    def on_row(row):
        what = (f"{row['tokens_per_s']:.4g} tokens/s" if row["status"] == "ok"
                else f"{row['status']}: {row.get('reason')}")
        console.print(f"  {row['variant']}: {what}")
    try:
        rows = model_step.run_variants(s, named or model_step.variants_for(s), out_path,
                                       forced=named, on_row=on_row,
                                       patch=patch)
    except ModelError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: the rows of the variants finished are in "
                      f"{out_path}[/]")
        return 130
    console.print(model_step.step_table(rows))
    candidates = model_step.plan_candidates_table(rows)
    if candidates is not None:
        console.print(candidates)
    console.print(f"results: {out_path}")
    try:
        console.print(f"chart: {model_step.chart(rows, out_dir / model_step.CHART)}")
    except RuntimeError as e:
        console.print(f"[yellow]no chart: {e}[/]")
    problems = model_step.step_failures(rows)
    for p in problems:
        console.print(f"[red]{p}[/]")
    return 1 if problems else 0
