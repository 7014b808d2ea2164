"""Rich tables of a tune sweep: per shape, every configuration examined with its verdict
(survivor, pruned and why, duplicate), the rule's marked, and the timings on a GPU."""

from __future__ import annotations

from itertools import groupby

from rich.table import Table

STYLE = {"best": "bold green", "survivor": "green", "pruned": "red", "duplicate": "dim",
         "skip": "yellow", "error": "bold red", "not-compiled": "dim"}


def _fmt_config(config: dict) -> str:
    short = {"BLOCK_M": "BM", "BLOCK_N": "BN", "BLOCK_K": "BK", "GROUP_M": "G",
             "num_warps": "w", "num_stages": "s"}
    return " ".join(f"{short.get(k, k)}{v}" for k, v in config.items())


def _verdict(row: dict) -> str:
    if row["status"] == "pruned":
        return "; ".join(r["why"] for r in row.get("reasons", []))
    return row.get("reason") or row.get("timing") or ""


def print_sweep(rows: list[dict], console, *, timed: bool) -> None:
    for case_id, group in groupby(rows, key=lambda r: r["case_id"]):
        group = list(group)
        first = group[0]
        if first["status"] in ("skip", "error") and "config" not in first:
            console.print(f"[{STYLE[first['status']]}]{case_id}: {first['status']}[/] "
                          f"{first.get('reason', '')}", highlight=False)
            continue
        table = Table(title=f"{case_id} (bucket {first.get('bucket')}, {first['sku']}; "
                            f"predicted µs: read from the compiled code on a CPU, not measured, "
                            f"#: rank among the survivors)", title_justify="left")
        table.add_column("configuration")
        table.add_column("verdict")
        for name in ("regs", "spill B", "smem KB", "occ", "predicted µs"):
            table.add_column(name, justify="right")
        if timed:
            table.add_column("µs", justify="right")
        table.add_column("reason")
        counts: dict[str, int] = {}
        for row in group:
            counts[row["status"]] = counts.get(row["status"], 0) + row.get("count", 1)
            if row["status"] == "not-compiled":
                continue
            status = row["status"] + (" (rule)" if row.get("rule") else "")
            cells = [_fmt_config(row["config"]), f"[{STYLE.get(row['status'], '')}]{status}[/]",
                     str(row.get("registers", "")), str(row.get("spill_bytes", "")),
                     f"{row['smem'] / 1024:.0f}" if "smem" in row else "",
                     f"{row['occupancy']:.0%}" if "occupancy" in row else "",
                     (f"{row['predicted_us']:,.1f} #{row['predicted_rank']}"
                      if "predicted_rank" in row else
                      f"{row['predicted_us']:,.1f}" if "predicted_us" in row else "")]
            if timed:
                cells.append(f"{row['median_us']:.1f}" if "median_us" in row else "")
            cells.append(_verdict(row))
            table.add_row(*cells)
        console.print(table)
        console.print("  " + ", ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
