"""The shaping as a terminal summary (rich) and a page in the report's style (jinja2)."""

from __future__ import annotations

from pathlib import Path

from speedlight.profile.fmt import FLOP_UNITS, scaled

TEMPLATE = "shape.html.j2"


# the shaping's numbers: three significant digits, decimal units, blank for None
def seconds_3g(s: float | None) -> str:
    if s is None:
        return ""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def bytes_3g(n: float | None) -> str:
    return scaled(n, (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)), "B", spec=".3g", none="")


def flops_3g(n: float | None) -> str:
    return scaled(n, FLOP_UNITS, "FLOP", spec=".3g", none="")


def _shape_text(metas: list[dict]) -> str:
    return ", ".join(f"{m['shape']} {m['dtype']}" + ("" if _contiguous(m) else f" stride {m['stride']}")
                     for m in metas)


def _contiguous(m: dict) -> bool:
    expect, acc = [], 1
    for d in reversed(m["shape"]):
        expect.append(acc)
        acc *= d
    return all(s == e or d == 1 for s, e, d in zip(m["stride"], reversed(expect), m["shape"]))


def print_inductor(doc: dict, console) -> None:
    """torch.compile's kernels as inspect read them, against the fused floor."""
    from rich.table import Table

    ind = doc["inductor"]
    if ind["status"] != "ran":
        console.print(f"[bold]torch.compile[/]: {ind['status']}: {ind['reason']}")
        return
    t = Table(title=f"torch.compile's Triton kernels ({ind['where']})")
    for col in ("phase", "kernel", "grid", "config", "regs", "spills", "occupancy",
                "narrowest row access", "reads", "writes", "predicted"):
        t.add_column(col, justify="right" if col in ("regs", "spills", "reads", "writes",
                                                      "predicted") else "left")
    for k in ind["kernels"]:
        if "error" in k:
            t.add_row(k["phase"][:3], k["kernel"], "", "", "", "", "", f"[red]{k['error'][:60]}[/]", "", "", "")
            continue
        p = k.get("predicted") or {}
        pred = f"{p['us']:,.1f} us {p['bound']}" if "us" in p else "-"
        t.add_row(k["phase"][:3], k["kernel"], "x".join(map(str, k["grid"])),
                  ", ".join(f"{n}={v}" for n, v in k["config"].items()) + f", {k['num_warps']} warps",
                  str(k["registers"]), str(k["spill_bytes"]), f"{k['occupancy']['fraction']:.0%}",
                  narrowest(k["accesses"]), bytes_3g(k["read_bytes"]), bytes_3g(k["written_bytes"]),
                  pred)
    console.print(t)
    if any("us" in (k.get("predicted") or {}) for k in ind["kernels"]):
        console.print("  predicted: per launch on the target, read from the compiled kernel "
                      "(speedlight inspect's model), not measured")
    for phase, p in ind["phases"].items():
        over = (f" = [bold]{p['bytes_over_floor']:.2f}x[/] the fused floor's {bytes_3g(p['fused_floor_bytes'])}"
                if p["bytes_over_floor"] else "")
        console.print(f"  {phase}: {p['launches']} launches moving {bytes_3g(p['bytes'])}{over}")
    if ind.get("extern_calls"):
        console.print("  plus library kernels inductor calls, not generated (not read here): "
                      + ", ".join(f"{n} x{c}" for n, c in ind["extern_calls"].items()))
    for f in ind["findings"]:
        console.print(f"  [yellow]•[/] {f['kernel']}: {f['text']}")
    console.print(f"[dim]{ind['config_note']}[/]")


def narrowest(accesses: list[dict]) -> str:
    """The narrowest compiled access among those the addresses allowed 128 bits for."""
    wide = [a for a in accesses if a["possible_bits"] >= 128 and a["bits"]]
    if not wide:
        return ""
    a = min(wide, key=lambda a: a["bits"])
    return f"{a['bits']}-bit {a['kind']} (128 possible), line {a['line']}"


def print_shaping(doc: dict, console, top: int = 30) -> None:
    from rich.table import Table

    ins = ", ".join(f"{i['name']}={i['shape']}:{i['dtype']}" for i in doc["inputs"])
    console.print(f"[bold]speedlight shape[/] {doc['function']}({ins}){' forward + backward' if doc['train'] else ''}")
    console.print(f"[dim]{doc['target_note']}. Projected from fake tensors: no computation.[/]")
    t = Table(title="aten ops (eager)", show_lines=False)
    for col in ("#", "phase", "op", "inputs", "outputs", "FLOP", "bytes", "family"):
        t.add_column(col, justify="right" if col in ("#", "FLOP", "bytes") else "left")
    for o in doc["ops"][:top]:
        t.add_row(str(o["index"]), o["phase"][:3], o["op"], _shape_text(o["inputs"]),
                  _shape_text(o["outputs"]), f"{o['flops']:,}", f"{o['bytes']:,}",
                  o["family"] + ("" if o["kernel"] else " (no launch)"))
    console.print(t)
    if len(doc["ops"]) > top:
        console.print(f"[dim]... {len(doc['ops']) - top} more ops in the JSON[/]")
    f = Table(title=f"floors on {doc['target']['name']}")
    for col in ("phase", "", "FLOP", "bytes", "floor", "with launches", "launches", "bound"):
        f.add_column(col, justify="left" if col in ("phase", "", "bound") else "right")
    for p in doc["phases"]:
        fu, e = p["fused"], p["eager"]
        f.add_row(p["phase"], "fused (one kernel)", flops_3g(fu["flops"]), bytes_3g(fu["bytes"]),
                  seconds_3g(fu["floor_s"]), seconds_3g(max(fu["floor_s"], doc["launch_s"])), "1", fu["bound"])
        f.add_row("", "eager (sum of ops)", flops_3g(e["flops"]), bytes_3g(e["bytes"]), seconds_3g(e["floor_s"]),
                  seconds_3g(e["with_launch_s"]), str(e["launches"]), e["bound"])
        f.add_row("", "[bold]fusion could gain[/]", "", f"{p['bytes_ratio']:.2f}x fewer", "",
                  f"[bold]{p['gain']:.2f}x[/]", "", "")
    console.print(f)
    for p in doc["phases"]:
        if p["eager"]["uncounted"]:
            console.print(f"[yellow]{p['phase']}: no formula for {', '.join(p['eager']['uncounted'])} "
                          f"(its bytes counted, its FLOPs not)[/]")
    console.print("[bold]advice[/]" if doc["advice"] else "[bold]advice[/]: none at these shapes")
    for a in doc["advice"]:
        console.print(f" • [bold]{a['title']}[/] ({a['kind']}): {a['evidence']}\n   → {a['number']}")
    print_inductor(doc, console)
    if doc["spec_file"]:
        console.print(f"[bold]spec file[/]: {doc['spec_file']}  →  speedlight verify --spec "
                      f"{doc['spec_file']} --only-spec")


def render_html(doc: dict) -> str:
    try:
        import jinja2
    except ImportError:
        raise RuntimeError("the HTML page needs jinja2: pip install 'speedlight[report]'") from None
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=seconds_3g, nbytes=bytes_3g, flops=flops_3g, shapes=_shape_text, narrowest=narrowest)
    return env.get_template(TEMPLATE).render(doc=doc)
