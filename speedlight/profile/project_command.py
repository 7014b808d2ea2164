"""`speedlight profile --project`: the real-size step projected onto one GPU or several."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ProjectionRequest:
    """What a projection projects: the model (as `--model` names it) and its step, built
    on fake tensors at its real size (`size="small"`: the scaled-down one), the training
    recipe, how many rows each table shows, and the comparisons that ride along: across
    `targets` (SKUs, comma-separated; with `shard`, the memory per GPU sharded over that
    many), one projection per value of each `vary` ("FIELD=V1,V2"), and the same model
    with speedlight's ops (`with_patch`, when a patch function is given), its ops' times
    predicted from their kernels (`predict`, when a predictor is given)."""

    model: str | None = None
    batch: int = 1
    seq: int = 4096
    train: bool = False
    dtype: str | None = None
    size: str | None = None  # None and "full": the real size
    layers: int | None = None
    seed: int = 0
    top: int = 15
    recipe: str | None = None
    targets: str | None = None
    shard: int | None = None
    vary: tuple[str, ...] = ()
    with_patch: bool = True
    predict: bool = False


def projected_profile(request: ProjectionRequest, tgt=None, *, patch=None,
                      predictor=None) -> dict:
    """Build on fake tensors, record the step, analyze it on the target (`tgt`, a
    speedlight.target.Target; None: the first of `request.targets`, else the default);
    with targets and vary the comparisons ride along in the same document. With `patch`
    (speedlight.patch, handed in by the CLI or the report) the same model with speedlight's
    ops rides along too, and with `predictor` (inspect's) its ops' predicted times."""
    from speedlight import target as target_mod
    from speedlight.profile import compare, project, roofline
    from speedlight.spec import parse_dtype

    r, train = request, bool(request.train)
    recipe_name = r.recipe or project.DEFAULT_RECIPE
    if recipe_name not in project.RECIPES:
        raise ValueError(f"--recipe {recipe_name!r}: expected one of {', '.join(project.RECIPES)}")
    recipe = project.RECIPES[recipe_name]
    if r.shard is not None and r.shard < 1:
        raise ValueError(f"--shard must be at least 1, got {r.shard}")
    sweeps = compare.parse_vary(list(r.vary) or None)
    keys = [k.strip() for k in (r.targets or "").split(",") if k.strip()]
    if r.targets is not None and not keys:
        raise ValueError(f"--targets {r.targets!r} names no GPU: give SKUs separated by commas "
                         f"(e.g. --targets h100-sxm,h200)")
    if r.shard is not None and not keys:
        raise ValueError("--shard N gives the memory per GPU in the comparison across --targets: "
                         "name the GPUs too (e.g. --targets h200 --shard 8)")
    for k in keys:
        target_mod.resolve(k)  # an unknown GPU fails before any work
    if tgt is None:
        tgt = target_mod.resolve(keys[0] if keys else None)
    target, why = roofline.with_roof(tgt)
    primary = target.sku.key
    dtype = parse_dtype(r.dtype) if r.dtype else None
    notes = []
    if r.size == "small":
        notes.append("--size small projected: the scaled-down model, on fake tensors")
    mode = project.fake_mode()
    w = _workload(r, recipe, dtype, mode)
    pj = project.project_step(w, train=train, recipe=recipe,
                              capability=target.compute_capability, mode=mode)
    if train:
        notes.append(f"recipe {recipe.name}: {recipe.text}")
    if why:
        notes.append(why)
    doc = project.projected_document(w, pj, target, train=train, batch=r.batch,
                                     seq=r.seq, seed=r.seed, top=r.top, notes=notes)
    patched = None
    if patch is not None and r.with_patch:
        patched = _patched(r, recipe, dtype, target, patch)
        if patched is not None:
            doc["with_speedlight"] = compare.with_speedlight(pj, patched[1], target, patched[0])
            if r.predict and predictor is not None:
                doc["with_speedlight"]["predicted"] = predicted_ops(patched[1], target,
                                                                    predictor)
    if keys or r.shard:
        doc["comparison"] = compare.per_target(pj, w.model, keys or [primary], shard=r.shard,
                                               train=train, tokens=r.batch * r.seq,
                                               patched=patched[1] if patched else None)
    if sweeps:
        doc["variations"] = compare.vary(
            r.model, sweeps, base={"batch": r.batch, "seq": r.seq}, target=target,
            train=train, recipe=recipe, dtype=dtype, layers=r.layers, seed=r.seed)
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


def _workload(r: ProjectionRequest, recipe, dtype, mode):
    """The model built on fake tensors: at its real size, or scaled down (size "small")."""
    from speedlight.profile import project
    from speedlight.workloads import models

    if r.size != "small":
        return project.build_workload(r.model, batch=r.batch, seq=r.seq, train=r.train,
                                      recipe=recipe, dtype=dtype, layers=r.layers, seed=r.seed,
                                      overrides=None, mode=mode)
    with mode:
        return models.build(r.model, batch=r.batch, seq=r.seq, train=r.train,
                            dtype=recipe.params if r.train else (dtype or torch.bfloat16),
                            device=torch.device("cpu"), size="small", layers=r.layers,
                            seed=r.seed)


def _patched(r: ProjectionRequest, recipe, dtype, target, patch):
    """(patch report text, projection) of the same model with speedlight's ops swapped in
    by `patch`, or None for a model speedlight.patch does not know."""
    import warnings

    from speedlight.profile import project

    mode = project.fake_mode()
    w = _workload(r, recipe, dtype, mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = patch(w.model)
        except (TypeError, ValueError):  # not a model speedlight.patch knows
            return None
    if not report.patched:
        return None
    return str(report), project.project_step(w, train=r.train, recipe=recipe,
                                             capability=target.compute_capability, mode=mode)
