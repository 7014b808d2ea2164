"""From a capture to the profile: one row per op with its cost, floor and bound, and the
aggregates by op type, module, module class, phase and bound."""

from __future__ import annotations

import statistics
from collections import defaultdict

from speedlight.profile import roofline
from speedlight.profile.capture import OpRecord, StepCapture
from speedlight.target import Target, peak_key

_FLOAT_DTYPES = ("fp32", "fp16", "bf16", "fp64")


def op_dtype(rec: OpRecord) -> str | None:
    for t in rec.inputs + rec.outputs:
        if t["dtype"] in _FLOAT_DTYPES or t["dtype"].startswith("float8"):
            return t["dtype"]
    return None


def place(module: str | None, phase: str) -> str:
    """Where an op ran, for grouping: the module path, or what ran it outside the model."""
    if module is not None:
        return module
    return {"optimizer": "(optimizer)", "backward": "(autograd engine)"}.get(phase, "(outside the model)")


def row(rec: OpRecord, target: Target, device: str) -> dict:
    cost = rec.cost
    key = peak_key(op_dtype(rec), tensor_core=cost.tensor_core) if cost else None
    floor = roofline.floor_seconds(cost, key, target.roof) if cost else None
    kernel_times = [d for _, d in rec.kernels] if device == "cuda" else None
    time = rec.time
    distance = None
    if target.in_use and floor and device == "cuda":
        distance = time / floor
    return {
        "index": rec.index, "op": rec.op, "name": rec.name, "phase": rec.phase,
        "module": rec.module, "module_class": rec.module_class, "place": place(rec.module, rec.phase),
        "call": rec.call, "grad_fn": rec.grad_fn, "fwd_index": rec.fwd_index,
        "inputs": rec.inputs, "outputs": rec.outputs, "scalars": rec.scalars,
        "producers": rec.producers,
        "formula": cost.formula if cost else None,
        "formula_detail": cost.detail if cost else (rec.cost_error or "no formula for this op"),
        "flops": cost.flops if cost else None, "bytes": cost.bytes if cost else None,
        "intensity": (cost.flops / cost.bytes) if cost and cost.bytes else None,
        "launches_kernel": cost.kernel if cost else None,
        "time_s": time, "time_samples_s": list(rec.times), "host_s": rec.host_time,
        "kernels": [{"name": n, "time_s": d} for n, d in rec.kernels],
        # launches per call, counted on the GPU (None when projected): its fixed cost
        "launches": len(rec.kernels) if device == "cuda" else None,
        "peak": key, "floor_s": floor,
        "bound": roofline.bound(cost, floor or 0.0, key, target.roof, kernel_times),
        "distance": distance, "saved_bytes": rec.saved_bytes,
    }


def _main_bound(time_by_bound: dict[str, float]) -> str:
    """The bound covering most of a group's time; views (none) only when nothing else ran."""
    kernels = {b: t for b, t in time_by_bound.items() if b != "none"}
    pool = kernels or time_by_bound
    return max(pool, key=lambda b: (pool[b], b))


def _group(rows: list[dict], key, distances: bool = False) -> list[dict]:
    """Rows grouped by key(row), costliest first; with distances, time / floor per group
    (only meaningful when the times were measured on the target GPU)."""
    groups: dict = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    total = sum(r["time_s"] for r in rows) or 1.0
    out = []
    for k, rs in groups.items():
        counted = [r for r in rs if r["flops"] is not None]
        bounds: dict[str, float] = defaultdict(float)
        for r in rs:
            bounds[r["bound"]] += r["time_s"]
        t = sum(r["time_s"] for r in rs)
        floor = sum(r["floor_s"] for r in counted)
        out.append({
            "key": k, "calls": len(rs), "time_s": t, "time_share": t / total,
            "flops": sum(r["flops"] for r in counted), "bytes": sum(r["bytes"] for r in counted),
            "floor_s": floor,
            "uncounted_calls": len(rs) - len(counted),
            "bound": _main_bound(bounds), "time_by_bound_s": dict(bounds),
            "distance": t / floor if distances and floor > 0 else None,
        })
    return sorted(out, key=lambda g: -g["time_s"])


def _shape_sig(r: dict) -> str:
    return " ".join("x".join(map(str, t["shape"])) or "scalar" for t in r["inputs"])


def top_op_groups(rows: list[dict], n: int) -> list[dict]:
    """The most expensive ops, identical calls (same op, input shapes and phase, as repeated
    layers make) grouped into one line."""
    groups: dict = defaultdict(list)
    for r in rows:
        groups[r["op"], _shape_sig(r), r["phase"]].append(r)
    out = []
    total = sum(r["time_s"] for r in rows) or 1.0
    for (op, sig, phase), rs in groups.items():
        t = sum(r["time_s"] for r in rs)
        first = rs[0]
        floors = [r["floor_s"] for r in rs if r["floor_s"] is not None]
        counted = [r for r in rs if r["flops"] is not None]
        out.append({
            "op": op, "name": first["name"], "phase": phase, "shapes": sig, "calls": len(rs),
            "time_s": t, "time_share": t / total, "floor_s": sum(floors) if floors else None,
            "bound": first["bound"], "formula": first["formula"],
            "flops": sum(r["flops"] for r in counted) if counted else None,
            "bytes": sum(r["bytes"] for r in counted) if counted else None,
            "place": first["place"], "places": len({r["place"] for r in rs}),
            "indices": [r["index"] for r in rs],
        })
    out.sort(key=lambda g: -g["time_s"])
    return out[:n]


def module_totals(rows: list[dict]) -> list[dict]:
    """Time of each module including its submodules (the module tree, by path)."""
    own: dict[str, float] = defaultdict(float)
    floors: dict[str, float] = defaultdict(float)
    classes: dict[str, str] = {}
    for r in rows:
        if r["module"] is None:
            continue
        own[r["module"]] += r["time_s"]
        floors[r["module"]] += r["floor_s"] or 0.0
        if r["module_class"]:
            classes[r["module"]] = r["module_class"]
    total: dict[str, float] = defaultdict(float)
    total_floor: dict[str, float] = defaultdict(float)
    for m, t in own.items():
        parts = m.split(".") if m else []
        for depth in range(len(parts) + 1):
            prefix = ".".join(parts[:depth])
            total[prefix] += t
            total_floor[prefix] += floors[m]
    return sorted(({"module": m, "module_class": classes.get(m), "depth": len(m.split(".")) if m else 0,
                    "time_s": t, "self_time_s": own.get(m, 0.0), "floor_s": total_floor[m]}
                   for m, t in total.items()), key=lambda g: g["module"])


def step_summary(rows: list[dict], cap: StepCapture, target: Target) -> dict:
    op_time = sum(r["time_s"] for r in rows)
    kernel_rows = [r for r in rows if r["launches_kernel"]]
    unknown = [r for r in rows if r["formula"] is None]
    unknown_time = sum(r["time_s"] for r in unknown)
    floor = sum(r["floor_s"] for r in kernel_rows)
    launch_floor = sum(max(r["floor_s"], roofline.launch_floor(r["launches"] or 1))
                       for r in kernel_rows)
    step = statistics.median(cap.step_times) if cap.step_times else None
    gpu = cap.gpu
    launch = {
        "kernel_ops": len(kernel_rows),
        "projected_overhead_s": launch_floor - floor,
        "measured_idle_s": gpu["idle_s"] if gpu else None,
        "measured_kernels": gpu["kernels"] if gpu else None,
        "note": ("GPU idle time between kernels in a clean step (CUDA graphs recover it)" if gpu
                 else f"projected: each kernel-launching op costs at least {roofline.LAUNCH_S * 1e6:.0f} µs "
                      f"of launch on {target.sku.name} in eager mode (CUDA graphs recover it)"),
    }
    by_bound: dict[str, float] = defaultdict(float)
    projected: dict[str, float] = defaultdict(float)
    for r in rows:
        by_bound[r["bound"]] += r["time_s"]
        if r["launches_kernel"]:
            projected[r["bound"]] += max(r["floor_s"], roofline.launch_floor(r["launches"] or 1))
    if gpu:
        by_bound["idle"] = gpu["idle_s"]  # between kernels, in a clean step: launch overhead
    return {
        "step_time_s": step, "step_time_samples_s": list(cap.step_times),
        "time_by_bound_s": dict(by_bound), "floor_by_bound_s": dict(projected),
        "op_time_s": op_time, "floor_s": floor, "floor_with_launch_s": launch_floor,
        "flops": sum(r["flops"] for r in rows if r["flops"] is not None),
        "bytes": sum(r["bytes"] for r in rows if r["bytes"] is not None),
        "ops": len(rows),
        "speed_of_light": (floor / step) if (target.in_use and step and cap.device == "cuda") else None,
        "uncounted": {"ops": len(unknown), "time_s": unknown_time,
                      "time_share": unknown_time / op_time if op_time else 0.0,
                      "names": sorted({r["op"] for r in unknown})},
        "launch": launch,
        "gpu": gpu,
    }


def analyze(cap: StepCapture, target: Target, top: int = 15) -> dict:
    rows = [row(r, target, cap.device) for r in cap.ops]
    d = target.in_use and cap.device == "cuda"
    return {
        "rows": rows,
        "summary": step_summary(rows, cap, target),
        "by_type": _group(rows, lambda r: r["op"], d),
        "by_module": _group(rows, lambda r: r["place"], d),
        "by_class": _group(rows, lambda r: r["module_class"] or r["place"], d),
        "by_phase": _group(rows, lambda r: r["phase"], d),
        "by_bound": _group(rows, lambda r: r["bound"], d),
        "module_tree": module_totals(rows),
        "top_ops": top_op_groups(rows, top),
    }
