"""The plan prior: per GPU architecture and kind of patch, whether speedlight's kernel
measured faster than what the model runs without it, written from the measured rows under
benchmarks/results/ (never by hand) into speedlight/tuned/plan-prior.json, which
patch(plan="auto") reads on a GPU with no cached plan (speedlight.plan_prior.prior_plan).

    python scripts/plan_prior.py            # write it from benchmarks/results
    python scripts/plan_prior.py --check    # exit 1 when the shipped file is not what it writes

What counts: bench rows measured on a GPU (`representative`, status ok) of the ops a kind's
patch runs (op_kinds(): the OpSpecs' `patches`), and a run's lce.json (the fused loss against its peers); per case,
implementation and mode, the newest row. Training is what a plan serves, so the fwd+bwd
rows are used where a kind has them, else the forward's. Per case each implementation's
median time is divided by that of what the model runs unpatched (MODEL_PROXY: the eager
reference, or for attention SDPA's flash backend, the one transformers' sdpa runs first on
these shapes: profile.project.sdpa_backend says the same), and the kind's ratio is the
geometric mean over its cases. speedlight's kind is dropped when its ratio is above 1 (a
time kind) or above 1 + decide.MEMORY_MARGIN (the fused loss, kept for its memory), else
kept; the fastest implementation measured is recorded beside it. A prior never installs
another candidate: none was verified at the model's shapes (speedlight.plan does that).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from speedlight.planning.decide import MEMORY_KINDS, MEMORY_MARGIN

MODEL_PROXY = {"attention": "sdpa-flash"}  # else the eager reference
EAGER = "torch-eager"
SPEEDLIGHT = "speedlight"


def arch_of_sku(sku: str) -> str:
    """sm_90 for an H200, gfx942 for an MI300X: the key a prior is read by
    (speedlight.plan_prior.arch_of gives a device's)."""
    from speedlight import hardware

    spec = hardware.DEVICES[sku]
    if spec.gfx:
        return spec.gfx
    major, minor = spec.compute_capability
    return f"sm_{major}{minor}"


def op_kinds() -> dict[str, str]:
    """op -> the kind of patch that swaps it (its OpSpec's `patches`), for the built-in ops
    a patch swaps in."""
    from speedlight import registry

    return {s.name: s.patches for s in registry.builtin_specs() if s.patches}


def _bench_rows(run: Path):
    kind_of = op_kinds()
    for path in sorted(run.rglob("bench.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if (row.get("representative") and row.get("status") == "ok"
                    and row.get("op") in kind_of and row.get("median_us")):
                yield {"kind": kind_of[row["op"]], "case": row["case_id"], "mode": row["mode"],
                       "impl": row["implementation"], "seconds": row["median_us"] * 1e-6,
                       "timestamp": row.get("timestamp", ""), "device": row.get("device"),
                       "git": (row.get("git") or "")[:7]}


def _lce_rows(run: Path):
    path = run / "lce.json"
    if not path.is_file():
        return
    doc = json.loads(path.read_text())
    shape = doc.get("shape", {})
    case = "-".join(f"{k}{shape[k]}" for k in ("tokens", "hidden", "vocab", "dtype") if k in shape)
    for impl, row in doc.get("rows", {}).items():
        if row.get("status") == "ok" and row.get("seconds"):
            yield {"kind": "linear_cross_entropy", "case": f"lce-{case}", "mode": "fwd+bwd",
                   "impl": impl, "seconds": row["seconds"], "timestamp": run.name,
                   "device": doc.get("device"), "git": ""}


def _runs(results: Path):
    """(sku, run folder) of every run under results/<sku>/<run>/ whose sku is a GPU."""
    from speedlight import hardware

    for sku_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        if sku_dir.name not in hardware.DEVICES:
            continue  # cpu/ and the like: no GPU measured there
        for run in sorted(p for p in sku_dir.iterdir() if p.is_dir()):
            yield sku_dir.name, run


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _kind_entry(kind: str, rows: list[dict]) -> dict | None:
    newest: dict[tuple, dict] = {}
    for r in rows:
        key = (r["case"], r["mode"], r["impl"])
        if key not in newest or r["timestamp"] >= newest[key]["timestamp"]:
            newest[key] = r
    modes = {m for _, m, _ in newest}
    mode = "fwd+bwd" if "fwd+bwd" in modes else "fwd"
    proxy = MODEL_PROXY.get(kind, EAGER)
    by_case: dict[str, dict[str, float]] = defaultdict(dict)
    for (case, m, impl), r in newest.items():
        if m == mode:
            by_case[case][impl] = r["seconds"]
    ratios: dict[str, list[float]] = defaultdict(list)
    for times in by_case.values():
        if proxy in times and SPEEDLIGHT in times:
            for impl, t in times.items():
                ratios[impl].append(t / times[proxy])
    if SPEEDLIGHT not in ratios:
        return None
    candidates = {impl: float(f"{_geomean(v):.4g}") for impl, v in sorted(ratios.items())}
    ratio = candidates[SPEEDLIGHT]
    limit = 1 + MEMORY_MARGIN if kind in MEMORY_KINDS else 1.0
    fastest = min(candidates, key=lambda k: (candidates[k], k))
    verdict = "dropped" if ratio > limit else "kept"
    said = (f"speedlight {ratio:.3g}x the time of {proxy} (what the model runs unpatched), "
            f"geometric mean of {len(ratios[SPEEDLIGHT])} {mode} case(s); fastest measured: "
            f"{fastest}")
    return {"verdict": verdict, "ratio": ratio, "against": proxy, "mode": mode,
            "cases": len(ratios[SPEEDLIGHT]), "fastest": fastest, "candidates": candidates,
            "reason": said}


def build_prior(results: str | Path) -> dict:
    """The prior document from every GPU run under `results` (see the module docstring)."""
    from speedlight.plan_prior import PRIOR_FORMAT

    results = Path(results)
    by_arch: dict[str, dict] = {}
    for sku, run in _runs(results):
        rows = list(_bench_rows(run)) + list(_lce_rows(run))
        if not rows:
            continue
        arch = arch_of_sku(sku)
        a = by_arch.setdefault(arch, {"sku": sku, "runs": [], "rows": []})
        a["runs"].append(f"{sku}/{run.name}")
        a["rows"] += rows
    archs = {}
    for arch, a in sorted(by_arch.items()):
        kinds = {}
        for kind in sorted({r["kind"] for r in a["rows"]}):
            entry = _kind_entry(kind, [r for r in a["rows"] if r["kind"] == kind])
            if entry is not None:
                kinds[kind] = entry
        stamps = sorted(r["timestamp"] for r in a["rows"] if r["timestamp"][:2] == "20")
        archs[arch] = {"sku": a["sku"],
                       "device": next((r["device"] for r in a["rows"] if r["device"]), None),
                       "runs": a["runs"], "date": stamps[-1][:10] if stamps else None,
                       "git": sorted({r["git"] for r in a["rows"] if r["git"]}),
                       "kinds": kinds}
    return {"format": PRIOR_FORMAT,
            "written_by": "speedlight.planning.prior from benchmarks/results (scripts/"
                          "plan_prior.py); never edited by hand",
            "archs": archs}


def text(doc: dict) -> str:
    """The file's text: sorted keys, one newline at the end, so a rewrite is byte-stable."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
