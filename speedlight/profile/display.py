"""The terminal view of a profile, drawn from its JSON document alone."""

from __future__ import annotations

from rich.console import Console

from speedlight.profile import fmt

_BOUND_STYLE = {"compute": "green", "memory": "cyan", "launch": "yellow", "none": "dim",
                "unknown": "bold red"}


def _bound(b: str) -> str:
    return f"[{_BOUND_STYLE.get(b, '')}]{b}[/]"


def header(doc: dict, console: Console) -> None:
    run, m, tg = doc["run"], doc["model"], doc["target"]
    params = m.get("parameters")
    console.print(f"[bold]speedlight profile[/]: {run['model']} ({fmt.count(params)} parameters), "
                  f"{run['mode']}, batch {run['batch']} x seq {run['seq']}, "
                  f"{run['dtype']}, on {doc['environment']['device']} ({run['device']})")
    console.print(f"[bold]target[/] {tg['name']}: {tg['bandwidth'] / 1e12:.2f} TB/s, "
                  f"{tg['roof_source']} ceilings. {doc['measured']['note']}")
    for n in doc.get("notes", []):
        console.print(f"[yellow]note[/]: {n}")


def summary(doc: dict, console: Console) -> None:
    s, time_kind = doc["summary"], doc["measured"]["time"]
    t = fmt.table("summary, per step", "what", "value", "how it was found", right=("value",))
    t.add_row("step time", fmt.seconds(s["step_time_s"]),
              f"measured, {time_kind}, median of {len(s['step_time_samples_s'])} clean steps")
    t.add_row("sum of op times", fmt.seconds(s["op_time_s"]),
              f"measured per op, {time_kind}, median of the recorded steps")
    t.add_row(f"sum of floors on {doc['target']['key']}", fmt.seconds(s["floor_s"]),
              "max(FLOPs/peak, bytes/bandwidth) per op")
    t.add_row("  with a launch per kernel", fmt.seconds(s["floor_with_launch_s"]),
              f"each kernel at least {fmt.seconds(doc['target']['launch_s'])}")
    if s["speed_of_light"] is not None:
        t.add_row("speed of light", fmt.share(s["speed_of_light"]), "sum of floors / step time")
    t.add_row("FLOPs / bytes", f"{fmt.flops(s['flops'])} / {fmt.nbytes(s['bytes'])}", "formulas (costs.py)")
    t.add_row("ops", str(s["ops"]), f"{s['launch']['kernel_ops']} launch a kernel")
    u = s["uncounted"]
    t.add_row("ops without a formula", f"{u['ops']} ({fmt.share(u['time_share'])} of op time)",
              ", ".join(u["names"][:4]) + (" ..." if len(u["names"]) > 4 else ""))
    on_target = doc["target"]["measured_here"] and time_kind == "cuda"
    by_bound = s["time_by_bound_s"] if on_target else s["floor_by_bound_s"]
    whole = sum(by_bound.values()) or 1.0
    t.add_row("time by bound" if on_target else "projected time by bound",
              " ".join(f"{b} {fmt.share(v / whole)}" for b, v in sorted(by_bound.items(), key=lambda kv: -kv[1]) if v),
              "measured op time per bound, idle = GPU idle between kernels" if on_target else
              f"floors (at least one launch per kernel) per bound on {doc['target']['key']}")
    launch = s["launch"]
    if launch["measured_idle_s"] is not None:
        t.add_row("GPU idle between kernels", fmt.seconds(launch["measured_idle_s"]), launch["note"])
    else:
        t.add_row("launch overhead", fmt.seconds(launch["projected_overhead_s"]), launch["note"])
    console.print(t)


def top_ops(doc: dict, console: Console, n: int) -> None:
    root = doc["model"].get("class")
    t = fmt.table(f"top ops by time ({doc['measured']['time']}; floors on {doc['target']['key']})",
                  "op", "phase", "input shapes", "calls", "time", "share", "FLOPs", "bytes",
                  "floor", "bound", "where",
                  right=("calls", "time", "share", "FLOPs", "bytes", "floor"))
    for g in doc["top_ops"][:n]:
        where = fmt.module_label(g["place"], root) \
            + (f" +{g['places'] - 1}" if g["places"] > 1 else "")
        shapes = g["shapes"] if len(g["shapes"]) <= 64 else g["shapes"][:61] + "..."  # foreach lists
        t.add_row(g["name"], g["phase"], shapes, str(g["calls"]), fmt.seconds(g["time_s"]),
                  fmt.share(g["time_share"]), fmt.flops(g["flops"]), fmt.nbytes(g["bytes"]),
                  fmt.seconds(g["floor_s"]), _bound(g["bound"]), where)
    console.print(t)


def groups(doc: dict, key: str, title: str, console: Console, n: int) -> None:
    root = doc["model"].get("class")
    measured = any(g["distance"] is not None for g in doc[key])
    cols = ["group", "calls", "time", "share", "FLOPs", "bytes", "floor"] + (["vs floor"] if measured else [])
    t = fmt.table(title, *cols, "bound", right=("calls", "time", "share", "FLOPs", "bytes", "floor", "vs floor"))
    for g in doc[key][:n]:
        name = fmt.module_label(g["key"], root) if key == "by_module" else str(g["key"])
        cells = [name, str(g["calls"]), fmt.seconds(g["time_s"]), fmt.share(g["time_share"]),
                 fmt.flops(g["flops"]), fmt.nbytes(g["bytes"]), fmt.seconds(g["floor_s"])]
        t.add_row(*cells, *([fmt.ratio(g["distance"])] if measured else []), _bound(g["bound"]))
    console.print(t)


def memory(doc: dict, console: Console) -> None:
    m = doc["memory"]
    t = fmt.table(f"memory at the peak: {fmt.nbytes(m['peak_bytes'])}"
                  + (f" (allocator peak {fmt.nbytes(m['allocator_peak_bytes'])})"
                     if m["allocator_peak_bytes"] is not None else ""),
                  "what", "at peak", "in the step", right=("at peak", "in the step"))
    totals = {"parameters": m["parameters_bytes"], "buffers": m["buffers_bytes"],
              "optimizer_state": m["optimizer_state_bytes"], "inputs": m["inputs_bytes"],
              "gradients": m["gradients_bytes"], "activations": m["activations_bytes"]}
    for cat, n in m["at_peak"].items():
        t.add_row(cat.replace("_", " "), fmt.nbytes(n), fmt.nbytes(totals.get(cat)))
    console.print(t)
    acts = m["activations_by_module"][:8]
    if acts:
        console.print("saved for backward, by module: " + ", ".join(
            f"{fmt.module_label(a['module'], doc['model'].get('class'))} {fmt.nbytes(a['bytes'])}"
            for a in acts))
    peaks = m.get("op_peaks", [])[:4]
    if peaks:
        console.print("speedlight ops' own peak (outputs and intermediates): " + ", ".join(
            f"{p['op']} {fmt.nbytes(p['bytes'])}"
            + (f" ({fmt.module_label(p['module'], doc['model'].get('class'))})"
               if p["module"] else "") for p in peaks))
    for n in m["notes"]:
        console.print(f"[dim]{n}[/]")


def advice(doc: dict, console: Console) -> None:
    adv = doc["advice"]
    if not adv:
        console.print("advice: no chain speedlight replaces was found")
        return
    t = fmt.table(f"what to fuse (estimates per step on {doc['target']['key']}: removed traffic / "
                  f"bandwidth; an op replacing GEMMs too: the chain's floors less its own)",
                  "speedlight op", "replaces", "instances", "time saved", "memory saved",
                  "launches removed", "status", "where",
                  right=("instances", "time saved", "memory saved", "launches removed"))
    for a in adv:
        where = ", ".join(fmt.module_label(m, doc["model"].get("class")) for m in a["modules"][:2])
        where += f" +{len(a['modules']) - 2}" if len(a["modules"]) > 2 else ""
        what = a["pattern"] + (f" [dim]({a['note']})[/]" if a["note"] else "")
        if "fused_floor_s" in a:
            what += (f" [dim](floors {fmt.seconds(a['unfused_floor_s'])} -> "
                     f"{fmt.seconds(a['fused_floor_s'])})[/]")
        t.add_row(a["op"], what,
                  str(a["instances"]), fmt.seconds(a["time_saved_s"]),
                  fmt.nbytes(a["memory_saved_bytes"]), str(a["launches_removed"]), a["status"], where)
    console.print(t)
    launch = doc["summary"]["launch"]
    gap = launch["measured_idle_s"] if launch["measured_idle_s"] is not None else launch["projected_overhead_s"]
    console.print(f"launch gaps, apart from fusion: {fmt.seconds(gap)} per step "
                  f"({launch['note']})")


def uncounted(doc: dict, console: Console) -> None:
    rows = [r for r in doc["rows"] if r["formula"] is None]
    if not rows:
        return
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["op"], []).append(r)
    total = doc["summary"]["op_time_s"] or 1.0
    t = fmt.table("ops without a cost formula (not counted in FLOPs, bytes or floors)",
                  "op", "calls", "time", "share", "why", right=("calls", "time", "share"))
    for op, rs in sorted(by.items(), key=lambda kv: -sum(r["time_s"] for r in kv[1])):
        tt = sum(r["time_s"] for r in rs)
        t.add_row(op, str(len(rs)), fmt.seconds(tt), fmt.share(tt / total), rs[0]["formula_detail"])
    console.print(t)


def print_profile(doc: dict, console: Console | None = None, top: int = 15) -> None:
    console = console or Console()
    header(doc, console)
    projected = doc["measured"]["time"] == "projected"
    if projected:
        from speedlight.profile import project_render
        project_render.projected_summary(doc, console)
        project_render.comparison(doc, console)
        project_render.variations(doc, console)
    else:
        summary(doc, console)
    top_ops(doc, console, top)
    groups(doc, "by_type", "by op type", console, top)
    groups(doc, "by_class", "by module class", console, 10)
    groups(doc, "by_module", "by module (the innermost one an op ran in)", console, 10)
    uncounted(doc, console)
    memory(doc, console)
    advice(doc, console)
