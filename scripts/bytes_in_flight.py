"""Bytes in flight per SM of every memory-bound kernel at its bench shapes, as `speedlight
inspect` counts them from the SASS compiled for a target (sm_90a, sm_100a) on a CPU: a
prediction, no GPU involved.

    python scripts/bytes_in_flight.py --target sm_90a --out FILE.jsonl [--ops a,b]

For each op of the memory-bound family at hidden 4096 and 8192 with 4096 and 16384 rows
(bf16; `_suites.family_case` maps "hidden" onto each op's own width), the forward and the
backward launches are recorded dry (meta tensors, sized for the target's flagship SKU, as
`speedlight inspect --mode dry` records them), compiled, and read by inspect. One row per
launch: registers, spills, shared memory, occupancy, programs resident per SM, inspect's
predicted time and bound, the instructions, barriers and load bytes per thread of the
steady loop's iteration (of the whole kernel without a loop), and the bytes in flight:

  - a kernel with a loop: inspect's own figure for its steady-state loop (loops.Loop
    .in_flight: the most bytes a thread has issued and not yet used, cp.async groups
    included, x threads x programs resident) and its in-flight finding, which holds it to
    Little's law (predict.needed_in_flight) on average over an iteration;
  - a kernel without one (one tile per program), for which inspect has no steady loop: the
    same count over the whole kernel (inspect's loop reader on a span of every
    instruction), held to the same rule: in flight for the memory latency's share of the
    predicted time of the code outside loops, and clear where the model finds that code
    bandwidth-bound.

`finding` is "clear" or "short"; a short launch whose tensors together fit a quarter of the
L2 carries the reason "l2-resident" (a weight gradient's partial rows, written by the kernel
just before, are summed from L2, not DRAM).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROWS = (4096, 16384)
HIDDEN = (4096, 8192)
OPS = "rms_norm,add_rms_norm,layer_norm,swiglu,geglu,rope,softmax,cross_entropy"


def _tensor_bytes(arg) -> int:
    """Bytes a tensor argument spans, from its shape and strides (meta tensors have no
    addresses); a placeholder argument counts again: an upper bound."""
    if not arg.shape:
        return 0
    span = 1 + sum((n - 1) * abs(st) for n, st in zip(arg.shape, arg.strides) if n > 0)
    from speedlight.spec import parse_dtype

    try:
        dtype = parse_dtype(arg.dtype)
    except (ValueError, KeyError):
        dtype = getattr(torch, str(arg.dtype), torch.float32)
    return span * dtype.itemsize


def in_flight(k, sku, target_name: str) -> dict:
    """The bytes-in-flight figure of one analysed launch (inspect's KernelReport): the
    fields of a row, `finding` among them."""
    from speedlight import predict
    from speedlight.inspect import findings, loops, sass

    need = predict.needed_in_flight(sku)
    threads = k.num_warps * k.warp_size
    lp = k.steady_loop
    if lp is not None:
        fig = k.in_flight_json()
        short = [f for f in findings.kernel_findings(k, target_name, sku)
                 if f.code == "in-flight"]
        have = short[0].evidence["per_sm"] if short else fig["per_sm"]
        return dict(source="steady loop", loop_line=f"{Path(lp.file).name}:{lp.line}",
                    instructions=lp.instructions, barriers=lp.barriers,
                    load_bytes=lp.load_bytes, per_thread=lp.in_flight, threads=threads,
                    resident_per_sm=round(k.resident, 3), most_per_sm=fig["per_sm"],
                    in_flight_per_sm=int(have), need_per_sm=need, prefetch=lp.prefetch,
                    finding="short" if short else "clear",
                    text=short[0].text if short else "")
    instrs = sass.parse(k.compiled.text("sass"))
    whole = loops.Loop(0, "", 0, 0, 0, len(instrs) - 1)
    loops.measure_loops([whole], instrs, num_warps=k.num_warps)
    most = whole.in_flight * threads * k.resident
    p = k.predicted
    seg = None if p is None else next(
        (s for s in p.parts.get("segments", []) if s["where"] == "outside loops"), None)
    share = 1.0
    if seg is not None and seg["cycles"]:
        share = min(1.0, p.parts["memory_latency_cycles"] / seg["cycles"])
    have = most * share
    bandwidth_bound = seg is not None and seg["bound"] == "memory"
    return dict(source="whole kernel (no loop)", loop_line=None,
                instructions=whole.instructions, barriers=whole.barriers,
                load_bytes=whole.load_bytes, per_thread=whole.in_flight,
                threads=threads, resident_per_sm=round(k.resident, 3), most_per_sm=int(most),
                in_flight_per_sm=int(have), need_per_sm=need, prefetch=False,
                share_of_program=round(share, 3),
                finding="clear" if bandwidth_bound or have >= need else "short", text="")


def rows_for(op: str, target_name: str, shapes=None, dtype=torch.bfloat16,
             dump: Path | None = None) -> list[dict]:
    """One row per launch of `op` at each (rows, hidden) of `shapes` (default: every pair
    of ROWS and HIDDEN), both directions."""
    from speedlight import registry
    from speedlight.inspect.case_report import analyse_kernel
    from speedlight.inspect.compile import TritonCompiler
    from speedlight.inspect.launches import capture_case
    from speedlight.launch import for_target
    from speedlight.ops._suites import family_case
    from speedlight.target import resolve

    target = resolve(target_name)
    sku = target.sku
    spec = registry.builtin_spec(op)
    compiler = TritonCompiler()
    out = []
    for rows, hidden in shapes or [(r, h) for r in ROWS for h in HIDDEN]:
        case = family_case(op, rows, hidden, dtype)
        with for_target(target):  # the launches the target's users get, on meta tensors
            capture = capture_case(spec, case, "meta", arch=target.arch, mode="dry")
        binaries = compiler.compile(capture.launches, target)
        for launch in capture.launches:
            compiled = binaries[launch.key(target.arch_name)]
            k = analyse_kernel(launch, compiled, target, sku,
                               spec.design(launch.kernel, target.arch))
            row = {"op": op, "case": case.label, "direction": launch.direction,
                   "kernel": launch.kernel, "target": target.arch_name, "sku": sku.key,
                   "grid": list(launch.grid), "predicted": True}
            if not k.ok:
                out.append(dict(row, error=k.error))
                continue
            if dump is not None:
                compiled.dump(dump / op / case.label, f"{launch.direction}-{launch.kernel}")
            fig = in_flight(k, sku, target.arch_name)
            touched = sum(_tensor_bytes(a) for a in launch.args if a.kind == "tensor")
            if fig["finding"] == "short" and touched < sku.l2_bytes // 4:
                fig["reason"] = "l2-resident"  # the partial rows the kernel before just wrote
            p = k.predicted
            row.update(
                warps=k.num_warps, registers=k.registers, spills=k.spill_stores,
                smem=k.smem, stages=k.stages, occupancy=round(k.occupancy.fraction, 3),
                programs_per_sm=k.occupancy.blocks_per_sm,
                busy_sms=min(sku.sm_count, launch.programs), tensor_bytes=touched,
                predicted_us=round(p.us, 3) if p else None,
                predicted_bound=p.bound if p else None, **fig)
            out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--out", required=True)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--dump", default=None, help="write each kernel's SASS... here")
    parser.add_argument("--shapes", default="", help="ROWSxHIDDEN,... (default: all four)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    rows = []
    for op in args.ops.split(","):
        got = rows_for(op, args.target, shapes, dump=Path(args.dump) if args.dump else None)
        rows += got
        for r in got:
            print(f"{r['op']:13s} {r['case']:32s} {r['direction']} {r['kernel']:34s} "
                  + (f"error {r['error']}" if "error" in r else
                     f"regs {r['registers']:3d} occ {r['occupancy']:.3f} "
                     f"res {r['resident_per_sm']:5.2f} {r['instructions']:4d} instr "
                     f"{r['per_thread']:4d} B/thread "
                     f"in flight {r['in_flight_per_sm'] / 1024:6.1f} KB "
                     f"(most {r['most_per_sm'] / 1024:6.1f}) / need "
                     f"{r['need_per_sm'] / 1024:4.1f} KB {r['finding']} {r.get('reason', '')} "
                     f"[{r['predicted_bound']} {r['predicted_us']} us]"), flush=True)
    from speedlight import results

    env = results.environment("cpu")
    rows = [dict(r, **{k: env.get(k) for k in ("git", "triton", "torch", "timestamp")})
            for r in rows]
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
