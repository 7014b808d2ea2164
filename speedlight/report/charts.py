"""The report's charts, drawn with matplotlib from the loaded stage files, as inline SVG."""

from __future__ import annotations

import io


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("the report's charts need matplotlib: pip install 'speedlight[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _svg(fig) -> str:
    buf = io.StringIO()
    with _pyplot().rc_context({"svg.fonttype": "none"}):  # text as text: searchable, the page's font
        fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def time_by_type(data: dict, n: int = 10) -> str | None:
    """Measured time per aten op type in the original model and, beside it, the patched
    one; its title says both and where the times were measured."""
    before, after = data.get("before_doc"), data.get("after_doc")
    if not before:
        return None
    plt = _pyplot()
    b = {g["key"]: g["time_s"] for g in before["by_type"]}
    a = {g["key"]: g["time_s"] for g in (after or {}).get("by_type", [])}
    keys = sorted(set(b) | set(a), key=lambda k: -max(b.get(k, 0), a.get(k, 0)))[:n][::-1]
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(keys) + 1.2))
    y = range(len(keys))
    ax.barh([i + 0.2 for i in y], [b.get(k, 0) * 1e3 for k in keys], 0.4,
            label="original model")
    if after:
        ax.barh([i - 0.2 for i in y], [a.get(k, 0) * 1e3 for k in keys], 0.4,
                label="patched with speedlight")
    ax.set_yticks(list(y), keys, fontsize=8)
    ax.set_title(f"Time per aten op type, the {n} costliest: original model"
                 + (" and patched" if after else ""), fontsize=9)
    ax.set_xlabel("measured time per step (ms)" + ("" if data["representative"] else
                                                    " - CPU, not representative"))
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def roofline(data: dict) -> str | None:
    """The original model's ops on the target's roofline: x = FLOP/byte, point size = time share.
    On the target GPU a point sits at its achieved FLOP/s; elsewhere at its floor (the
    roof at its intensity), since CPU times say nothing about the GPU."""
    doc = data.get("before_doc")
    if not doc:
        return None
    plt = _pyplot()
    target = doc["target"]
    bw = target["bandwidth"]
    peak = max(v for v in target["peak_flops"].values() if v)
    rows = [r for r in doc["rows"] if r.get("flops") and r.get("bytes") and r.get("time_s")]
    if not rows:
        return None
    total = sum(r["time_s"] for r in rows)
    on_target = bool(target.get("measured_here"))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = [r["flops"] / r["bytes"] for r in rows]
    ys = [r["flops"] / r["time_s"] if on_target else min(peak, x * bw) for r, x in zip(rows, xs)]
    sizes = [8 + 600 * r["time_s"] / total for r in rows]
    colors = {"compute": "tab:red", "memory": "tab:blue", "launch": "tab:gray"}
    ax.scatter(xs, ys, s=sizes, alpha=0.5, c=[colors.get(r.get("bound"), "tab:green") for r in rows])
    lo, hi = min(xs + [0.1]) / 2, max(xs + [peak / bw]) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, x * bw) for x in grid], "k-", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s" + (" achieved" if on_target else " at the floor (projected)"))
    ax.set_title(f"The original model's ops on the {target['name']} roof "
                 f"({target.get('roof_source', 'datasheet')}); point area = share of step time",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    return _svg(fig)


def speedups_by_op(data: dict) -> str | None:
    """speedlight's speedup over each baseline per op and mode (verified cases timed on a
    GPU only: rows timed on the CPU interpreter carry none, so on a CPU there is no chart)."""
    rows = [b for b in data["bench"] if b["verified"] and b["speedup"]]
    if not rows:
        return None
    plt = _pyplot()
    names = sorted({k for b in rows for k, v in b["speedup"].items() if v})
    labels = [f"{b['op']} {b['mode']}" for b in rows]
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(rows) * max(1, len(names)) / 1.5 + 1.2))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        ax.barh([i + (j - (len(names) - 1) / 2) * width for i in range(len(rows))],
                [b["speedup"].get(name) or 0 for b in rows], width, label=f"over {name}")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_title("speedlight's speedup per op and mode at the model's shapes (verified "
                 "cases)", fontsize=9)
    ax.set_xlabel("speedup (x)")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    return _svg(fig)
