"""The terminal view of a projected profile: how it was made, and its comparisons."""

from __future__ import annotations

from speedlight.profile import fmt


def projected_summary(doc: dict, console) -> None:
    s, tg, pj = doc["summary"], doc["target"], doc["projection"]
    t = fmt.table(f"projected step on {tg['name']} (floors, not step times)", "what", "value",
                  "how it was found", right=("value",))
    t.add_row("sum of floors", fmt.seconds(s["floor_s"]), "max(FLOPs/peak, bytes/bandwidth) per op")
    t.add_row("  with a launch per kernel", fmt.seconds(s["floor_with_launch_s"]),
              f"each kernel at least {fmt.seconds(tg['launch_s'])} (eager; CUDA graphs recover it)")
    if pj.get("tokens_per_s_at_floor"):
        t.add_row("tokens/s at the floor", f"{pj['tokens_per_s_at_floor']:,.0f}",
                  f"{pj['tokens']} tokens / sum of floors")
    t.add_row("FLOPs / bytes", f"{fmt.flops(s['flops'])} / {fmt.nbytes(s['bytes'])}", "formulas (costs.py)")
    t.add_row("ops", str(s["ops"]), f"{s['launch']['kernel_ops']} launch a kernel")
    whole = sum(s["floor_by_bound_s"].values()) or 1.0
    t.add_row("floor by bound", " ".join(f"{b} {fmt.share(v / whole)}" for b, v in
                                         sorted(s["floor_by_bound_s"].items(), key=lambda kv: -kv[1]) if v),
              "floors with a launch per kernel, per bound")
    block = pj["moe"].get("block") if isinstance(pj.get("moe"), dict) else None
    if block:
        t.add_row("expert block", f"{fmt.seconds(block['floor_s'])} ({fmt.share(block['share'])})",
                  f"{', '.join(block['classes'])}"
                  f"{' forward and backward' if doc['run']['mode'] == 'train' else ''}: "
                  f"{block['bound']}-bound, "
                  f"{fmt.flops(block['flops'])} / {fmt.nbytes(block['bytes'])}; its share of "
                  f"the sum of floors")
    t.add_row("dispatch", pj["dispatch"], pj["dispatch_note"])
    for a in pj["attention"]:
        t.add_row("attention", f"{a['backend']} x{a['calls']}", a["why"])
    if pj.get("recipe"):
        t.add_row("recipe", pj["recipe"]["name"], pj["recipe"]["text"])
    ws = doc.get("with_speedlight")
    if ws:
        t.add_row("with speedlight's ops", fmt.seconds(ws["floor_s"]),
                  f"the model patched and projected again: {fmt.seconds(ws['saved_s'])} of floor and "
                  f"{fmt.nbytes(ws['saved_bytes'])} of peak memory saved, {ws['kernel_ops']} kernel ops")
        wb = ws.get("expert_block")
        if wb:
            t.add_row("  expert block", f"{fmt.seconds(wb['floor_s'])} ({fmt.share(wb['share'])})",
                      f"on moe_experts: {wb['bound']}-bound, {fmt.flops(wb['flops'])} / "
                      f"{fmt.nbytes(wb['bytes'])}")
    t.add_row("projected in", fmt.seconds(pj["seconds"]), "wall time of the fake step on this machine")
    console.print(t)
    predicted(ws or {}, console)


def predicted(ws: dict, console) -> None:
    """speedlight's ops in the patched step: projected floor beside the time predicted from
    their compiled kernels (profile --project --predict)."""
    rows = ws.get("predicted")
    if not rows:
        return
    t = fmt.table(f"speedlight's ops, predicted on {rows[0]['sku']} from their compiled kernels "
                  f"(predicted, not measured; floors projected)", "op", "case", "dir", "calls",
                  "floor / call", "predicted / call", "bound", "predicted in the step",
                  right=("calls", "floor / call", "predicted / call", "predicted in the step"))
    for r in rows:
        if "predicted_us" in r:
            t.add_row(r["op"], r["case_id"], r["direction"], str(r["calls"]),
                      fmt.seconds(r["floor_us"] * 1e-6), fmt.seconds(r["predicted_us"] * 1e-6),
                      r["bound"], fmt.seconds(r["step_predicted_us"] * 1e-6))
        else:
            t.add_row(r["op"], r["case_id"], r["direction"], str(r["calls"]),
                      fmt.seconds(r["floor_us"] * 1e-6), "-", r["why"][:60], "-")
    console.print(t)


def comparison(doc: dict, console) -> None:
    c = doc.get("comparison")
    if not c:
        return
    shard = c.get("shard")
    patched = any("patched_floor_s" in r for r in c["rows"])
    cols = ["GPU", "floor", "tokens/s", "compute", "memory", "launch", "peak memory", "fits"]
    if shard:
        cols += [f"per GPU, {shard}-way sharded", "fits "]
    if patched:
        cols += ["with speedlight", "tokens/s "]
    t = fmt.table(f"the same step on each GPU ({c['label']})", *cols,
                  right=tuple(cols[1:7]) + (f"per GPU, {shard}-way sharded", "with speedlight", "tokens/s "))
    for r in c["rows"]:
        b = r["floor_by_bound_s"]
        cells = [r["target"], fmt.seconds(r["floor_s"]),
                 f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-",
                 fmt.seconds(b.get("compute", 0.0)), fmt.seconds(b.get("memory", 0.0)),
                 fmt.seconds(b.get("launch", 0.0)),
                 f"{fmt.nbytes(r['peak_bytes'])} of {fmt.nbytes(r['memory_bytes'])}",
                 "yes" if r["fits"] else "[red]no[/]"]
        if shard:
            cells += [fmt.nbytes(r["sharded_peak_bytes"]), "yes" if r["sharded_fits"] else "[red]no[/]"]
        if patched:
            cells += [fmt.seconds(r.get("patched_floor_s")),
                      f"{r['patched_tokens_per_s']:,.0f}" if r.get("patched_tokens_per_s") else "-"]
        t.add_row(*cells)
    console.print(t)
    if shard:
        console.print(f"[dim]{c['shard_note']}; largest layer {c['largest_layer']} "
                      f"{fmt.nbytes(c['largest_layer_bytes'])}[/]")


def variations(doc: dict, console) -> None:
    v = doc.get("variations")
    if not v:
        return
    families = sorted({k for r in v["rows"] for k in r["split_s"]},
                      key=lambda k: -max(r["split_s"].get(k, 0.0) for r in v["rows"]))[:5]
    t = fmt.table(f"design choices ({v['label']})", "field", "value", "floor", "tokens/s",
                  *families, "peak memory", "fits",
                  right=("floor", "tokens/s", *families, "peak memory"))
    for r in v["rows"]:
        t.add_row(r["field"], str(r["value"]), fmt.seconds(r["floor_s"]),
                  f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "-",
                  *[fmt.seconds(r["split_s"].get(f, 0.0)) for f in families],
                  fmt.nbytes(r["peak_bytes"]), "yes" if r["fits"] else "[red]no[/]")
    console.print(t)
