"""Plots drawn from bench rows, never from typed numbers: per op, dtype and mode, GB/s
(memory-bound ops) or TFLOP/s (compute-bound ones) against the case's shape, one line per
implementation, and the ceiling the % of SOL is computed on."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Sequence

from speedlight.bench.baselines import BASELINES, SPEEDLIGHT

_ORDER = (SPEEDLIGHT, *BASELINES)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("speedlight bench plot needs matplotlib (the 'plot' extra): "
                         "pip install 'speedlight[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _metric(rows: Sequence[dict]) -> str:
    """tflops when most timed rows are compute-bound, else gbps."""
    bounds = [r.get("sol_bound") or ("compute" if r.get("family") in ("compute-bound", "matmul")
                                     else "memory") for r in rows]
    return "tflops" if bounds.count("compute") > len(bounds) / 2 else "gbps"


def plot_groups(rows: Sequence[dict]) -> "OrderedDict[tuple, list[dict]]":
    out: OrderedDict = OrderedDict()
    for r in rows:
        if r.get("tool") == "bench" and r.get("status") == "ok":
            out.setdefault((r["op"], r["dtype"], r["mode"]), []).append(r)
    return out


def figure(rows: Sequence[dict], title: str):
    """One figure: x = the cases in order of bytes moved, y = GB/s or TFLOP/s."""
    plt = _pyplot()
    metric = _metric(rows)
    cases: OrderedDict = OrderedDict()
    for r in sorted(rows, key=lambda r: (r.get("bytes") or 0, r.get("flops") or 0, r["case_id"])):
        cases.setdefault(r["case_id"], r.get("case_label") or r["case_id"])
    index = {c: i for i, c in enumerate(cases)}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(cases) + 3), 4.5))
    impls = sorted({r["implementation"] for r in rows},
                   key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    for impl in impls:
        pts = sorted((index[r["case_id"]], r[metric]) for r in rows
                     if r["implementation"] == impl and r.get(metric) is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
    values = [r[metric] for r in rows if r.get(metric)]
    if values and min(values) > 0 and max(values) / min(values) > 50:
        ax.set_yscale("log")  # decode-sized and prefill-sized cases differ by orders of magnitude
    ceiling = _ceiling(rows, metric)
    if ceiling is not None:
        value, source = ceiling
        ax.axhline(value, color="black", linestyle="--", linewidth=1,
                   label=f"ceiling ({source}): {value:.4g}")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(list(cases.values()), rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("GB/s (bytes of the Cost / median)" if metric == "gbps"
                  else "TFLOP/s (FLOPs of the Cost / median)")
    not_rep = any(r.get("representative") is False for r in rows)
    ax.set_title(title + ("\nCPU interpreter: NOT representative" if not_rep else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _ceiling(rows: Sequence[dict], metric: str) -> tuple[float, str] | None:
    for r in rows:
        if metric == "gbps" and r.get("sol_bandwidth"):
            return r["sol_bandwidth"] / 1e9, r.get("sol_roof", "?")
        if metric == "tflops" and r.get("sol_peak_flops"):
            return r["sol_peak_flops"] / 1e12, f"{r.get('sol_roof', '?')} {r.get('sol_peak')}"
    return None


def plot(rows: Sequence[dict], out_dir: str | Path) -> list[Path]:
    """One PNG per (op, dtype, mode) under out_dir; returns their paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (op, dtype, mode), rs in plot_groups(rows).items():
        device = rs[0].get("device", "")
        fig = figure(rs, f"{op} {dtype} {mode} on {device}")
        path = out_dir / f"{op}-{dtype}-{mode.replace('+', '_')}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
