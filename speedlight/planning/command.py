"""`speedlight plan [MODEL]`: measure which kinds of speedlight.patch to keep for a model on
the GPU in use, print the table and write the plan where patch(plan="auto") finds it."""

from __future__ import annotations

import argparse

import torch

SIZES = ("small", "full")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None, metavar="MODEL",
                   help="default: the small built-in Llama; a name from speedlight.shapes.MODELS; "
                        "a Hugging Face config.json; or module:callable returning (model, inputs)")
    p.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on a GPU, "
                                                 "fp32 on a CPU)")
    p.add_argument("--size", choices=SIZES, default=None,
                   help="for a MODELS name: scaled down or its real widths (default: full on a "
                        "GPU, small on a CPU); only one layer's units are timed either way")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers to build (default 2: one layer is timed)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="time both sides under torch.compile in this mode (default: eager)")
    p.add_argument("--out", default=None,
                   help="also write the plan here (it is always written to the cache)")
    p.add_argument("--no-project", action="store_true",
                   help="without a GPU, skip the projected floors of `profile --project`")


def projected(args: argparse.Namespace, patch) -> dict | None:
    """`profile --project`'s floors of the step, without and with speedlight's ops, on the
    default target: the only estimate without a GPU, labelled projected."""
    from speedlight import plans
    from speedlight import target as target_mod
    from speedlight.profile.project_command import projected_profile

    tgt = target_mod.resolve(None)
    ns = argparse.Namespace(model=args.model, batch=args.batch, seq=args.seq, train=True,
                            infer=False, target=tgt.sku.key, sku=None, dtype=None,
                            size=args.size or "small", layers=args.layers, seed=args.seed,
                            top=5, recipe=None, targets=None, shard=None, vary=None,
                            device="cpu", project=True)
    return plans.projected_estimate(projected_profile(ns, tgt, patch=patch))


def run(args: argparse.Namespace) -> int:
    from speedlight import plans, results
    from speedlight.planning import display, plan
    from speedlight.spec import parse_dtype
    from speedlight.workloads import models

    device = torch.device(args.device)
    gpu = device.type == "cuda"
    dtype = parse_dtype(args.dtype) if args.dtype else (torch.bfloat16 if gpu else torch.float32)
    console = results.make_console()
    try:
        w = models.build(args.model, batch=args.batch, seq=args.seq, train=True, dtype=dtype,
                         device=device, size=args.size or ("full" if gpu else "small"),
                         layers=args.layers or 2, seed=args.seed)
    except models.ModelError as e:
        console.print(f"[red]speedlight plan: {e}")
        return 2
    estimate = None
    if not gpu and not args.no_project and ":" not in (args.model or ""):
        estimate = projected(args, args.patch)
    w.model.train()
    result = plan(w.model, w.inputs, compile_mode=args.compile, projected=estimate,
                  autocast=None)
    console.print(display.plan_table(result))
    console.print(f"plan: {plans.path_for(result.key)}")
    if args.out:
        console.print(f"plan: {plans.save(result, args.out)}")
    return 0
