"""The profile's charts, drawn with matplotlib from the JSON document, as SVG text.

- roofline: one point per distinct op call (op, input shapes, phase), at its arithmetic
  intensity. On the GPU the floors are on, a point sits at the FLOP/s it reached, sized by
  its measured time; projected (no such GPU), at the FLOP/s its floor implies (on the
  roof), sized by its floor. Ops without FLOPs (copies, casts) have no place on it; the
  title gives their share of the time.
- time breakdown: share of the measured time and of the floor, by op type and by
  module class.
"""

from __future__ import annotations

import io
from collections import defaultdict

from speedlight.profile import fmt

_COLORS = {"compute": "#2a9d8f", "memory": "#457b9d", "launch": "#e9c46a", "none": "#bbbbbb",
           "unknown": "#e63946"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("charts need matplotlib: pip install 'speedlight[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: small, searchable
        fig.savefig(buf, format="svg", bbox_inches="tight")
    _pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def roofline_points(doc: dict) -> list[dict]:
    """One point per distinct (op, input shapes, phase) that does arithmetic."""
    groups: dict = defaultdict(list)
    for r in doc["rows"]:
        if r["launches_kernel"] and r["flops"]:
            groups[r["op"], tuple(tuple(t["shape"]) for t in r["inputs"]), r["phase"]].append(r)
    on_gpu = doc["target"]["measured_here"] and doc["measured"]["time"] == "cuda"
    points = []
    for (op, _, phase), rs in groups.items():
        t = sum(x["time_s"] for x in rs)
        floor = sum(x["floor_s"] for x in rs)
        flops = sum(x["flops"] for x in rs)
        y = (flops / t if t > 0 else 0.0) if on_gpu else (flops / floor if floor > 0 else 0.0)
        points.append({"name": rs[0]["name"], "phase": phase, "intensity": rs[0]["intensity"],
                       "y": y, "size": t if on_gpu else floor, "bound": rs[0]["bound"],
                       "peak": rs[0]["peak"], "calls": len(rs)})
    return points


def roofline_svg(doc: dict) -> str:
    plt = _pyplot()
    tg = doc["target"]
    on_gpu = tg["measured_here"] and doc["measured"]["time"] == "cuda"
    points = [p for p in roofline_points(doc) if p["y"] > 0]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    lo = min([p["intensity"] for p in points] + [0.1]) / 3
    hi = max([p["intensity"] for p in points] + [1e3]) * 3
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for key in sorted({p["peak"] for p in points} | {"fp32"}):
        peak = tg["peak_flops"].get(key) or tg["peak_flops"]["fp32"]
        ax.plot(xs, [min(peak, x * tg["bandwidth"]) for x in xs], ":" if key == "fp32" else "-",
                color="#333333", lw=1.2, label=f"roof, {key} peak {peak / 1e12:.0f} TFLOP/s")
    total = sum(p["size"] for p in points) or 1.0
    for bound, color in _COLORS.items():
        ps = [p for p in points if p["bound"] == bound]
        if ps:
            ax.scatter([p["intensity"] for p in ps], [p["y"] for p in ps], c=color, alpha=0.65,
                       s=[15 + 1500 * p["size"] / total for p in ps], edgecolors="black",
                       linewidths=0.4, label=f"{bound}-bound")
    labelled = set()
    for p in sorted(points, key=lambda p: -p["size"]):
        if len(labelled) >= 8 or p["name"] in labelled:
            continue
        labelled.add(p["name"])
        ax.annotate(p["name"], (p["intensity"], p["y"]), fontsize=7, xytext=(4, -10),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("FLOP/s reached (measured)" if on_gpu else "FLOP/s at the floor (projected)")
    no_flops = sum(r["time_s"] for r in doc["rows"] if r["launches_kernel"] and not r["flops"])
    share = no_flops / (doc["summary"]["op_time_s"] or 1.0)
    ax.set_title(f"roofline on {tg['name']} ({tg['roof_source']} ceilings); point size = "
                 f"{'measured time' if on_gpu else 'floor time'}; ops without FLOPs "
                 f"(copies, casts: {100 * share:.0f}% of time) not shown", fontsize=8)
    legend = ax.legend(fontsize=7, loc="lower right")
    for handle in legend.legend_handles:
        if hasattr(handle, "set_sizes"):
            handle.set_sizes([30])
    ax.grid(True, which="both", alpha=0.2)
    return _svg(fig)


def breakdown_svg(doc: dict, n: int = 12) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    floor_total = doc["summary"]["floor_s"] or 1.0
    projected = doc["measured"]["time"] == "projected"
    for ax, key, title in ((axes[0], "by_type", "by op type"), (axes[1], "by_class", "by module class")):
        groups = doc[key][:n][::-1]
        names = [str(g["key"]).replace("aten.", "").replace(".default", "") for g in groups]
        ys = range(len(groups))
        if projected:  # the times are the floors: one bar
            ax.barh(list(ys), [100 * g["floor_s"] / floor_total for g in groups], height=0.6,
                    color="#e9c46a", label=f"projected floor on {doc['target']['key']}")
        else:
            ax.barh([y + 0.2 for y in ys], [100 * g["time_share"] for g in groups], height=0.4,
                    color="#457b9d", label=f"measured time ({doc['measured']['time']})")
            ax.barh([y - 0.2 for y in ys], [100 * g["floor_s"] / floor_total for g in groups],
                    height=0.4, color="#e9c46a", label=f"floor on {doc['target']['key']}")
        ax.set_yticks(list(ys))
        ax.set_yticklabels(names, fontsize=7)
        ax.set_xlabel("% of the step")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    if projected:
        title = (f"where the time goes: {fmt.seconds(doc['summary']['floor_s'])} of projected floors "
                 f"on {doc['target']['key']} (nothing was run)")
    else:
        title = (f"where the time goes: {fmt.seconds(doc['summary']['op_time_s'])} of op time measured "
                 f"({doc['measured']['time']}), {fmt.seconds(doc['summary']['floor_s'])} of floors on "
                 f"{doc['target']['key']}")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _svg(fig)
