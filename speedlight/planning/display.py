"""The plan's tables: per kind, the choice (kept or dropped), its time ratio and interval,
and why; then every candidate of every kind with its status, time, ratio, 95% interval,
peak memory and the reason."""

from __future__ import annotations

from speedlight import plans


def plan_rows(plan: plans.Plan) -> list[dict]:
    """One row per kind, as the terminal and the report show it."""
    out = []
    for kind, d in plan.decisions.items():
        out.append({"kind": kind, "verdict": d.verdict, "purpose": d.purpose,
                    "choice": d.choice or "-",
                    "ratio": None if d.ratio is None else f"x{d.ratio:.3f}",
                    "interval": None if d.low is None else f"[{d.low:.3f}, {d.high:.3f}]",
                    "ours_ms": None if d.ours_s is None else f"{d.ours_s * 1e3:.3f}",
                    "theirs_ms": None if d.theirs_s is None else f"{d.theirs_s * 1e3:.3f}",
                    "unit": d.module or "", "reason": d.reason})
    return out


def candidate_rows(plan: plans.Plan) -> list[dict]:
    """One row per candidate of each kind (the model's own first), formatted."""
    out = []
    for kind, d in plan.decisions.items():
        for c in d.candidates:
            out.append({"kind": kind, "name": c["name"], "status": c["status"],
                        "ms": _ms(c["median_s"]),
                        "ratio": "-" if c["ratio"] is None else f"x{c['ratio']:.3f}",
                        "interval": "-" if c["low"] is None
                        else f"[{c['low']:.3f}, {c['high']:.3f}]",
                        "peak": "-" if c["peak"] is None else f"{c['peak'] / 2**20:.1f} MiB",
                        "error": "-" if c["error_ratio"] is None else f"{c['error_ratio']:.2g}",
                        "reason": c["reason"]})
    return out


_COLORS = {"kept": "green", "dropped": "red", "chosen": "green", "excluded": "red",
           "not offered": "dim"}


def plan_table(plan: plans.Plan):
    from rich.table import Table

    k = plan.key
    t = Table(title=f"speedlight plan: {k['model_type']} on {k['gpu']}, {k['dtype']}, batch "
                    f"{k['batch']} x seq {k['seq']} (buckets), {k['compile']}, attention "
                    f"{k['attention']}", caption=plan.note)
    for col in ("kind", "verdict", "choice", "ratio", "95% interval", "chosen ms", "model ms",
                "unit", "why"):
        t.add_column(col)
    for r in plan_rows(plan):
        color = _COLORS.get(r["verdict"], "yellow")
        t.add_row(r["kind"], f"[{color}]{r['verdict']}", r["choice"], r["ratio"] or "-",
                  r["interval"] or "-", r["ours_ms"] or "-", r["theirs_ms"] or "-", r["unit"],
                  r["reason"])
    if plan.projected:
        p = plan.projected
        t.caption += (f"\n{p['label']}: step floor {_ms(p.get('floor_s'))} ms, with speedlight "
                      f"{_ms(p.get('with_speedlight_floor_s'))} ms")
    return t


def candidates_table(plan: plans.Plan):
    """Every candidate of every kind: status, median time, ratio to the model's own with its
    95% interval, peak memory, verify's error ratio (ours over PyTorch's), and why."""
    from rich.table import Table

    t = Table(title="candidates (ratio: median time over the model's own; error: verify's "
                    "error ratio against PyTorch's own)")
    for col in ("kind", "candidate", "status", "ms", "ratio", "95% interval", "peak", "error",
                "why"):
        t.add_column(col)
    for r in candidate_rows(plan):
        color = _COLORS.get(r["status"], "")
        status = f"[{color}]{r['status']}" if color else r["status"]
        t.add_row(r["kind"], r["name"], status, r["ms"], r["ratio"], r["interval"], r["peak"],
                  r["error"], r["reason"])
    return t


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"
