"""Read a report folder's stage files into the one summary every view renders.

Every number the report shows is computed here from the stage files the pipeline wrote
(profile-before.json, patch.json, model-check.json, verify.jsonl, bench.jsonl,
inspect.json, profile-after.json, model-step.jsonl, profile-projected.json, plan.json,
manifest.json); nothing is measured or typed here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from speedlight.results import read_jsonl

MANIFEST = "manifest.json"


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _jsonl(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def _num(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if _num(v) and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _profile_summary(doc: dict | None) -> dict | None:
    if not doc:
        return None
    s, mem = doc["summary"], doc["memory"]
    return {"step_time_s": s.get("step_time_s"), "op_time_s": s.get("op_time_s"),
            "floor_s": s.get("floor_s"), "floor_with_launch_s": s.get("floor_with_launch_s"),
            "flops": s.get("flops"), "bytes": s.get("bytes"), "ops": s.get("ops"),
            "speed_of_light": s.get("speed_of_light"), "peak_bytes": mem.get("peak_bytes"),
            "allocator_peak_bytes": mem.get("allocator_peak_bytes"),
            "time_by_bound_s": s.get("time_by_bound_s", {}),
            "uncounted": s.get("uncounted", {})}


def _op_label(r: dict) -> str:
    """The op of a verify or bench row, with its implementation when it is not the op's
    first ("speedlight"): rms_norm (cuda, unverified)."""
    if r.get("implementation", "speedlight") == "speedlight":
        return r["op"]
    return f"{r['op']} ({r.get('impl')}{', unverified' if r.get('unverified') else ''})"


def _is_speedlight(r: dict) -> bool:
    name = r.get("implementation", "")
    return name == "speedlight" or name.startswith("speedlight-")


def _verify_table(rows: list[dict]) -> list[dict]:
    """One line per (op and implementation, case): the worst seed."""
    by: dict[tuple, dict] = {}
    rank = {"error": 3, "fail": 2, "skip": 1, "pass": 0}
    for r in rows:
        key = (_op_label(r), r["case"]["id"])
        worst = max((c for c in r.get("checks", []) if c.get("ours")), key=lambda c: c["ratio"],
                    default=None)
        line = {"op": key[0], "case": r["case"]["id"], "status": r["status"],
                "reason": r.get("reason", ""), "seeds": 1,
                "worst_check": worst["name"] if worst else None,
                "ratio": worst["ratio"] if worst else None,
                "rel_l2": worst["ours"]["rel_l2"] if worst else None}
        if key in by:
            old = by[key]
            line["seeds"] = old["seeds"] + 1
            if (rank[old["status"]], old["ratio"] or 0) > (rank[line["status"]], line["ratio"] or 0):
                line = dict(old, seeds=line["seeds"])
        by[key] = line
    return list(by.values())


# what a per-op speedup timed on the CPU shows instead of a number
NOT_REPRESENTATIVE = "not representative (Triton interpreter on a CPU)"


def _bench_table(rows: list[dict]) -> list[dict]:
    """speedlight's rows (each implementation's) with the others' medians beside them. A
    row timed on the CPU interpreter (not representative) gives no speedup: its ratios
    are withheld (`speedup_withheld` says why), so no view and no average shows one."""
    base = {}
    for r in rows:
        if r.get("median_us") is not None:
            base[(r["case_id"], r["mode"], r["implementation"])] = r["median_us"]
    out = []
    for r in rows:
        if not _is_speedlight(r):
            continue
        out.append({"op": _op_label(r), "implementation": r["implementation"],
                    "unverified": bool(r.get("unverified")),
                    "case": r["case_id"], "mode": r["mode"],
                    "status": r.get("status"), "reason": r.get("reason", ""),
                    "median_us": r.get("median_us"), "p20_us": r.get("p20_us"),
                    "p80_us": r.get("p80_us"), "gbps": r.get("gbps"), "sol_pct": r.get("sol_pct"),
                    "sol_note": r.get("sol_note"), "verified": r.get("verified"),
                    "speedup": (r.get("speedup") or {}) if r.get("representative") else {},
                    "speedup_withheld": NOT_REPRESENTATIVE if not r.get("representative") and any(
                        v is not None for v in (r.get("speedup") or {}).values()) else None,
                    "speedup_note": r.get("speedup_note") or {},
                    "baselines_us": {impl: us for (cid, mode, impl), us in base.items()
                                     if cid == r["case_id"] and mode == r["mode"]
                                     and impl != r["implementation"]},
                    "representative": r.get("representative")})
    return out


def _speedup_means(bench: list[dict]) -> dict:
    """The geometric mean of each speedup of speedlight's default implementation's rows
    measured on a GPU (rows timed on the CPU interpreter have none: _bench_table)."""
    bench = [b for b in bench if b.get("implementation", "speedlight") == "speedlight"
             and b.get("representative")]
    means: dict[str, dict[str, float | None]] = {}
    names = sorted({k for b in bench for k in b["speedup"]})
    for name in names:
        for mode in ("fwd", "bwd", "fwd+bwd"):
            vals = [b["speedup"].get(name) for b in bench if b["mode"] == mode]
            g = _geomean([v for v in vals if v is not None])
            if g is not None:
                means.setdefault(name, {})[mode] = g
    return means


def _projection(doc: dict | None) -> dict | None:
    """The real-size projection: what was projected, and the per-GPU comparison."""
    if not doc:
        return None
    s, run = doc["summary"], doc["run"]
    return {"model": run["model"], "mode": run["mode"], "batch": run["batch"], "seq": run["seq"],
            "parameters": doc["model"].get("parameters"), "target": doc["target"]["name"],
            "floor_s": s["floor_s"], "flops": s["flops"], "peak_bytes": doc["memory"]["peak_bytes"],
            "projection": doc.get("projection", {}), "comparison": doc.get("comparison"),
            "by_type": doc["by_type"][:8], "advice": doc.get("advice", [])[:6]}


def _plan(doc: dict | None) -> dict | None:
    """The plan's tables: per kind its verdict (kept, dropped, unmeasured), the candidate
    chosen, its time ratio to the model's own with the 95% interval, each side's median time
    and peak memory; and every candidate of each kind (status, time, ratio, interval, peak,
    verify's error ratio, why), as plan.json holds them. A plan that timed nothing (no GPU)
    has no ratio to show, only its projection; one that is not a valid plan shows why."""
    from speedlight import plans

    if not doc:
        return None
    try:
        plans.check_document(doc, "plan.json")
    except plans.PlanError as e:
        return {"timed": False, "note": f"not shown: {e}", "key": {}, "projected": None,
                "rows": [], "candidates": [], "counts": {"kept": 0, "dropped": 0,
                                                         "unmeasured": 0}, "shapes": {}}
    rows = [{"kind": kind, "verdict": d.get("verdict"), "purpose": d.get("purpose"),
             "choice": d.get("choice"),
             "ratio": _num(d.get("ratio")), "low": _num(d.get("low")),
             "high": _num(d.get("high")), "ours_s": _num(d.get("ours_s")),
             "theirs_s": _num(d.get("theirs_s")), "ours_peak": _num(d.get("ours_peak")),
             "theirs_peak": _num(d.get("theirs_peak")), "verified": d.get("verified"),
             "unit": d.get("module") or "", "reason": d.get("reason", "")}
            for kind, d in (doc.get("decisions") or {}).items()]
    candidates = [dict(c, kind=kind) for kind, d in doc["decisions"].items()
                  for c in d.get("candidates", [])]
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("kept", "dropped", "unmeasured")}
    return {"timed": bool(doc.get("timed")), "note": doc.get("note", ""), "key": doc.get("key", {}),
            "projected": doc.get("projected"), "rows": rows, "counts": counts,
            "candidates": candidates, "shapes": doc.get("shapes", {})}


def _inspect_table(doc: dict | None) -> list[dict]:
    if not doc:
        return []
    return doc.get("kernels", [])


def load_report(folder: str | Path) -> dict:
    folder = Path(folder)
    manifest = _json(folder / MANIFEST) or {"stages": {}, "files": {}}
    files = manifest.get("files", {})
    get = lambda key: folder / files.get(key, f"{key}.json")  # noqa: E731
    before, after = _json(get("profile_before")), _json(get("profile_after"))
    verify = _verify_table(_jsonl(get("verify")))
    bench_rows = _jsonl(get("bench"))
    bench = _bench_table(bench_rows)
    env = (before or after or {}).get("environment", {})
    representative = env.get("runtime") == "cuda"
    return {
        "folder": str(folder), "manifest": manifest, "files": files,
        "run": manifest.get("run", {}), "environment": env, "representative": representative,
        "target": (before or after or {}).get("target", {}),
        "measured": (before or after or {}).get("measured", {}),
        "before": _profile_summary(before), "after": _profile_summary(after),
        "before_doc": before, "after_doc": after,
        "patch": _json(get("patch")), "model_check": _json(get("model_check")),
        "verify": verify, "bench": bench, "speedup_means": _speedup_means(bench),
        "speedups_withheld": sum(1 for b in bench if b["speedup_withheld"]),
        "inspect": _json(get("inspect")), "inspect_kernels": _inspect_table(_json(get("inspect"))),
        "advice": (before or {}).get("advice", []),
        "projection": _projection(_json(get("projection"))),
        "model_step": _jsonl(get("model_step")), "plan": _plan(_json(get("plan"))),
        "verify_counts": {s: sum(1 for v in verify if v["status"] == s)
                          for s in ("pass", "fail", "error", "skip")},
    }


def failures(data: dict) -> list[str]:
    """What in the report is a failure: a stage that failed, the patched model off, an op
    that failed verification at the model's shapes."""
    out = [f"stage {k} failed: {v.get('error')}" for k, v in data["manifest"]["stages"].items()
           if v.get("status") == "failed"]
    mc = data.get("model_check")
    if mc is not None and not mc.get("passed"):
        out.append(f"patched model differs from the original: {', '.join(mc['failed'][:5])}")
    out += [f"training step, {r['variant']}: loss off the hf variant's by up to "
            f"{100 * r['loss_max_rel_diff']:.3g}%" for r in data.get("model_step", [])
            if r.get("loss_agrees") is False]
    out += [f"verify {v['case']}: {v['status']}" for v in data["verify"] if v["status"] in ("fail", "error")]
    return out
