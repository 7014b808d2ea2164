"""Before and after a kernel change: two sets of inspect rows side by side.

    speedlight inspect attention --out after/ --compare before/inspect.jsonl
    speedlight inspect --compare before/inspect.jsonl after/inspect.jsonl

Kernels are matched by (op, case, implementation, target, direction, launch index, kernel);
where a file holds several runs of one kernel, its newest row counts. Per kernel: the
resources (registers, bytes spilled, occupancy) and the steady-state loop's figures
(instructions per iteration, its predicate/select and MMA instructions, warp-instructions
per MMA tile, barriers, bytes in flight per SM), and the predicted time where the rows
carry one. Every figure is read from compiled code on a CPU: a prediction, not a timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from speedlight import results

# (label, how to read it from a kernel row, True when smaller is better)
FIGURES = (
    ("registers", lambda r: r.get("registers"), True),
    ("spilled B", lambda r: r.get("spill_bytes", r.get("spill_stores")), True),
    ("occupancy", lambda r: (r.get("occupancy") or {}).get("fraction"), False),
    ("loop instr/iter", lambda r: _steady(r, "instructions"), True),
    ("select/iter", lambda r: (_steady(r, "pipes") or {}).get("select", 0)
     if _steady(r, "pipes") is not None else None, True),
    ("MMA instr/iter", lambda r: (_steady(r, "pipes") or {}).get("mma", 0)
     if _steady(r, "pipes") is not None else None, True),
    ("warp-instr/MMA tile", lambda r: _steady(r, "warp_instructions_per_mma_tile"), True),
    ("barriers/iter", lambda r: _steady(r, "barriers"), True),
    ("in flight B/SM", lambda r: (r.get("in_flight") or {}).get("per_sm"), False),
    ("predicted us", lambda r: (r.get("predicted") or {}).get("us"), True),
)


def _steady(row: dict, key: str):
    loop = next((lp for lp in row.get("loops") or [] if lp.get("steady")), None)
    return None if loop is None else loop.get(key)


def key(row: dict) -> tuple:
    return (row.get("op"), row.get("case_id"), row.get("implementation"), row.get("target"),
            row.get("direction"), row.get("launch"), row.get("kernel"))


def kernel_rows(rows: list[dict]) -> dict[tuple, dict]:
    """The newest kernel row of each key."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if r.get("tool") == "inspect" and r.get("level") == "kernel":
            k = key(r)
            if k not in out or str(r.get("timestamp", "")) >= str(out[k].get("timestamp", "")):
                out[k] = r
    return out


def read_rows(path: str | Path) -> list[dict]:
    path = Path(path)
    if path.is_dir():
        path = path / "inspect.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no inspect rows at {path}")
    return results.read_jsonl(path)


@dataclass
class Change:
    key: tuple
    before: dict | None
    after: dict | None

    def figures(self) -> list[tuple[str, object, object, bool]]:
        out = []
        for label, get, lower in FIGURES:
            a = get(self.before) if self.before else None
            b = get(self.after) if self.after else None
            if a is None and b is None:
                continue
            out.append((label, a, b, lower))
        return out

    def to_json(self) -> dict:
        op, case, impl, target, direction, launch, kernel = self.key
        return {"op": op, "case_id": case, "implementation": impl, "target": target,
                "direction": direction, "launch": launch, "kernel": kernel,
                "only": "before" if self.after is None else "after" if self.before is None
                else None,
                "figures": {label: {"before": a, "after": b} for label, a, b, _ in self.figures()}}


def changes(before: list[dict], after: list[dict]) -> list[Change]:
    """Every kernel in either set of rows, matched by key, in the after run's order."""
    a, b = kernel_rows(before), kernel_rows(after)
    order = list(b) + [k for k in a if k not in b]
    return [Change(k, a.get(k), b.get(k)) for k in order]


def _fmt(label: str, v) -> str:
    if v is None:
        return "-"
    if label == "occupancy":
        return f"{v:.0%}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def print_changes(changes: list[Change], console, *, title: str) -> None:
    from rich.table import Table

    t = Table(title=title + " (read from compiled code on a CPU: figures are predictions, "
                            "not timings)", title_justify="left", pad_edge=False)
    for c in ("case", "dir", "kernel", "figure", "before", "after", "change"):
        t.add_column(c, justify="right" if c in ("before", "after", "change") else "left",
                     overflow="fold")
    for ch in changes:
        op, case, _, target, direction, launch, kernel = ch.key
        first = True
        if ch.before is None or ch.after is None:
            t.add_row(f"{case} ({target})", direction, kernel,
                      "only in the " + ("after" if ch.before is None else "before") + " rows",
                      "", "", "")
            continue
        for label, a, b, lower in ch.figures():
            if a == b:
                continue
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
                ratio = b / a
                better = (ratio < 1) == lower
                change = f"[{'green' if better else 'red'}]{ratio:.2f}x[/]"
            else:
                change = ""
            t.add_row(f"{case} ({target})" if first else "", direction if first else "",
                      kernel if first else "", label, _fmt(label, a), _fmt(label, b), change)
            first = False
        if first:
            t.add_row(f"{case} ({target})", direction, kernel, "no change", "", "", "")
    console.print(t)
