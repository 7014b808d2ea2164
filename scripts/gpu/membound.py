"""The memory-bound family against a copy, on a GPU: every op (rms_norm, add_rms_norm,
layer_norm, swiglu, geglu, rope, softmax, cross_entropy) at hidden 4096 and 8192 with 4096
and 16384 rows (bf16; `_suites.family_case` maps hidden onto each op's width), forward and
backward, against PyTorch eager, torch.compile and Liger-Kernel, beside a `copy_` moving
the same bytes (the op's compulsory bytes in that direction) timed in the same run.

    python scripts/gpu/membound.py --out DIR [--budget-s 240] [--ops a,b]
                                   [--rows 4096,16384] [--hidden 4096,8192]

Verify first: every op's smallest shape (the first --rows by the first --hidden) through
the float64 judge (`verify_case`), rows in DIR/verify.jsonl. Then bench (which verifies
each case again where its float64 reference fits) writes DIR/bench.jsonl, the copies
DIR/copy.jsonl (implementation `copy_`), and DIR/summary.json gives, per op, shape and
direction, each implementation's GB/s and its share of the copy's. A case the budget did
not reach is a skip row with that reason. Without a GPU the kernels run on the Triton
interpreter and the timings are labelled not representative (the CPU test runs it so).

Targets (issue 51; read from summary.json, not asserted): with >= 4096 rows, forward >=
0.90x and backward >= 0.85x the copy's GB/s, ahead of torch.compile and Liger.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

OPS = ("rms_norm", "add_rms_norm", "layer_norm", "swiglu", "geglu", "rope", "softmax",
       "cross_entropy")
BASELINES = ("torch-eager", "torch-compile", "liger")
MODES = ("fwd", "bwd")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def copy_rows(bench, spec, case, device) -> list[dict]:
    """`copy_` rows beside the op's: a device copy moving the op's compulsory bytes of each
    mode (half read, half written), timed as bench times (L2 flushed between samples)."""
    from speedlight.bench import metrics
    from speedlight.bench.sizing import mode_cost
    from speedlight.bench.timer import clock_for, flush_for, measure

    rows = []
    for mode in MODES:
        cost = mode_cost(spec, case, mode)
        row = dict(bench.base_row(spec, case, "copy_", mode))
        if cost is None:
            rows.append(dict(row, status="skip", reason=f"{spec.name} has no backward"))
            continue
        n = max(1, cost.bytes // 2)
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        m = measure(lambda k: dst.copy_(src), clock=clock_for(device), rule=bench.timer.rule,
                    flush=flush_for(device))
        median = statistics.median(m.samples)
        row.update(status="ok", median_us=median * 1e6, samples_us=[s * 1e6 for s in m.samples],
                   **metrics.throughput(cost, median), copied_bytes=2 * n)
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """op -> case -> mode -> {implementation: {gbps, of_copy}}: each implementation's GB/s
    (the op's compulsory bytes over its median) and its share of the copy's."""
    out: dict = {}
    copies = {(r["op"], r["case_label"], r["mode"]): r.get("gbps") for r in rows
              if r["implementation"] == "copy_" and r.get("status") == "ok"}
    for r in rows:
        if r.get("status") != "ok" or r.get("gbps") is None:
            continue
        copy = copies.get((r["op"], r["case_label"], r["mode"]))
        entry = {"gbps": float(f"{r['gbps']:.4g}"), "median_us": float(f"{r['median_us']:.4g}")}
        if copy:
            entry["of_copy"] = float(f"{r['gbps'] / copy:.4g}")
        out.setdefault(r["op"], {}).setdefault(r["case_label"], {}).setdefault(
            r["mode"], {})[r["implementation"]] = entry
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--rows", default="4096,16384")
    parser.add_argument("--hidden", default="4096,8192")
    parser.add_argument("--baselines", default=",".join(BASELINES))
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    from speedlight import registry, results
    from speedlight.bench.baselines import Baselines
    from speedlight.bench.runner import Bench, Settings
    from speedlight.ops._suites import family_case
    from speedlight.runtime import select_device
    from speedlight.verify.harness import verify_case

    start = time.perf_counter()
    device = torch.device(select_device(args.device))
    out = results.writable_folder(args.out)
    ops = [o for o in args.ops.split(",") if o]
    rows_list, hidden_list = _ints(args.rows), _ints(args.hidden)
    specs = [registry.builtin_spec(o) for o in ops]

    # 1. verify first, at the smallest shape (its float64 reference fits any GPU)
    verified = []
    for spec in specs:
        case = family_case(spec.name, rows_list[0], hidden_list[0], torch.bfloat16)
        r = verify_case(spec, case, device)
        verified.append(dict(r.to_row(), **results.environment(device)))
        print(f"verify {spec.name:13s} {case.label:40s} {r.status} {r.reason}", flush=True)
    results.write_atomic(out / "verify.jsonl", "".join(json.dumps(v) + "\n" for v in verified))

    # 2. bench every shape against the baselines, a copy of the same bytes beside each
    names = tuple(n for n in args.baselines.split(",") if n and n != "none")
    bench = Bench(device, Settings(modes=MODES), Baselines(names), suite="membound")
    rows: list[dict] = []

    def on_case(spec, case, case_rows):
        ran = [r for r in case_rows if r.get("status") == "ok"]
        extra = copy_rows(bench, spec, case, device) if ran else [
            dict(bench.base_row(spec, case, "copy_", m), status="skip",
                 reason="the op's case did not run") for m in MODES]
        rows.extend(case_rows + extra)
        for r in case_rows + extra:
            if r.get("status") == "ok":
                print(f"{spec.name:13s} {case.label:40s} {r['mode']:4s} "
                      f"{r['implementation']:16s} {r['gbps']:8.1f} GB/s", flush=True)

    budget = max(0.0, args.budget_s - (time.perf_counter() - start))
    bench.run(specs, lambda spec: [family_case(spec.name, r, h, torch.bfloat16)
                                   for r in rows_list for h in hidden_list],
              budget_s=budget, on_case=on_case)
    bench_rows = [r for r in rows if r["implementation"] != "copy_"]
    results.write_atomic(out / "bench.jsonl", "".join(json.dumps(r) + "\n" for r in bench_rows))
    results.write_atomic(out / "copy.jsonl", "".join(
        json.dumps(r) + "\n" for r in rows if r["implementation"] == "copy_"))
    results.write_json(out / "summary.json", {
        "device": str(device), "representative": device.type == "cuda",
        "seconds": round(time.perf_counter() - start, 1), "ops": summarize(rows)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
