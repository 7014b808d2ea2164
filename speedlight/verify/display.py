"""The terminal view of verify results: one row per (op, case, dtype), worst over seeds."""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from rich.console import Console
from rich.table import Table

from speedlight.results import make_console
from speedlight.spec import dtype_name
from speedlight.verify.harness import CaseResult

_STYLE = {"pass": "green", "fail": "bold red", "error": "bold red", "skip": "yellow"}
_RANK = {"error": 3, "fail": 2, "skip": 1, "pass": 0}


def op_label(r: CaseResult) -> str:
    """The op, with the implementation when it is not the op's first: rms_norm (cuda,
    unverified)."""
    if r.label == "speedlight":
        return r.op
    return f"{r.op} ({r.impl}{', unverified' if r.unverified else ''})"


def group(results: Sequence[CaseResult]) -> "OrderedDict[tuple, list[CaseResult]]":
    groups: OrderedDict[tuple, list[CaseResult]] = OrderedDict()
    for r in results:
        groups.setdefault((op_label(r), r.case.with_(seed=0).id), []).append(r)
    return groups


def status_counts(results: Sequence[CaseResult]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def case_table(results: Sequence[CaseResult], *, title: str, only_problems: bool = False) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    for col, kw in [("op", {}), ("case", {"overflow": "fold"}), ("dtype", {}),
                    ("worst check", {}), ("rel L2 err", {"justify": "right"}),
                    ("PyTorch's", {"justify": "right"}), ("ratio", {"justify": "right"}),
                    ("seeds", {"justify": "right"}), ("verdict", {}), ("note", {"overflow": "fold"})]:
        t.add_column(col, **kw)
    for (op, case_id), rs in group(results).items():
        status = max((r.status for r in rs), key=_RANK.get)
        if only_problems and status == "pass":
            continue
        worst_r = max(rs, key=lambda r: (_RANK[r.status], r.worst.ratio if r.worst else 0.0))
        w = worst_r.worst
        err = f"{w.ours.rel_l2:.2e}" if w and w.ours else "-"
        theirs = f"{w.torch.rel_l2:.2e}" if w and w.torch else "-"
        ratio = f"{w.ratio:.2f}" if w and w.ours else "-"
        note = worst_r.reason if status != "pass" else ""
        t.add_row(op, worst_r.case.label, dtype_name(worst_r.case.dtype),
                  w.name if w else "-", err, theirs, ratio, str(len(rs)),
                  f"[{_STYLE[status]}]{status.upper()}[/]", note)
    return t


def op_table(results: Sequence[CaseResult], *, title: str) -> Table:
    """One row per (op, dtype): how many runs passed, and the worst ratio to PyTorch."""
    t = Table(title=title, title_justify="left", pad_edge=False)
    for col in ("op", "dtype", "runs", "passed", "failed", "skipped", "worst ratio", "worst case"):
        t.add_column(col, justify="right" if col in ("runs", "passed", "failed", "skipped",
                                                      "worst ratio") else "left")
    by: OrderedDict[tuple, list[CaseResult]] = OrderedDict()
    for r in results:
        by.setdefault((op_label(r), dtype_name(r.case.dtype)), []).append(r)
    for (op, dt), rs in by.items():
        c = status_counts(rs)
        scored = [r for r in rs if r.worst is not None and r.worst.ours is not None]
        worst = max(scored, key=lambda r: r.worst.ratio) if scored else None
        bad = c["fail"] + c["error"]
        t.add_row(op, dt, str(len(rs)), f"[green]{c['pass']}[/]",
                  f"[red]{bad}[/]" if bad else "0", str(c["skip"]),
                  f"{worst.worst.ratio:.2f}" if worst else "-",
                  f"{worst.case.label} ({worst.worst.name})" if worst else "-")
    return t


def print_results(results: Sequence[CaseResult], console: Console | None = None, *,
                  device: str = "", only_problems: bool = False) -> None:
    console = console or make_console()
    title = f"speedlight verify ({device})" if device else "speedlight verify"
    console.print(op_table(results, title=title + ": ratio = our error / PyTorch's, same dtype"))
    if not only_problems or any(r.status != "pass" for r in results):
        label = "all cases" if not only_problems else "cases that did not pass"
        console.print(case_table(results, title=label, only_problems=only_problems))
    c = status_counts(results)
    console.print(f"[green]{c['pass']} passed[/], [red]{c['fail']} failed[/], "
                  f"[red]{c['error']} errors[/], [yellow]{c['skip']} skipped[/] "
                  f"({len(results)} case x dtype x seed runs)")
