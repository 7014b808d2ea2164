"""Charts of a projection's comparisons, drawn with matplotlib from the JSON document, as
SVG text (the profile page's style: the bound colors of charts.py)."""

from __future__ import annotations

from speedlight.profile.charts import _COLORS, _pyplot, _svg

_FAMILY_COLORS = ["#2a9d8f", "#e76f51", "#457b9d", "#e9c46a", "#8d99ae", "#f4a261", "#6a4c93", "#bbbbbb"]


def targets_svg(doc: dict) -> str:
    """Left: the floor of the step on each GPU, split by bound; right: its peak memory (and
    per GPU when sharded) against each GPU's capacity."""
    plt = _pyplot()
    c = doc["comparison"]
    rows = c["rows"]
    names = [r["target"] for r in rows]
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(11, 3.8))
    left = [0.0] * len(rows)
    for bound in ("compute", "memory", "launch", "unknown"):
        vals = [1e3 * r["floor_by_bound_s"].get(bound, 0.0) for r in rows]
        if any(vals):
            ax.barh(names, vals, left=left, color=_COLORS[bound], label=f"{bound}-bound")
            left = [a + b for a, b in zip(left, vals)]
    for y, r in enumerate(rows):
        if r["tokens_per_s"]:
            ax.annotate(f" {r['tokens_per_s']:,.0f} tokens/s", (left[y], y), va="center", fontsize=7)
    ax.set_xlabel("projected floor of one step (ms)")
    ax.set_xlim(0, max(left + [1e-9]) * 1.35)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("time: sum of per-op floors, by bound", fontsize=9)
    gib = 2 ** 30
    ys = range(len(rows))
    mx.barh([y + 0.2 for y in ys], [r["peak_bytes"] / gib for r in rows], height=0.4, color="#457b9d",
            label="peak, one GPU")
    if c.get("shard"):
        mx.barh([y - 0.2 for y in ys], [r["sharded_peak_bytes"] / gib for r in rows], height=0.4,
                color="#2a9d8f", label=f"per GPU, {c['shard']}-way sharded")
    for y, r in enumerate(rows):
        mx.plot([r["memory_bytes"] / gib] * 2, [y - 0.45, y + 0.45], color="#e63946", lw=2)
    mx.plot([], [], color="#e63946", lw=2, label="GPU memory")
    mx.set_yticks(list(ys))
    mx.set_yticklabels(names)
    mx.set_xlabel("GiB")
    mx.legend(fontsize=7, loc="lower right")
    mx.set_title("memory: does the step fit?", fontsize=9)
    fig.suptitle(f"{doc['run']['model']}, {doc['run']['mode']}, batch {doc['run']['batch']} x seq "
                 f"{doc['run']['seq']}: projected floors, not step times", fontsize=9)
    fig.tight_layout()
    return _svg(fig)


def variations_svg(doc: dict) -> str:
    """Per swept field: the floor split by cost family (stacked), and the peak memory."""
    plt = _pyplot()
    v = doc["variations"]
    fields = v["fields"]
    fig, axes = plt.subplots(1, len(fields), figsize=(5.5 * len(fields), 4), squeeze=False)
    ranked = sorted({k for r in v["rows"] for k in r["split_s"]},
                    key=lambda k: -sum(r["split_s"].get(k, 0.0) for r in v["rows"]))
    families = ranked[:len(_FAMILY_COLORS) - 1]
    colors = {f: _FAMILY_COLORS[i] for i, f in enumerate(families)}
    if len(ranked) > len(families):  # the small families as one bar segment
        families.append("other")
        colors["other"] = _FAMILY_COLORS[-1]
    split = {id(r): dict(r["split_s"], other=sum(t for k, t in r["split_s"].items() if k not in families))
             for r in v["rows"]}
    for ax, field in zip(axes[0], fields):
        rows = [r for r in v["rows"] if r["field"] == field]
        labels = [str(r["value"]) for r in rows]
        bottom = [0.0] * len(rows)
        for fam in families:
            vals = [1e3 * split[id(r)].get(fam, 0.0) for r in rows]
            if any(vals):
                ax.bar(labels, vals, bottom=bottom, color=colors[fam], label=fam)
                bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_xlabel(field)
        ax.set_ylabel("projected floor (ms)")
        mem = ax.twinx()
        mem.plot(labels, [r["peak_bytes"] / 2 ** 30 for r in rows], "o-", color="#e63946", label="peak memory")
        mem.set_ylabel("peak memory (GiB)", color="#e63946")
        mem.set_ylim(bottom=0)
        ax.legend(fontsize=6, loc="upper left", ncol=2)
        ax.set_title(f"{field}: floor by op family, and peak memory", fontsize=9)
    fig.suptitle(v["label"], fontsize=9)
    fig.tight_layout()
    return _svg(fig)
