"""`speedlight profile --project`: the real-size step projected onto one GPU or several."""

from __future__ import annotations

import argparse

import torch


def projected_profile(args: argparse.Namespace, tgt=None, *, patch=None) -> dict:
    """Build on fake tensors, record the step, analyze it on the target (`tgt`, the resolved
    --target; without one, the first of --targets); with --targets and --vary the
    comparisons ride along in the same document. With `patch` (speedlight.patch, handed in
    by the CLI or the report) the same model with speedlight's ops rides along too."""
    from speedlight import target as target_mod
    from speedlight.profile import compare, project, roofline
    from speedlight.spec import parse_dtype

    train = bool(args.train)
    recipe_name = getattr(args, "recipe", None) or project.DEFAULT_RECIPE
    if recipe_name not in project.RECIPES:
        raise ValueError(f"--recipe {recipe_name!r}: expected one of {', '.join(project.RECIPES)}")
    recipe = project.RECIPES[recipe_name]
    if getattr(args, "shard", None) is not None and args.shard < 1:
        raise ValueError(f"--shard must be at least 1, got {args.shard}")
    sweeps = compare.parse_vary(getattr(args, "vary", None))
    targets = getattr(args, "targets", None)
    keys = [k.strip() for k in (targets or "").split(",") if k.strip()]
    if targets is not None and not keys:
        raise ValueError(f"--targets {targets!r} names no GPU: give SKUs separated by commas "
                         f"(e.g. --targets h100-sxm,h200)")
    if getattr(args, "shard", None) is not None and not keys:
        raise ValueError("--shard N gives the memory per GPU in the comparison across --targets: "
                         "name the GPUs too (e.g. --targets h200 --shard 8)")
    for k in keys:
        target_mod.resolve(k)  # an unknown GPU fails before any work
    if tgt is None or (args.target is None and getattr(args, "sku", None) is None and keys):
        tgt = target_mod.resolve(args.target or (keys[0] if keys else None))
    target, why = roofline.with_roof(tgt)
    primary = target.sku.key
    dtype = parse_dtype(args.dtype) if args.dtype else None
    notes = []
    if args.size == "small":
        notes.append("--size small projected: the scaled-down model, on fake tensors")
    mode = project.fake_mode()
    w = project.build_workload(args.model, batch=args.batch, seq=args.seq, train=train,
                               recipe=recipe, dtype=dtype, layers=args.layers, seed=args.seed,
                               overrides=None, mode=mode) if args.size != "small" else \
        _small(args, train, recipe, dtype, mode)
    pj = project.project_step(w, train=train, recipe=recipe,
                              capability=target.compute_capability, mode=mode)
    if train:
        notes.append(f"recipe {recipe.name}: {recipe.text}")
    if why:
        notes.append(why)
    doc = project.projected_document(w, pj, target, train=train, batch=args.batch,
                                     seq=args.seq, seed=args.seed, top=args.top, notes=notes)
    patched = None
    if patch is not None and not getattr(args, "no_patch", False):
        patched = _patched(args, train, recipe, dtype, target, patch)
        if patched is not None:
            doc["with_speedlight"] = compare.with_speedlight(pj, patched[1], target, patched[0])
            predictor = getattr(args, "predictor", None)
            if getattr(args, "predict", False) and predictor is not None:
                doc["with_speedlight"]["predicted"] = predicted_ops(patched[1], target,
                                                                    predictor)
    if keys or getattr(args, "shard", None):
        doc["comparison"] = compare.per_target(pj, w.model, keys or [primary], shard=args.shard,
                                               train=train, tokens=args.batch * args.seq,
                                               patched=patched[1] if patched else None)
    if sweeps:
        doc["variations"] = compare.vary(
            args.model, sweeps, base={"batch": args.batch, "seq": args.seq}, target=target,
            train=train, recipe=recipe, dtype=dtype, layers=args.layers, seed=args.seed)
    return doc


def predicted_ops(pj, target, predictor) -> list[dict]:
    """Each speedlight op of a projected step (one entry per op, case and direction) with
    its projected floor and the time `predictor` (inspect's, handed in by the CLI) predicts
    from its kernels compiled for the target, both per call and over the step's calls."""
    from speedlight import registry
    from speedlight import target as target_mod
    from speedlight.profile import roofline
    from speedlight.profile.analyze import op_dtype

    by_name = {s.name: s for s in registry.builtin_specs()}
    groups: dict = {}
    for rec in pj.capture.ops:
        c = rec.cost
        if c is None or c.case is None or c.op_name not in by_name:
            continue
        direction = "bwd" if rec.name.endswith("_bwd") else "fwd"
        entry = groups.setdefault((c.op_name, c.case.id, direction),
                                  {"case": c.case, "calls": 0, "floor_s": 0.0})
        entry["calls"] += 1
        key = target_mod.peak_key(op_dtype(rec), tensor_core=c.tensor_core)
        entry["floor_s"] = roofline.floor_seconds(c, key, target.roof)
    out, done = [], {}
    for (op, case_id, direction), e in groups.items():
        if (op, case_id) not in done:
            done[(op, case_id)] = predictor(by_name[op], e["case"], target)
        got = done[(op, case_id)].get(direction) or {}
        row = {"op": op, "case_id": case_id, "direction": direction, "calls": e["calls"],
               "floor_us": round(e["floor_s"] * 1e6, 3), "predicted": True,
               "sku": target.sku.name}
        if "us" in got and "why" not in got:
            row.update(predicted_us=got["us"], bound=got["bound"],
                       step_predicted_us=round(got["us"] * e["calls"], 3))
        else:
            row["why"] = got.get("why") or done[(op, case_id)].get("why") or "no kernel"
        out.append(row)
    return out


def _small(args, train, recipe, dtype, mode):
    from speedlight.workloads import models

    with mode:
        return models.build(args.model, batch=args.batch, seq=args.seq, train=train,
                            dtype=recipe.params if train else (dtype or torch.bfloat16),
                            device=torch.device("cpu"), size="small", layers=args.layers,
                            seed=args.seed)


def _patched(args, train, recipe, dtype, target, patch):
    """(patch report text, projection) of the same model with speedlight's ops swapped in
    by `patch`, or None for a model speedlight.patch does not know."""
    import warnings

    from speedlight.profile import project

    mode = project.fake_mode()
    w = project.build_workload(args.model, batch=args.batch, seq=args.seq, train=train,
                               recipe=recipe, dtype=dtype, layers=args.layers, seed=args.seed,
                               overrides=None, mode=mode) if args.size != "small" else \
        _small(args, train, recipe, dtype, mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = patch(w.model)
        except (TypeError, ValueError):  # not a model speedlight.patch knows
            return None
    if not report.patched:
        return None
    return str(report), project.project_step(w, train=train, recipe=recipe,
                                             capability=target.compute_capability, mode=mode)
