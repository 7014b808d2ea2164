"""`speedlight report`: its flags, read into a ReportRequest (pipeline.stages), run into a
folder built beside --out (pipeline.folder)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from speedlight import arguments


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


def request_of(args: argparse.Namespace, plan=None):
    """The ReportRequest of a parsed command line; `plan`: speedlight.plan, handed in by
    the CLI."""
    from speedlight.pipeline.stages import OPTIONAL, ReportRequest

    return ReportRequest(
        target=arguments.resolve_target(args, "report"), device=torch.device(args.device),
        model=args.model, batch=args.batch, seq=args.seq, dtype=args.dtype, size=args.size,
        layers=args.layers, seed=args.seed, train=args.train, warmup=args.warmup,
        steps=args.steps, spec_files=tuple(args.spec), only_spec=args.only_spec,
        seeds=args.seeds, baselines=args.baselines, bench_budget_s=args.bench_budget,
        model_step_budget_s=args.model_step_budget, projection=args.projection,
        turned_off=frozenset(s for s in OPTIONAL if getattr(args, f"no_{s}")), plan=plan)


def run(args: argparse.Namespace, *, plan=None) -> int:
    """`speedlight report`; `plan` (speedlight.plan, handed in by the CLI) runs the plan
    stage."""
    from speedlight.pipeline.folder import built_beside
    from speedlight.pipeline.stages import report

    request = request_of(args, plan=plan)
    final = Path(args.out)
    try:
        with built_beside(final) as out:
            code = report(request, out)
    except KeyboardInterrupt:
        print(f"speedlight report: interrupted; {final} is as it was before this run")
        return 130
    print(f"report: {final / 'index.html'}  (and summary.md, with the JSON of each stage)")
    return code
