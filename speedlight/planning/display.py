"""The plan's table: per kind, kept or dropped, the time ratio and its interval, and why."""

from __future__ import annotations

from speedlight import plans


def plan_rows(plan: plans.Plan) -> list[dict]:
    """One row per kind, as the terminal and the report show it."""
    out = []
    for kind, d in plan.decisions.items():
        out.append({"kind": kind, "verdict": d.verdict, "purpose": d.purpose,
                     "ratio": None if d.ratio is None else f"x{d.ratio:.3f}",
                     "interval": None if d.low is None else f"[{d.low:.3f}, {d.high:.3f}]",
                     "ours_ms": None if d.ours_s is None else f"{d.ours_s * 1e3:.3f}",
                     "theirs_ms": None if d.theirs_s is None else f"{d.theirs_s * 1e3:.3f}",
                     "unit": d.module or "", "reason": d.reason})
    return out


def plan_table(plan: plans.Plan):
    from rich.table import Table

    k = plan.key
    t = Table(title=f"speedlight plan: {k['model_type']} on {k['gpu']}, {k['dtype']}, batch "
                    f"{k['batch']} x seq {k['seq']} (buckets), {k['compile']}, attention "
                    f"{k['attention']}", caption=plan.note)
    for col in ("kind", "verdict", "ratio", "95% interval", "speedlight ms", "original ms",
                "unit", "why"):
        t.add_column(col)
    for r in plan_rows(plan):
        color = {"kept": "green", "dropped": "red"}.get(r["verdict"], "yellow")
        t.add_row(r["kind"], f"[{color}]{r['verdict']}", r["ratio"] or "-", r["interval"] or "-",
                  r["ours_ms"] or "-", r["theirs_ms"] or "-", r["unit"], r["reason"])
    if plan.projected:
        p = plan.projected
        t.caption += (f"\n{p['label']}: step floor {_ms(p.get('floor_s'))} ms, with speedlight "
                      f"{_ms(p.get('with_speedlight_floor_s'))} ms")
    return t


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"
