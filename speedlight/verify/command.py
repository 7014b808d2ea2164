"""`speedlight verify`: every op's suite, in every dtype and several seeds, against float64."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from speedlight import arguments, cluster


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    p.add_argument("--suite", default="quick", choices=("quick", "model", "full"))
    arguments.add_dtypes(p, "fp32,fp16,bf16")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    arguments.add_seeds(p)
    arguments.add_spec(p)
    arguments.add_target(p)
    arguments.add_out(p, "speedlight-results", "folder for verify.jsonl")
    p.add_argument("--max-gib", type=float, default=None,
                   help="skip cases needing more memory than this (default: 8 on CPU, "
                        "half the free GPU memory on CUDA)")
    p.add_argument("--all-rows", action="store_true", help="show passing cases too")
    p.add_argument("--impl", default="", metavar="NAMES",
                   help="comma-separated implementations run only when named (e.g. gluon: "
                        "no GPU has verified it yet), verified beside the others")
    arguments.add_ray(p)


def verify_cases(specs, cases_of, device, out_path: Path, *, suite: str, target=None,
                 max_bytes: int | None = None, run_id: str | None = None,
                 on_case=None, named: tuple[str, ...] = ()) -> list:
    """Verify every op's cases (cases_of(spec) -> cases) against float64, each of the op's
    implementations side by side, appending each row to out_path as it finishes: the
    CaseResults. `speedlight verify` and the
    report's verify stage both run through this. on_case(spec, result) follows each case
    (progress). named: implementations run only by name to include (OpSpec.swept)."""
    import torch

    from speedlight import results
    from speedlight.verify import harness

    device = torch.device(device)
    max_bytes = harness.default_max_bytes(device) if max_bytes is None else max_bytes
    env = results.environment(device)
    if target is not None:
        env["target"] = target.sku.key
    run_id = run_id or uuid.uuid4().hex[:12]
    done = []
    for spec in specs:
        for case in cases_of(spec):
            for r in harness.verify_implementations(spec, case, device, max_bytes=max_bytes,
                                                    named=named):
                results.append_jsonl(out_path, [dict(r.to_row(), suite=suite, run=run_id,
                                                     **env)])
                done.append(r)
                if on_case is not None:
                    on_case(spec, r)
    return done


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speedlight import registry, results
    from speedlight.spec import parse_dtype
    from speedlight.verify import display, harness

    console = results.make_console()
    if args.max_gib is not None and not 0 < args.max_gib < float("inf"):  # NaN too
        raise SystemExit(f"speedlight verify: --max-gib must be a number of GiB more than 0, "
                         f"got {args.max_gib:g}")
    ray = arguments.ray_sweep(args, "verify")
    names = [n.strip() for n in args.ops.split(",")] if args.ops else None
    try:
        dtypes = [parse_dtype(d) for d in args.dtypes.split(",") if d.strip()]
        specs = registry.select(names, args.spec, include_builtin=not args.only_spec)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight verify: {e}")
    try:  # before any work, not at the first write after an op was verified
        out_dir = results.writable_folder(args.out)
    except ValueError as e:
        raise SystemExit(f"speedlight verify: --out {e}")
    tgt = arguments.resolve_target(args, "verify")
    device = torch.device(args.device)
    max_bytes = harness.default_max_bytes(device, args.max_gib)
    seeds = list(range(args.seed, args.seed + args.seeds))
    if device.type == "cpu" and ray is None:
        console.print("[dim]No GPU in use: kernels run on CPU tensors through the Triton "
                      "interpreter (correctness only; bfloat16 tl.dot cases are skipped).[/]")
    if ray is None:  # on Ray, each worker's own GPU (unless --target names one)
        console.print(f"[dim]{tgt.describe()}[/]")

    out_path = out_dir / "verify.jsonl"
    env = results.environment(device)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    named = tuple(n.strip() for n in args.impl.split(",") if n.strip())
    total = sum(len(harness.expand(s, args.suite, dtypes, seeds)) * len(s.swept(named))
                for s in specs)
    finished = []
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("verify", total=total)

            def on_case(spec, result):
                finished.append(result)
                progress.update(task, description=f"{spec.name} {result.case.id}")
                progress.advance(task)
            if ray is None:
                all_results = verify_cases(
                    specs, lambda s: harness.expand(s, args.suite, dtypes, seeds), device,
                    out_path, suite=args.suite, target=tgt, max_bytes=max_bytes, on_case=on_case,
                    named=named)
            else:
                from speedlight.verify import on_cluster
                all_results = on_cluster.verify_on_ray(
                    specs, lambda s: harness.expand(s, args.suite, dtypes, seeds), out_path,
                    ray, suite=args.suite, spec_files=args.spec,
                    include_builtin=not args.only_spec, max_gib=args.max_gib,
                    target=args.target, sku=args.sku, named=named, on_case=on_case,
                    say=console.print, on_total=lambda n: progress.update(task, total=n))
    except cluster.ClusterError as e:
        raise SystemExit(f"speedlight verify: {e}")
    except KeyboardInterrupt:  # each finished case is already in out_path
        console.print(f"[yellow]interrupted: the {len(finished)} finished cases are in "
                      f"{out_path}[/]")
        return 130

    where = f"{env['device']}, {env['runtime']}" if ray is None else "on Ray"
    display.print_results(all_results, console, device=where,
                          only_problems=not args.all_rows)
    console.print(f"results: {out_path}")
    bad = [r for r in all_results if r.status in ("fail", "error")]
    return 1 if bad else 0
