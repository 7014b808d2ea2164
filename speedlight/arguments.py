"""The flags several sub-commands share, each defined once, with one default.

verify, bench, inspect, profile and report take their common flags from here, so
`--target`, `--steps` or `--train` mean the same thing, with the same default, wherever
they appear; `speedlight report` passes them on to the library call of each tool.
"""

from __future__ import annotations

import argparse

WARMUP = 1  # steps before a profile measures (the first one creates the optimizer state)
STEPS = 2  # clean steps timed, then as many recorded


def add_target(p: argparse.ArgumentParser) -> None:
    """--target and --sku: which GPU (see speedlight.target)."""
    from speedlight.target import DEFAULT_SKU

    p.add_argument("--target", default=None, metavar="SKU|ARCH",
                   help="the GPU to talk about: a SKU (h200, h100-sxm, h100-pcie, a100-sxm, b200, "
                        "l4), an arch (sm_90a, sm_80, sm_100a: its flagship SKU unless --sku "
                        f"says), or native (the GPU in use); default: the GPU in use, else "
                        f"{DEFAULT_SKU} (projected)")
    p.add_argument("--sku", default=None,
                   help="with an arch --target, the SKU whose SM count sizes launches and whose "
                        "roof the floors are on (--target sm_90a --sku h100-sxm)")


def resolve_target(args: argparse.Namespace, tool: str):
    """The Target of a parsed command line; a bad --target exits with the one message."""
    import torch

    from speedlight import results, target

    device = torch.device(args.device)
    driver = results.environment(device).get("driver") if device.type == "cuda" else None
    try:
        return target.resolve(args.target, args.sku, device, driver)
    except target.TargetError as e:
        raise SystemExit(f"speedlight {tool}: {e}")


def add_dtypes(p: argparse.ArgumentParser, default: str, *, plural: bool = True,
               help_default: str | None = None) -> None:
    """--dtypes (a comma-separated list) or --dtype (one)."""
    shown = help_default or default
    if plural:
        p.add_argument("--dtypes", default=default,
                       help=f"comma-separated: fp32,fp16,bf16 (default {shown})")
    else:
        p.add_argument("--dtype", default=default, help=f"fp32, fp16 or bf16 (default {shown})")


def add_model(p: argparse.ArgumentParser) -> None:
    """--model and its shape: batch, seq, size, layers, seed."""
    p.add_argument("--model", default=None, metavar="NAME|config.json|module:callable",
                   help="default: a small Llama-style model (random weights, no download); a name "
                        "from speedlight.shapes.MODELS (llama-3-8b, gemma-2-9b, ...); a Hugging "
                        "Face config.json; or module:callable returning (model, inputs[, loss_fn])")
    p.add_argument("--batch", type=int, default=2, help="sequences per step (default 2)")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128)")
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on a GPU, "
                                                 "fp32 on a CPU); callables keep their own")
    p.add_argument("--size", choices=("small", "full"), default=None,
                   help="for a MODELS name: scaled down, or its real widths and depth (default: "
                        "full on a GPU, small on a CPU)")
    p.add_argument("--layers", type=int, default=None, help="decoder layers to build (override)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights and inputs (default 0)")


def add_mode(p: argparse.ArgumentParser, *, train: bool) -> None:
    """--train / --infer: one flag that either turns on or off; the last one given wins."""
    p.add_argument("--train", dest="train", action="store_true", default=train,
                   help="forward + backward + AdamW step" + (" (the default)" if train else ""))
    p.add_argument("--infer", dest="train", action="store_false",
                   help="forward only, under inference_mode" + ("" if train else " (the default)"))


def add_steps(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help=f"steps before measuring (default {WARMUP})")
    p.add_argument("--steps", type=int, default=STEPS,
                   help=f"clean steps timed, then steps recorded (default {STEPS} each)")


def add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="a Python file defining SPEC or SPECS (your own op); repeatable")
    p.add_argument("--only-spec", action="store_true",
                   help="only the ops of --spec files, not the built-in ones")


def add_model_run(p: argparse.ArgumentParser, *, train: bool) -> None:
    """Everything a run of a model takes (profile and report): the model and its shape,
    train or infer, the target, warm-up and steps, and spec files of a team's own ops."""
    add_model(p)
    add_mode(p, train=train)
    add_target(p)
    add_steps(p)
    add_spec(p)


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_seeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=_at_least_one, default=2,
                   help="inputs drawn from this many seeds per verified case (default 2)")


def add_out(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    p.add_argument("--out", default=default, help=what)


def add_ray(p: argparse.ArgumentParser) -> None:
    """--ray [auto|ADDRESS], --ray-cpus, --ray-gpu and --ray-timeout, for every sub-command
    that sweeps cases (speedlight.cluster runs the sweep)."""
    from speedlight.cluster import CONNECT_TIMEOUT_S

    p.add_argument("--ray", nargs="?", const="auto", default=None, metavar="auto|ADDRESS",
                   help="spread the cases over a Ray cluster, one whole GPU per task: 'auto' "
                        "(the default when the flag is given alone) joins the cluster started "
                        "on this machine with `ray start` (or RAY_ADDRESS), else starts a local "
                        "one; ADDRESS (HEAD:6379) joins that cluster")
    # --ray-cpus and --ray-timeout default to None, so that giving either without --ray is
    # refused whatever its value; ray_sweep puts in the defaults
    p.add_argument("--ray-cpus", type=int, default=None, metavar="N",
                   help="with --ray: CPUs per task (default 1); on a cluster without GPUs the "
                        "tasks run the Triton interpreter on N CPUs each")
    p.add_argument("--ray-gpu", default=None, metavar="MODEL[,MODEL...]|each",
                   help="with --ray: run every case on a GPU of each model named (Ray's "
                        "accelerator types: H100, A100...), or 'each' model the cluster has; "
                        "default: once, on any free GPU")
    p.add_argument("--ray-timeout", type=float, default=None, metavar="SECONDS",
                   help=f"with --ray: give up (exit 1) when no Ray cluster answers at the "
                        f"address, or a local one has not started, within SECONDS (default "
                        f"{CONNECT_TIMEOUT_S:g})")


def ray_sweep(args: argparse.Namespace, tool: str):
    """The cluster.RaySweep the --ray flags ask for (None without --ray), checked before any
    work: SystemExit naming the flag. A --ray-* flag given without --ray is refused,
    whatever its value."""
    from speedlight.cluster import CONNECT_TIMEOUT_S, RaySweep

    if args.ray is None:
        given = [f for f, v in (("--ray-cpus", args.ray_cpus), ("--ray-gpu", args.ray_gpu),
                                ("--ray-timeout", args.ray_timeout)) if v is not None]
        if given:
            raise SystemExit(f"speedlight {tool}: {' and '.join(given)} only apply with --ray")
        return None
    if args.ray_cpus is not None and args.ray_cpus < 1:
        raise SystemExit(f"speedlight {tool}: --ray-cpus must be at least 1, got {args.ray_cpus}")
    if args.ray_timeout is not None and not 0 < args.ray_timeout < float("inf"):
        raise SystemExit(f"speedlight {tool}: --ray-timeout must be a number of seconds > 0, "
                         f"got {args.ray_timeout:g}")
    return RaySweep(address=args.ray, cpus=1 if args.ray_cpus is None else args.ray_cpus,
                    gpu_models=args.ray_gpu,
                    timeout_s=CONNECT_TIMEOUT_S if args.ray_timeout is None else args.ray_timeout,
                    device=getattr(args, "requested_device", args.device))
