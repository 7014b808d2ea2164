"""Bytes in flight per SM of every memory-bound kernel at its bench shapes, read from the
SASS compiled for a target (sm_90a, sm_100a) on a CPU: a prediction, no GPU involved.

    python scripts/bytes_in_flight.py --target sm_90a --out FILE.jsonl [--ops a,b]

For each op of the memory-bound family at hidden 4096 and 8192 with 4096 and 16384 rows
(bf16; `_suites.family_case` maps "hidden" onto each op's own width), the forward and the
backward launches are recorded dry (meta tensors, sized for the target's flagship SKU, as
`speedlight inspect --mode dry` records them), compiled, and each kernel's SASS is read:

  - its steady-state loop: the loop (a backward branch) whose body issues the most global
    load bytes (the whole kernel when it has none: one tile per program);
  - per thread and iteration, the bytes of global loads whose result is read before any
    reduction of the iteration (`demand`: the SM waits on them before it can reduce) and
    of those first read only after a reduction (a warp shuffle) or the back edge
    (`prefetched`: loaded for the next iteration, in flight while this one reduces);
  - cp.async copies (LDGSTS) of a pipelined loop: STAGES - 1 shared-memory buffers (the
    TTGIR's), of which all but the one being read are in flight while a tile is reduced;
  - the programs resident per SM (occupancy, and the grid: a persistent grid of 1.97
    programs per SM has 1.97), and barriers (BAR) per iteration.

  in flight per SM = threads x (resident x (prefetched + async x (buffers - 1))
                               + (resident - 1) x demand)

While one program computes, every program's prefetched loads are outstanding and at most
the other programs' demand loads (the barriers of a row reduction keep a program's warps
together: its own loads are not in flight while it reduces). The need is Little's law,
bandwidth x latency / SMs, with the SKU's datasheet bandwidth and LATENCY_S below; a kernel
short of it gets the finding "short", unless every tensor it touches fits a quarter of the
L2 together ("l2-resident": a weight gradient's partial rows, written by the kernel just
before, are summed from L2, not DRAM). Until `speedlight inspect` reports its own figure
(the loop-reading issue), this script is how the memory-bound kernels' changes are judged.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# Loaded HBM latency assumed for the need (Little's law). Idle DRAM latency on Hopper is
# of the order of 500-600 ns; a memory system at full bandwidth queues requests, so 800 ns.
# On the H200 (run1) rms_norm's forward, 16 KB per SM by this count, reached 66% of copy:
# a need near 25-30 KB per SM, which this latency gives (29 KB at 4.8 TB/s over 132 SMs).
LATENCY_S = 800e-9
ROWS = (4096, 16384)
HIDDEN = (4096, 8192)

_LABEL = re.compile(r"^(\.L_x_\d+):")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)"
                    r"\s*([^;]*);")
_BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
_REG = re.compile(r"\bR(\d+)(\.64)?\b")
_STORES = ("STG", "STS", "ST", "STL", "RED", "REDG", "ATOM", "ATOMG", "ATOMS", "STSM")
_WIDTH = {"64": 64, "128": 128, "U16": 16, "S16": 16, "U8": 8, "S8": 8}


@dataclass
class Ins:
    opcode: str
    operands: list

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def width(self) -> int:
        for part in reversed(self.opcode.split(".")[1:]):
            if part in _WIDTH:
                return _WIDTH[part]
        return 32

    def _regs(self, operands, width: int = 32) -> set:
        out = set()
        for op in operands:
            for m in _REG.finditer(op):
                n = int(m.group(1))
                k = 2 if m.group(2) else max(1, width // 32)
                out.update(range(n, n + k))
        return out

    def written(self) -> set:
        if self.base in _STORES or self.base in ("BRA", "EXIT", "BAR") or not self.operands:
            return set()
        return self._regs(self.operands[:1], self.width if self.base == "LDG" else 32)

    def read(self) -> set:
        if self.base in _STORES:
            # the address (64-bit) and the data (the access's width)
            return self._regs(self.operands[:1]) | self._regs(self.operands[1:], self.width)
        return self._regs(self.operands[1:])


def parse(listing: str) -> tuple[list[Ins], dict, list]:
    """(instructions, label -> index of the next instruction, [(branch index, label)])."""
    instrs, labels, branches = [], {}, []
    for line in listing.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(instrs)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        ops = [o.strip().replace(".reuse", "") for o in m.group(4).split(",") if o.strip()]
        ins = Ins(m.group(3), ops)
        if ins.base == "BRA":
            t = _BRANCH_TARGET.search(m.group(4))
            if t:
                branches.append((len(instrs), t.group(1)))
        instrs.append(ins)
    return instrs, labels, branches


@dataclass
class LoopReading:
    loop: bool  # a steady-state loop was found (else: the whole kernel, one tile)
    demand_bytes: int = 0  # per thread per iteration
    prefetched_bytes: int = 0
    async_bytes: int = 0  # cp.async (LDGSTS) into a pipeline's shared-memory buffers
    buffers: int = 1  # the pipeline's buffers per loaded tile (TTGIR), 1 without one
    load_widths: dict = field(default_factory=dict)  # bits -> count in the body
    barriers: int = 0  # per iteration
    shuffles: int = 0


def read_loop(listing: str, buffers: int = 1) -> LoopReading:
    """The steady-state loop's loads (demand, prefetched or asynchronous copies) and
    barriers, per thread; `buffers`: the shared-memory buffers of its pipeline."""
    instrs, labels, branches = parse(listing)
    loops = [(labels[t], b) for b, t in branches if t in labels and labels[t] <= b
             and b - labels[t] > 1]

    def load_bytes(span):
        return sum(i.width // 8 for i in instrs[span[0]:span[1] + 1]
                   if i.base in ("LDG", "LDGSTS"))

    best = max(loops, key=lambda s: (load_bytes(s), -(s[1] - s[0])), default=None)
    if best is None or load_bytes(best) == 0:
        start, end, loop = 0, len(instrs) - 1, False
    else:
        (start, end), loop = best, True
    body = list(range(start, end + 1))
    reading = LoopReading(loop, buffers=buffers)
    for pos, idx in enumerate(body):
        ins = instrs[idx]
        if ins.base == "BAR":
            reading.barriers += 1
        if ins.base == "SHFL":
            reading.shuffles += 1
        if ins.base == "LDGSTS":
            reading.async_bytes += ins.width // 8
        if ins.base != "LDG":
            continue
        reading.load_widths[ins.width] = reading.load_widths.get(ins.width, 0) + 1
        dest = ins.written()
        order = body[pos + 1:] + (body[:pos] if loop else [])
        wrapped_at = len(body) - pos - 1
        prefetched = crossed = False
        for n, j in enumerate(order):
            if instrs[j].read() & dest:
                prefetched = crossed or n >= wrapped_at
                break
            if instrs[j].written() & dest and instrs[j].base != "LDG":
                break
            crossed = crossed or instrs[j].base == "SHFL"
        if prefetched:
            reading.prefetched_bytes += ins.width // 8
        else:
            reading.demand_bytes += ins.width // 8
    return reading


def in_flight(reading: LoopReading, threads: int, resident: float) -> float:
    """Bytes in flight per SM while a program computes (see the module docstring)."""
    ahead = reading.prefetched_bytes + reading.async_bytes * max(reading.buffers - 1, 0)
    return threads * (resident * ahead + max(resident - 1.0, 0.0) * reading.demand_bytes)


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
    need = sku.dram_bandwidth * LATENCY_S / sku.sm_count
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
            reading = read_loop(compiled.text("sass"), k.stages)
            if dump is not None:
                compiled.dump(dump / op / case.label, f"{launch.direction}-{launch.kernel}")
            threads = k.num_warps * 32
            resident = min(k.occupancy.blocks_per_sm, launch.programs / sku.sm_count)
            flight = in_flight(reading, threads, resident)
            touched = sum(_tensor_bytes(a) for a in launch.args if a.kind == "tensor")
            if flight >= need:
                finding = "clear"
            elif touched < sku.l2_bytes // 4:
                finding = "l2-resident"  # e.g. the partial rows the kernel before just wrote
            else:
                finding = "short"
            row.update(
                warps=k.num_warps, registers=k.registers, spills=k.spill_stores,
                occupancy=round(k.occupancy.fraction, 3),
                programs_per_sm=k.occupancy.blocks_per_sm,
                resident_per_sm=round(resident, 3),
                busy_sms=min(sku.sm_count, launch.programs),
                **{k_: v for k_, v in asdict(reading).items()},
                in_flight_per_sm=round(flight), need_per_sm=round(need), tensor_bytes=touched,
                finding=finding)
            out.append(row)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="sm_90a")
    parser.add_argument("--out", required=True)
    parser.add_argument("--ops", default="rms_norm,add_rms_norm,layer_norm,swiglu,geglu,rope,"
                                         "softmax,cross_entropy")
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
                     f"regs {r['registers']:3d} res {r['resident_per_sm']:5.2f} "
                     f"demand {r['demand_bytes']:4d} pre {r['prefetched_bytes']:4d} "
                     f"async {r['async_bytes']:3d}x{r['buffers'] - 1} "
                     f"bar {r['barriers']:2d} in flight {r['in_flight_per_sm'] / 1024:6.1f} KB"
                     f" / need {r['need_per_sm'] / 1024:4.1f} KB {r['finding']}"), flush=True)
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
