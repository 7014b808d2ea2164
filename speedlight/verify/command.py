"""`speedlight verify`: every op's suite, in every dtype and several seeds, against float64."""

from __future__ import annotations

import argparse
import uuid


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ops", default=None, help="comma-separated op names (default: all)")
    p.add_argument("--suite", default="quick", choices=("quick", "model", "full"))
    p.add_argument("--dtypes", default="fp32,fp16,bf16", help="comma-separated: fp32,fp16,bf16")
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--seeds", type=int, default=2, help="how many seeds per case (default 2)")
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="a Python file defining SPEC or SPECS (your own op); repeatable")
    p.add_argument("--only-spec", action="store_true",
                   help="verify only the ops of --spec files, not the built-in ones")
    p.add_argument("--out", default="speedlight-results", help="folder for verify.jsonl")
    p.add_argument("--max-gib", type=float, default=None,
                   help="skip cases needing more memory than this (default: 8 on CPU, "
                        "half the free GPU memory on CUDA)")
    p.add_argument("--all-rows", action="store_true", help="show passing cases too")


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from speedlight import registry, results
    from speedlight.spec import parse_dtype
    from speedlight.verify import display, harness

    console = display.make_console()
    if args.seeds < 1:
        raise SystemExit("speedlight verify: --seeds must be at least 1")
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
    device = torch.device(args.device)
    if args.max_gib is not None:
        max_bytes = int(args.max_gib * harness.GiB)
    elif device.type == "cuda":
        max_bytes = torch.cuda.mem_get_info(device)[0] // 2
    else:
        max_bytes = 8 * harness.GiB
    seeds = list(range(args.seed, args.seed + args.seeds))
    if device.type == "cpu":
        console.print("[dim]No GPU in use: kernels run on CPU tensors through the Triton "
                      "interpreter (correctness only; bfloat16 tl.dot cases are skipped).[/]")

    out_path = out_dir / "verify.jsonl"
    env = results.environment(device)
    run_id = uuid.uuid4().hex[:12]
    all_results: list[harness.CaseResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            for spec in specs:
                cases = harness.expand(spec, args.suite, dtypes, seeds)
                task = progress.add_task(spec.name, total=len(cases))
                for case in cases:
                    progress.update(task, description=f"{spec.name} {case.id}")
                    r = harness.verify_case(spec, case, device, max_bytes=max_bytes)
                    # case by case, so an interrupted run keeps every finished case
                    results.append_jsonl(out_path, [dict(r.to_row(), suite=args.suite,
                                                         run=run_id, **env)])
                    all_results.append(r)
                    progress.advance(task)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: the {len(all_results)} finished cases are in "
                      f"{out_path}[/]")
        return 130

    display.print_results(all_results, console, device=f"{env['device']}, {env['runtime']}",
                          only_problems=not args.all_rows)
    console.print(f"results: {out_path}")
    bad = [r for r in all_results if r.status in ("fail", "error")]
    return 1 if bad else 0
