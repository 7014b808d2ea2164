"""The same projected step on several GPUs (`--targets`), and across design choices
(`--vary seq=2048,8192 --vary num_key_value_heads=8,2`): tables and charts.

Per GPU: the sum of the op floors, tokens per second at that floor, the floor split by
bound, and whether the step's memory fits the GPU. With `--shard N` the memory per GPU is
given as FSDP / ZeRO-3 keeps it: parameters, gradients and optimizer state divided over N
GPUs, activations and temporaries whole (each GPU runs its own micro-batch), plus the
largest layer's parameters and gradients gathered in full while it runs.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

from speedlight import target as target_mod
from speedlight.profile import project

STATE = ("parameters", "gradients", "optimizer_state")
SHARD_NOTE = ("FSDP / ZeRO-3 per GPU = (parameters + gradients + optimizer state at the peak) / N "
              "+ activations and temporaries at the peak (each GPU its own micro-batch) + the "
              "largest layer's parameters and gradients gathered in full")


def largest_layer_bytes(model: torch.nn.Module) -> tuple[str, int]:
    """(name, bytes) of the largest unit FSDP would wrap: a numbered block (layers.3) or,
    outside the blocks, a module holding parameters."""
    groups: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        m = re.match(r"(.*?\.\d+)\.", name)
        key = m.group(1) if m else name.rpartition(".")[0]
        groups[key] += p.numel() * p.element_size()
    if not groups:
        return "", 0
    key = max(groups, key=groups.get)
    return key, groups[key]


def sharded_bytes(memory: dict, n: int, layer_bytes: int, train: bool) -> int:
    at = memory["at_peak"]
    state = sum(at.get(k, 0) for k in STATE)
    gathered = layer_bytes * (2 if train else 1)
    return memory["peak_bytes"] - state + state // n + gathered


def with_speedlight(pj: project.Projection, patched: project.Projection,
                    target: target_mod.Target, report: str) -> dict:
    """The same step with speedlight's ops patched in, on the primary target."""
    before = project.analysis(pj, target, top=1)["summary"]
    after = project.analysis(patched, target, top=1)
    s = after["summary"]
    return {"patch": report, "floor_s": s["floor_s"], "floor_with_launch_s": s["floor_with_launch_s"],
            "ops": s["ops"], "kernel_ops": s["launch"]["kernel_ops"],
            "peak_bytes": patched.capture.memory["peak_bytes"],
            "activations_bytes": patched.capture.memory["activations_bytes"],
            "saved_s": before["floor_s"] - s["floor_s"],
            "saved_with_launch_s": before["floor_with_launch_s"] - s["floor_with_launch_s"],
            "saved_bytes": pj.capture.memory["peak_bytes"] - patched.capture.memory["peak_bytes"],
            "by_type": [{k: g[k] for k in ("key", "calls", "floor_s", "bound")} for g in after["by_type"][:12]],
            "expert_block": project.expert_block(after, pj.experts_classes),
            "label": f"projected floors on {target.sku.name} with speedlight's ops patched in"}


def per_target(pj: project.Projection, model, keys: list[str], *, shard: int | None,
               train: bool, tokens: int, patched: project.Projection | None = None) -> dict:
    """One row per GPU of the same projected step (and of it patched with speedlight's ops)."""
    if shard is not None and shard < 1:
        raise ValueError(f"--shard must be at least 1, got {shard}")
    layer, layer_bytes = largest_layer_bytes(model)
    rows = []
    mem = pj.capture.memory
    for key in keys:
        tgt = target_mod.resolve(key)
        result = project.analysis(pj, tgt, top=1)
        s = result["summary"]
        by_bound: dict[str, float] = defaultdict(float)
        for r in result["rows"]:
            if r["floor_s"]:
                by_bound[r["bound"]] += r["floor_s"]
        capacity = tgt.sku.memory_bytes
        row = {"target": tgt.sku.key, "name": tgt.sku.name, "roof_source": tgt.roof.source,
               "bandwidth": tgt.roof.bandwidth, "peak_flops": dict(tgt.roof.flops),
               "floor_s": s["floor_s"], "floor_with_launch_s": s["floor_with_launch_s"],
               "tokens_per_s": tokens / s["floor_s"] if s["floor_s"] else None,
               "floor_by_bound_s": dict(by_bound), "memory_bytes": capacity,
               "peak_bytes": mem["peak_bytes"], "fits": mem["peak_bytes"] <= capacity}
        if patched is not None:
            ps = project.analysis(patched, tgt, top=1)["summary"]
            row.update(patched_floor_s=ps["floor_s"],
                       patched_tokens_per_s=tokens / ps["floor_s"] if ps["floor_s"] else None,
                       patched_peak_bytes=patched.capture.memory["peak_bytes"])
        if shard:
            per_gpu = sharded_bytes(mem, shard, layer_bytes, train)
            row.update(shard=shard, sharded_peak_bytes=per_gpu, sharded_fits=per_gpu <= capacity)
        rows.append(row)
    return {"rows": rows, "shard": shard, "shard_note": SHARD_NOTE if shard else None,
            "largest_layer": layer, "largest_layer_bytes": layer_bytes,
            "label": "projected floors (sum of per-op floors), not step times"}


# ---------------------------------------------------------------------------------------
# --vary
# ---------------------------------------------------------------------------------------

RUN_FIELDS = ("batch", "seq")


def parse_vary(items: list[str] | None) -> list[tuple[str, list]]:
    """--vary FIELD=V1,V2,... (batch, seq or a Hugging Face config field) -> [(field, values)]."""
    out = []
    for item in items or []:
        field, sep, values = item.partition("=")
        if not sep or not field or not values:
            raise ValueError(f"--vary {item!r}: expected FIELD=V1,V2,... (batch, seq or a "
                             f"Hugging Face config field)")
        field = field.strip()
        parsed = [_value(v.strip()) for v in values.split(",") if v.strip()]
        if field in RUN_FIELDS and not all(isinstance(v, int) and not isinstance(v, bool)
                                           and v >= 1 for v in parsed):
            raise ValueError(f"--vary {item!r}: {field} takes whole numbers of at least 1")
        out.append((field, parsed))
    return out


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def family_split(rows: list[dict]) -> dict[str, float]:
    """Floor by cost family (matmul, attention, pointwise, ...), optimizer ops apart."""
    split: dict[str, float] = defaultdict(float)
    for r in rows:
        if r["floor_s"]:
            key = "optimizer" if r["phase"] == "optimizer" else (r["formula"] or "unknown")
            split[key] += r["floor_s"]
    return dict(split)


def vary(spec: str | None, sweeps: list[tuple[str, list]], *, base: dict, target: target_mod.Target,
         train: bool, recipe: project.Recipe, dtype, layers, seed: int, progress=None) -> dict:
    """Project the step once per value of each swept field, the others at their base."""
    lines = []
    for field, values in sweeps:
        for value in values:
            run = dict(base)
            overrides = {}
            if field in RUN_FIELDS:
                run[field] = int(value)
            else:
                overrides[field] = value
            mode = project.fake_mode()
            w = project.build_workload(spec, batch=run["batch"], seq=run["seq"], train=train,
                                       recipe=recipe, dtype=dtype, layers=layers, seed=seed,
                                       overrides=overrides, mode=mode)
            pj = project.project_step(w, train=train, recipe=recipe,
                                      capability=target.compute_capability, mode=mode)
            result = project.analysis(pj, target, top=1)
            s = result["summary"]
            tokens = run["batch"] * run["seq"]
            lines.append({"field": field, "value": value, "batch": run["batch"], "seq": run["seq"],
                          "parameters": w.config.get("parameters"),
                          "floor_s": s["floor_s"], "floor_with_launch_s": s["floor_with_launch_s"],
                          "tokens_per_s": tokens / s["floor_s"] if s["floor_s"] else None,
                          "flops": s["flops"], "split_s": family_split(result["rows"]),
                          "peak_bytes": pj.capture.memory["peak_bytes"],
                          "fits": pj.capture.memory["peak_bytes"] <= target.sku.memory_bytes})
            if progress:
                progress(lines[-1])
    return {"target": target.sku.key, "base": base, "fields": [f for f, _ in sweeps],
            "rows": lines, "label": f"projected floors on {target.sku.name}, one field at a time"}
