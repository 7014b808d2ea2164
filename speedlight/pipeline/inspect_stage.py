"""The inspect stage of `speedlight report`: the kernels each op launches at the model's
shapes, compiled for the target GPU (no GPU needed), with their resources and findings."""

from __future__ import annotations

import torch


def _widths(counter: dict) -> str:
    return " ".join(f"{w}-bit x{n}" for w, n in sorted(counter.items(), key=lambda kv: -int(kv[0])
                                                        if str(kv[0]).isdigit() else 0)) or "-"


def inspect_ops(specs, cases: dict, *, target, device: torch.device) -> dict:
    """inspect's own library call (speedlight.inspect.run.inspect_cases) on each op's
    cases for `target` (a speedlight.target.Target), summarised for the report page."""
    from speedlight.inspect.run import inspect_cases

    items = [(s, c) for s in specs for c in cases[s.name]]
    reports = inspect_cases(items, target, device=device, mode="auto")
    kernels, raw = [], []
    for r in reports:
        ratios = {k: d.ratio for d in r.directions for k in d.kernels}
        raw.append({"op": r.op, "case": r.case.id, "note": r.note, "skipped": r.skipped,
                    "error": r.error, "kernels": [k.to_json() for k in r.kernels],
                    "bytes": [d.to_json() for d in r.directions],
                    "findings": [f.to_json() for f in r.findings]})
        for k in r.kernels:
            j = k.to_json()
            kernels.append({
                "op": r.op, "case": r.case.id, "kernel": k.launch.kernel,
                "direction": k.launch.direction, "registers": j.get("registers"),
                "spill_bytes": j.get("spill_bytes", j.get("spill_stores") or 0),  # spilled
                "predicted_us": (j.get("predicted") or {}).get("us"),
                "predicted_bound": (j.get("predicted") or {}).get("bound"),
                "occupancy": 100 * j["occupancy"]["fraction"] if j.get("occupancy") else None,
                "loads": _widths(j.get("sass", {}).get("global_loads", {})),
                "stores": _widths(j.get("sass", {}).get("global_stores", {})),
                "bytes_ratio": ratios.get(k.launch.kernel),
                "findings": [f["text"] for f in j.get("findings", [])],
                "error": j.get("error")})
    return {"target": target.arch_name, "sku": target.sku.name, "sm_count": target.sku.sm_count,
            "note": r.note if reports else "", "kernels": kernels, "cases": raw}
