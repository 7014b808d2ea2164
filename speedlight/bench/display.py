"""Rich tables of bench rows and of a comparison between two runs."""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Sequence

from rich.console import Console
from rich.table import Table

from speedlight import results
from speedlight.bench.baselines import BASELINES, SPEEDLIGHT, is_speedlight

NOT_REPRESENTATIVE = ("CPU, Triton interpreter: timings NOT representative of any GPU "
                      "(they check the harness, not the kernels' speed)")
_SHORT = {"torch-eager": "x eager", "torch-compile": "x compile", "liger": "x Liger",
          "torch-fused": "x torch fused"}


CONSOLE_WIDTH = 170  # bench's table has a column per baseline


def title_for(rows: Sequence[dict], what: str = "speedlight bench") -> str:
    devices = sorted({str(r.get("device")) for r in rows}) or ["?"]
    if any(r.get("representative") is False for r in rows):
        return f"{what} ({', '.join(devices)}; {NOT_REPRESENTATIVE})"
    return f"{what} ({', '.join(devices)})"


def fmt_latency_us(us: float | None) -> str:
    """A latency in the unit that reads best: 850 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if us is None:
        return "-"
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "us")):
        if us >= scale:
            return f"{us / scale:.3g} {unit}"
    return f"{us * 1e3:.3g} ns"


def _throughput(row: dict) -> str:
    if row.get("status") != "ok":
        return "-"
    if row.get("sol_bound") == "compute" or (row.get("sol_bound") is None
                                              and row.get("family") in ("compute-bound", "matmul")):
        return f"{row['tflops']:.3g} TFLOP/s"
    return f"{row['gbps']:.4g} GB/s"


def _sol(row: dict) -> str:
    if row.get("sol_bug"):
        return f"[bold red]BUG {row['sol_pct_raw']:.0f}%[/]"
    return "-" if row.get("sol_pct") is None else f"{row['sol_pct']:.1f}%"


def row_op_label(row: dict) -> str:
    """The op, with the implementation when it is not the op's first: rms_norm (cuda,
    unverified)."""
    if row["implementation"] == SPEEDLIGHT:
        return row["op"]
    return f"{row['op']} ({row.get('impl')}{', unverified' if row.get('unverified') else ''})"


def results_table(rows: Sequence[dict], title: str) -> Table:
    """One line per (op, case, mode): speedlight's latency, throughput and % of SOL, and its
    speedup over each baseline (n/a where withheld; the notes below the table say why)."""
    # speedlight's other implementations (speedlight-cuda) are timed against its first too
    over = (SPEEDLIGHT,) if any(is_speedlight(r["implementation"])
                                and r["implementation"] != SPEEDLIGHT for r in rows) else ()
    baselines = [b for b in (*over, *BASELINES) if any(r["implementation"] == b for r in rows)]
    t = Table(title=title, title_justify="left", pad_edge=False)
    predicted = [r.get("predicted") for r in rows if r.get("predicted")]
    pred_col = [f"predicted on {next((p['sku'] for p in predicted if 'sku' in p), 'the target')}"
                ] if predicted else []
    for col in ["op", "case", "dtype", "mode", "median", *pred_col, "p20-p80", "throughput",
                "% SOL", "verified", *[_SHORT.get(b, f"x {b}") for b in baselines]]:
        t.add_column(col, justify="left" if col in ("op", "case", "dtype", "mode", "verified") else "right")
    for r in rows:
        if not is_speedlight(r["implementation"]):
            continue
        label = r.get("case_label") or r["case_id"]
        op = row_op_label(r)
        p = r.get("predicted") or {}
        pred = ([f"{fmt_latency_us(p['us'])} {p['bound']}" if "us" in p else "[dim]-[/]"]
                if pred_col else [])
        if r.get("status") != "ok":
            t.add_row(op, label, r["dtype"], r["mode"], f"[yellow]{r['status']}[/]", *pred, "",
                      "", "", "", *["" for _ in baselines])
            continue
        ver = {True: "[green]yes[/]", False: "[red]no[/]", None: "[dim]not run[/]"}[r.get("verified")]
        ups = []
        for b in baselines:
            v = (r.get("speedup") or {}).get(b)
            ups.append(f"{v:.2f}x" if v is not None else "[dim]n/a[/]")
        t.add_row(op, label, r["dtype"], r["mode"], fmt_latency_us(r["median_us"]), *pred,
                  f"{fmt_latency_us(r['p20_us'])} - {fmt_latency_us(r['p80_us'])}", _throughput(r), _sol(r), ver, *ups)
    return t


def notes(rows: Sequence[dict], most: int = 12) -> list[str]:
    """Every reason something was skipped, unavailable, failed or withheld: one line per
    kind of reason (reasons that differ only in their numbers are one kind, shown by its
    first example), with the implementations and the number of rows it covers."""
    kinds: OrderedDict = OrderedDict()

    def add(what: str, reason: str, impl: str) -> None:
        key = (what, re.sub(r"\d+(\.\d+)?", "#", reason))
        entry = kinds.setdefault(key, {"example": reason, "impls": [], "rows": 0, "variants": set()})
        entry["rows"] += 1
        entry["variants"].add(reason)
        if impl not in entry["impls"]:
            entry["impls"].append(impl)

    for r in rows:
        if r.get("status") in ("skip", "unavailable", "error"):
            add(r["status"], r.get("reason", ""), r["implementation"])
        if r.get("status") == "ok":
            for b, why in (r.get("speedup_note") or {}).items():
                add("speedup withheld", why, f"over {b}")
        if r.get("sol_bug"):
            add("% SOL", r["sol_bug"], r["implementation"])
    lines = []
    for (what, _), e in kinds.items():
        similar = f" (and {len(e['variants']) - 1} similar)" if len(e["variants"]) > 1 else ""
        lines.append(f"{what}, {', '.join(e['impls'])} ({e['rows']} rows): {e['example']}{similar}")
    if len(lines) > most:
        lines = lines[:most] + [f"... and {len(lines) - most} more kinds of reason, in the rows"]
    return lines


def print_bench(rows: Sequence[dict], console: Console | None = None) -> None:
    console = console or results.make_console(CONSOLE_WIDTH)
    console.print(results_table(rows, title_for(rows)))
    ok = [r for r in rows if r["implementation"] == SPEEDLIGHT and r.get("status") == "ok"]
    roofs = sorted({f"{r['sol_roof']} ceilings" for r in ok if r.get("sol_roof")})
    note = next((r.get("sol_note") for r in ok if r.get("sol_note")), "")
    if roofs or note:
        console.print(f"% SOL on {', '.join(roofs) or 'no'} ({note})")
    for line in notes(rows):
        console.print(f"[dim]- {line}[/]")
    if any(r.get("predicted") for r in rows):
        console.print("[dim]- predicted: read from the kernels compiled for the target on this "
                      "machine (speedlight inspect's model), not measured; the measured columns "
                      "are this run's[/]")
    if any(r.get("representative") is False for r in rows):
        console.print(f"[bold yellow]{NOT_REPRESENTATIVE}[/]")


def compare_table(comparisons, title: str) -> Table:
    t = Table(title=title, title_justify="left", pad_edge=False)
    for col in ("op", "implementation", "case", "mode", "old", "new", "change", "p", "verdict"):
        t.add_column(col, justify="right" if col in ("old", "new", "change", "p") else "left")
    style = {"regression": "bold red", "improvement": "green", "unchanged": "white",
             "not comparable": "yellow", "only in old": "dim", "only in new": "dim"}
    grouped: OrderedDict = OrderedDict()
    for c in comparisons:
        grouped.setdefault(c.verdict, []).append(c)
    for verdict in ("regression", "improvement", "unchanged", "not comparable", "only in old", "only in new"):
        for c in grouped.get(verdict, []):
            change = "-" if c.change is None else f"{100 * c.change:+.1f}%"
            p = "-" if c.p_value is None else f"{c.p_value:.2g}"
            t.add_row(c.op, c.implementation, c.case_id, c.mode, fmt_latency_us(c.old_us),
                      fmt_latency_us(c.new_us), change, p, f"[{style[verdict]}]{verdict}[/]"
                      + (f" [dim]({c.note})[/]" if c.note else ""))
    return t
