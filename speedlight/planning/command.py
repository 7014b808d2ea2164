"""`speedlight plan [--model MODEL]`: choose, per kind of speedlight.patch, the fastest
correct candidate for a model on the GPU in use (on a CPU: every candidate verified, nothing
timed), print the tables and write the plan where patch(plan="auto") finds it. Every
argument is checked before any model is built: a bad one exits 2 with one line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from speedlight import arguments

DTYPES = ("fp32", "bf16", "fp16")


class ArgumentProblem(ValueError):
    """A command-line argument `speedlight plan` cannot plan with; the message names it."""


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_name", nargs="?", default=None, metavar="MODEL",
                   help="the same as --model (kept for `speedlight plan llama-3-8b`)")
    arguments.add_model(p)
    p.add_argument("--compile", default=None, metavar="MODE",
                   help="time every side under torch.compile in this mode (default: eager)")
    p.add_argument("--kinds", default=None, metavar="KIND,...",
                   help="the kinds of patch to plan (default: all)")
    p.add_argument("--candidates", default=None, metavar="NAME,...",
                   help="the candidates to try (default: every one of each kind; the model's "
                        "own always runs)")
    p.add_argument("--out", default=None,
                   help="also write the plan to this file (it is always written to the cache)")
    p.add_argument("--no-project", action="store_true",
                   help="without a GPU, skip the projected floors of `profile --project`")


def projected(args: argparse.Namespace, patch) -> dict | None:
    """`profile --project`'s floors of the step, without and with speedlight's ops, on the
    default target: the only estimate without a GPU, labelled projected."""
    from speedlight import plans
    from speedlight import target as target_mod
    from speedlight.profile.project_command import ProjectionRequest, projected_profile

    request = ProjectionRequest(model=args.model, batch=args.batch, seq=args.seq, train=True,
                                size=args.size or "small", layers=args.layers, seed=args.seed,
                                top=5)
    return plans.projected_estimate(projected_profile(request, target_mod.resolve(None),
                                                      patch=patch))


def _model_problem(spec: str | None) -> str | None:
    """Why --model names nothing `speedlight plan` can plan, read without building it:
    a config.json whose model_type transformers builds no causal LM of."""
    if spec is None or not spec.endswith(".json") or not Path(spec).is_file():
        return None  # the default, a MODELS name, a callable; a missing file: models.build says
    try:
        doc = json.loads(Path(spec).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"--model {spec!r}: not a readable config.json ({type(e).__name__}: {e})"
    model_type = doc.get("model_type") if isinstance(doc, dict) else None
    if not isinstance(model_type, str):
        return f"--model {spec!r}: not a Hugging Face config.json with a model_type"
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:
        return None  # models.build names the missing transformers
    causal = set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    causal |= set(getattr(auto, "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", {}))
    if model_type not in causal:
        return (f"--model {spec!r}: model_type {model_type!r} is not a causal language model "
                "transformers can build (speedlight plan times a causal LM's decoder layer)")
    return None


def _out_problem(out: str | None) -> str | None:
    """Why the plan cannot be written to --out, found before any work."""
    from speedlight import results

    if out is None:
        return None
    if not out.strip():
        return "--out is empty: name the plan file to write"
    path = Path(out)
    if path.is_dir():
        return f"--out {out!r} is a folder: name the plan file to write (e.g. {out}/plan.json)"
    try:
        results.writable_folder(path.parent)
    except ValueError as e:
        return f"--out {out!r}: its folder {e}"
    if path.exists() and not path.is_file():
        return f"--out {out!r} is not a regular file"
    return None


def check_plan_arguments(args: argparse.Namespace) -> torch.dtype:
    """ArgumentProblem for the first argument `speedlight plan` cannot plan with; the dtype
    to plan in otherwise. Nothing is built or written."""
    from speedlight.planning import compile_modes
    from speedlight.runtime import model_defaults
    from speedlight.spec import parse_dtype

    if args.model_name is not None:
        if args.model is not None and args.model != args.model_name:
            raise ArgumentProblem(f"MODEL {args.model_name!r} and --model {args.model!r} name "
                                  "two models: give one")
        args.model = args.model_name
    for flag, value in (("--batch", args.batch), ("--seq", args.seq), ("--layers", args.layers)):
        if value is not None and value < 1:
            raise ArgumentProblem(f"{flag} must be at least 1, got {value}")
    dtype, _ = model_defaults(args.device)
    if args.dtype is not None:
        try:
            dtype = parse_dtype(args.dtype)
        except ValueError:
            dtype = None
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ArgumentProblem(f"--dtype takes {', '.join(DTYPES)} (a model's training "
                                  f"precision); got {args.dtype!r}")
    if args.compile is not None and args.compile not in compile_modes():
        raise ArgumentProblem(f"--compile takes one of torch.compile's modes "
                              f"({', '.join(compile_modes())}); got {args.compile!r}")
    from speedlight.patching.patcher import kinds
    from speedlight.planning import check_candidates, check_kinds

    for flag, check, value in (("--kinds", lambda v: check_kinds(v, kinds()), args.kinds),
                               ("--candidates", check_candidates, args.candidates)):
        if value is not None:
            try:
                check([v for v in value.split(",") if v])
            except ValueError as e:
                raise ArgumentProblem(f"{flag}: {e}") from None
    for problem in (_out_problem(args.out), _model_problem(args.model)):
        if problem is not None:
            raise ArgumentProblem(problem)
    return dtype


def _refuse(message: str) -> int:
    print(f"speedlight plan: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, *, patch=None) -> int:
    """`speedlight plan`; `patch` (speedlight.patch, handed in by the CLI) serves the
    projected estimate without a GPU."""
    from speedlight import plans, results
    from speedlight.planning import display, plan
    from speedlight.runtime import model_defaults, on_gpu
    from speedlight.workloads import models

    try:
        dtype = check_plan_arguments(args)
    except ArgumentProblem as e:
        return _refuse(str(e))
    device = torch.device(args.device)
    gpu = on_gpu(device)
    console = results.make_console()
    try:
        w = models.build(args.model, batch=args.batch, seq=args.seq, train=True, dtype=dtype,
                         device=device, size=args.size or model_defaults(device)[1],
                         layers=args.layers or 2, seed=args.seed)
    except models.ModelError as e:
        return _refuse(str(e))
    estimate = None
    if not gpu and not args.no_project and ":" not in (args.model or ""):
        estimate = projected(args, patch)
    w.model.train()
    listed = {flag: None if value is None else [v for v in value.split(",") if v]
              for flag, value in (("kinds", args.kinds), ("candidates", args.candidates))}
    result = plan(w.model, w.inputs, compile_mode=args.compile, projected=estimate,
                  autocast=None, verify=True, **listed)
    console.print(display.plan_table(result))
    if any(d.candidates for d in result.decisions.values()):
        console.print(display.candidates_table(result))
    console.print(f"plan: {plans.path_for(result.key)}")
    if args.out:
        console.print(f"plan: {plans.save(result, args.out)}")
    return 0
