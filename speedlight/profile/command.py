"""`speedlight profile`: where a model's time and memory go, what bounds each op, what to fuse."""

from __future__ import annotations

import argparse
import re
import uuid

from speedlight import arguments


def configure(p: argparse.ArgumentParser) -> None:
    arguments.add_model_run(p, train=False)
    p.add_argument("--top", type=int, default=15, help="rows per table (default 15)")
    arguments.add_out(p, "speedlight-results", "folder for the JSON and HTML")
    p.add_argument("--no-html", action="store_true", help="write the JSON only")
    p.set_defaults(batch=None, seq=None)  # 2 x 128 measured, 1 x 4096 projected
    proj = p.add_argument_group("projection (a real-size step on fake tensors, no GPU needed)")
    proj.add_argument("--project", action="store_true",
                      help="project the step instead of running it: the model built on fake tensors "
                           "at --size (default full), every op's floor on the target, batch 1 x seq "
                           "4096 unless given; the default for --size full on a machine without a GPU")
    proj.add_argument("--recipe", default=None,
                      help="training recipe of a projection: bf16 (default: bf16 weights and "
                           "gradients, fp32 AdamW moments), bf16-master, bf16-pure, fp32")
    proj.add_argument("--targets", default=None, metavar="GPU,GPU,...",
                      help="compare the projected step across GPUs, e.g. h100-sxm,h200,b200")
    proj.add_argument("--shard", type=int, default=None, metavar="N",
                      help="with --targets: memory per GPU with parameters, gradients and optimizer "
                           "state sharded over N GPUs (FSDP / ZeRO-3)")
    proj.add_argument("--no-patch", action="store_true",
                      help="skip the second projection with speedlight's ops patched in")
    proj.add_argument("--predict", action="store_true",
                      help="beside the floors of the projection with speedlight's ops, each op's "
                           "time predicted from its kernels compiled for the target (inspect's "
                           "model; compiles them, no GPU needed)")
    proj.add_argument("--vary", action="append", default=None, metavar="FIELD=V1,V2",
                      help="project once per value (batch, seq or a Hugging Face config field, "
                           "e.g. seq=2048,8192 or num_key_value_heads=8,2); repeatable")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "model"


def make_step(workload, optimizer, train: bool):
    """One step: forward (and backward + optimizer step), announcing each part."""
    import torch

    def step(phase):
        if not train:
            with torch.inference_mode():
                phase("forward")
                workload.call()
            return
        phase("forward")
        out = workload.call()
        loss = workload.loss_fn(out)
        del out  # a training loop keeps the loss, not the logits
        phase("backward")
        loss.backward()
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def projecting(args: argparse.Namespace) -> bool:
    """--project, a comparison, or --size full on a machine without a GPU (where a real-size
    step cannot run)."""
    wants = args.project or args.targets or args.vary
    return bool(wants or (args.size == "full" and args.device == "cpu"))


def projection_of(args: argparse.Namespace):
    """The project_command.ProjectionRequest of `speedlight profile --project`'s flags."""
    from speedlight.profile.project_command import ProjectionRequest

    return ProjectionRequest(
        model=args.model, batch=args.batch, seq=args.seq, train=args.train, dtype=args.dtype,
        size=args.size, layers=args.layers, seed=args.seed, top=args.top, recipe=args.recipe,
        targets=args.targets, shard=args.shard, vary=tuple(args.vary or ()),
        with_patch=not args.no_patch, predict=args.predict)


def _default_size(args: argparse.Namespace, *, batch: int, seq: int) -> None:
    args.batch = batch if args.batch is None else args.batch
    args.seq = seq if args.seq is None else args.seq
    if args.batch < 1 or args.seq < 1:
        raise ValueError(f"--batch and --seq must be at least 1, got {args.batch} and {args.seq}")


def profile(args: argparse.Namespace, tgt, *, patch=None, predictor=None) -> dict:
    """Build, capture, analyze: the profile's JSON document, floors on Target `tgt`. A
    projection compares with speedlight's ops by `patch` and predicts their times by
    `predictor` (both handed in by the CLI)."""
    import torch

    from speedlight import registry
    from speedlight.runtime import model_defaults
    from speedlight.spec import parse_dtype
    from speedlight.workloads import models

    if projecting(args):
        from speedlight.profile.project_command import projected_profile
        _default_size(args, batch=1, seq=4096)
        # with --targets and no --target or --sku, the first of --targets
        named = args.target is not None or args.sku is not None or not args.targets
        return projected_profile(projection_of(args), tgt if named else None, patch=patch,
                                 predictor=predictor)
    for flag, value in (("--shard", args.shard), ("--recipe", args.recipe)):
        if value is not None:
            raise ValueError(f"{flag} applies to a projected step: add --project")
    _default_size(args, batch=2, seq=128)
    device = torch.device(args.device)
    train = bool(args.train)
    specs = registry.select(None, args.spec, include_builtin=not args.only_spec)
    check_steps(args.warmup, args.steps, train)
    default_dtype, default_size = model_defaults(device)
    dtype = parse_dtype(args.dtype) if args.dtype else default_dtype
    size = args.size or default_size
    notes = []
    if size == "full" and device.type == "cpu" and args.model:
        notes.append("full-size model on a CPU: slow and memory-hungry; the GPU is where its "
                     "times mean something")
    w = models.build(args.model, batch=args.batch, seq=args.seq, train=train, dtype=dtype,
                     device=device, size=size, layers=args.layers, seed=args.seed)
    return profile_workload(w, device=device, train=train, target=tgt, warmup=args.warmup,
                            steps=args.steps, top=args.top, seed=args.seed,
                            batch=args.batch, seq=args.seq, notes=notes, specs=specs)


def check_steps(warmup: int, steps: int, train: bool) -> None:
    if warmup < (1 if train else 0) or steps < 1:
        raise ValueError("--steps must be at least 1, and --warmup at least 1 with --train "
                         "(the first step creates the optimizer state)")


def profile_workload(w, *, device, train: bool, target, warmup: int = arguments.WARMUP,
                     steps: int = arguments.STEPS, top: int = 15, seed: int = 0,
                     batch: int | None = None, seq: int | None = None,
                     notes: list[str] | None = None, specs=None) -> dict:
    """Capture and analyze an already-built Workload (models.Workload): the JSON document,
    floors on `target` (a speedlight.target.Target), advice naming the ops of `specs`
    (default: the built-in ones). `speedlight report` profiles the same model before and
    after patching through this."""
    import torch

    from speedlight import results
    from speedlight.profile import advice, analyze, capture, roofline, schema
    from speedlight.spec import dtype_name

    device = torch.device(device)
    check_steps(warmup, steps, train)
    env = results.environment(device)
    tgt, why = roofline.with_roof(target)
    notes = list(notes or []) + w.notes + ([why] if why else [])
    optimizer = torch.optim.AdamW(w.model.parameters(), lr=1e-4) if train else None
    cap = capture.capture(w.model, make_step(w, optimizer, train), device=device,
                          warmup=warmup, steps=steps, train=train,
                          optimizer=optimizer, inputs=w.inputs)
    notes += cap.notes
    result = analyze.analyze(cap, tgt, top=max(top, 25))
    model_dtype = next((p.dtype for p in w.model.parameters()), torch.float32)
    run = {"id": uuid.uuid4().hex[:12], "model": w.name, "mode": "train" if train else "infer",
           "batch": batch, "seq": seq, "dtype": dtype_name(model_dtype),
           "warmup": warmup, "steps": steps, "device": device.type, "seed": seed}
    measured = {"time": device.type,
                "floors": "on the measured GPU" if tgt.in_use else "projected",
                "note": roofline.note(tgt, device)}
    return schema.document(
        environment=env, run=run, model=dict(w.config, **{"class": type(w.model).__name__}),
        target=dict(tgt.to_json(), launch_s=roofline.LAUNCH_S), measured=measured, analysis=result, memory=cap.memory,
        advice=advice.advise(result["rows"], cap.calls, tgt.roof, specs=specs), notes=notes)


def run(args: argparse.Namespace, *, patch=None, predictor=None) -> int:
    """`speedlight profile`; `patch` and `predictor` (speedlight.patch and inspect's
    predicted time, handed in by the CLI) serve --project's comparison and --predict."""
    from speedlight import results
    from speedlight.profile import display
    from speedlight.workloads import models

    tgt = arguments.resolve_target(args, "profile")
    if args.top < 0:
        raise SystemExit(f"speedlight profile: --top must be at least 0, got {args.top}")
    try:
        out = results.writable_folder(args.out)
    except ValueError as e:
        raise SystemExit(f"speedlight profile: --out: {e}")
    console = results.make_console(width=180)
    try:
        import transformers
        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    try:
        doc = profile(args, tgt, patch=patch, predictor=predictor)
    except (models.ModelError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"speedlight profile: {e}")
    display.print_profile(doc, console, top=args.top)
    stem = f"profile-{_slug(doc['run']['model'])}-{doc['run']['mode']}"
    if doc["measured"]["time"] == "projected":
        stem += "-projected"
    json_path = results.write_json(out / f"{stem}.json", doc)
    written = [str(json_path)]
    if not args.no_html:
        from speedlight.profile import html
        try:
            written.append(str(html.write_page(doc, out / f"{stem}.html")))
        except RuntimeError as e:
            console.print(f"[yellow]no HTML page[/]: {e}")
    console.print("wrote " + ", ".join(written))
    return 0
