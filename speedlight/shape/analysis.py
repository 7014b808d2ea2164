"""Floors, bound and layout advice of a traced function on a target's roof.

The fused floor is what one kernel doing the whole function must move and compute: every
input it reads once, every output written once (forward), and for a training step, the
backward's upstream gradients and the inputs read once more, each input gradient written
once. Its FLOPs are the eager ops' FLOPs (a fused kernel does the same arithmetic), each on
the peak it runs on (tensor-core FLOPs at the dtype's peak, the rest at the fp32 CUDA-core
peak: speedlight.target.peak_key). The eager floor is the sum of each launching op's own
floor; eager also pays a launch per kernel (profile's LAUNCH_S).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

from speedlight import target as target_mod
from speedlight.profile.roofline import LAUNCH_S
from speedlight.shape.trace import InputSpec, Trace, TracedOp, trace

SECTOR = 32  # bytes the memory system moves per access of a scattered element
TC_TILE = 16  # the k/n multiple every tensor-core instruction shape divides
ROUNDOFF = {"fp32": 2.0 ** -24, "tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8,
            "fp8": 2.0 ** -4}


def _op_seconds(op: TracedOp, roof) -> tuple[float, float]:
    """(arithmetic seconds, memory seconds) of one op on the roof."""
    key = target_mod.peak_key(op.dtype, tensor_core=op.tensor_core)
    peak = roof.flops.get(key) or roof.flops.get("fp32")
    return (op.flops / peak if peak else 0.0), op.bytes / roof.bandwidth


def fused_io(tr: Trace, phase: str) -> tuple[int, int, str]:
    """(bytes read, bytes written, how) of one kernel doing the whole phase."""
    if phase == "forward":
        reads = sum(tr.input_bytes[n] for n in tr.used_inputs)
        writes = sum(o["bytes"] for o in tr.outputs)
        how = "read each input once, write each output once"
    else:
        reads = sum(tr.input_bytes[n] for n in tr.used_inputs) + sum(o["bytes"] for o in tr.outputs)
        writes = sum(g["bytes"] for g in tr.grads)
        how = "read each input and each output's gradient once, write each input's gradient once"
    return reads, writes, how


def phase_floor(tr: Trace, phase: str, roof) -> dict:
    """The fused and eager floors of one phase."""
    ops = [o for o in tr.ops if o.phase == phase]
    kernels = [o for o in ops if o.kernel]
    reads, writes, how = fused_io(tr, phase)
    flops = sum(o.flops for o in ops)
    compute_s = sum(_op_seconds(o, roof)[0] for o in ops)
    fused_bytes = reads + writes
    memory_s = fused_bytes / roof.bandwidth
    fused_s = max(compute_s, memory_s)
    eager_floor = sum(max(*_op_seconds(o, roof)) for o in kernels)
    eager_launch = sum(max(max(*_op_seconds(o, roof)), LAUNCH_S) for o in kernels)
    if fused_s < LAUNCH_S:
        bound = "launch"
    else:
        bound = "arithmetic" if compute_s > memory_s else "bandwidth"
    eager_bound = ("launch" if len(kernels) * LAUNCH_S > eager_floor else
                   "arithmetic" if sum(_op_seconds(o, roof)[0] for o in kernels)
                   > sum(_op_seconds(o, roof)[1] for o in kernels) else "bandwidth")
    return {
        "phase": phase, "how": how,
        "fused": {"flops": flops, "bytes": fused_bytes, "read": reads, "written": writes,
                  "compute_s": compute_s, "memory_s": memory_s, "floor_s": fused_s,
                  "intensity": flops / fused_bytes if fused_bytes else math.inf, "bound": bound},
        "eager": {"ops": len(ops), "launches": len(kernels),
                  "flops": sum(o.flops for o in kernels), "bytes": sum(o.bytes for o in kernels),
                  "floor_s": eager_floor, "with_launch_s": eager_launch, "bound": eager_bound,
                  "uncounted": sorted({o.op for o in ops if not o.counted})},
        "gain": eager_launch / max(fused_s, LAUNCH_S) if kernels else 1.0,
        "bytes_ratio": (sum(o.bytes for o in kernels) / fused_bytes) if fused_bytes else 1.0,
    }


def floors(tr: Trace, roof) -> list[dict]:
    return [phase_floor(tr, p, roof) for p in (("forward", "backward") if tr.train else ("forward",))]


# ---------------------------------------------------------------------------------------
# advice: each item names what it saw (evidence) and the number it changes
# ---------------------------------------------------------------------------------------

def _advice(kind: str, title: str, evidence: str, number: str, op: TracedOp | None = None) -> dict:
    return {"kind": kind, "title": title, "evidence": evidence, "number": number,
            "op": op.op if op else None, "op_index": op.index if op else None}


def _reduced_dims(op: TracedOp) -> list[int]:
    nd = len(op.inputs[0]["shape"]) if op.inputs else 0
    d = op.dims
    if op.family in ("softmax",) and d is None:
        d = -1
    if d is None:
        return []
    ds = [d] if isinstance(d, int) else list(d)
    return [x % nd for x in ds] if nd else []


def strided_reductions(tr: Trace) -> list[dict]:
    out = []
    for op in tr.ops:
        if op.family not in ("reduction", "softmax", "gather") or not op.inputs:
            continue
        x = op.inputs[0]
        if not x["shape"]:
            continue
        for d in _reduced_dims(op) if op.family != "gather" else [_gather_dim(op)]:
            if d is None or x["shape"][d] <= 1 or x["stride"][d] == 1:
                continue
            item = x["bytes"] // max(1, math.prod(x["shape"])) or 1
            amp = SECTOR // item
            out.append(_advice(
                "layout", f"{'gather' if op.family == 'gather' else 'reduction'} over a "
                          f"non-contiguous dim",
                f"{op.op} reduces/gathers dim {d} (size {x['shape'][d]}) of {x['shape']} whose "
                f"stride there is {x['stride'][d]} elements, not 1",
                f"each element lands in its own {SECTOR}-byte sector: up to {amp}x the "
                f"{x['bytes']:,} B it needs ({amp * x['bytes']:,} B) unless the kernel reads "
                f"along the contiguous dim and reduces across threads, or the producer writes "
                f"dim {d} innermost", op))
    return out


def _gather_dim(op: TracedOp) -> int | None:
    if op.op.startswith("aten.embedding"):
        return None
    return op.dims % len(op.inputs[0]["shape"]) if isinstance(op.dims, int) else None


def alignment(tr: Trace) -> list[dict]:
    out = []
    for s in tr.inputs:
        if not s.shape or not s.dtype.is_floating_point:
            continue
        item = s.dtype.itemsize
        row = s.shape[-1] * item
        if len(s.shape) >= 2 and s.shape[-1] > 1 and row % 16:
            per = 16 // math.gcd(16, item)
            padded = -(-s.shape[-1] // per) * per
            out.append(_advice(
                "alignment", f"{s.name}'s rows break 16-byte alignment",
                f"{s.name}{list(s.shape)} {s.dtype}: a row is {s.shape[-1]} x {item} B = {row} B, "
                f"not a multiple of 16, so row starts after the first are not 16-byte aligned",
                f"loads fall from 128-bit to at most {8 * math.gcd(row, 16)}-bit vectors; padding the "
                f"row to {padded} elements keeps 128-bit access for "
                f"{(padded - s.shape[-1]) / s.shape[-1]:.2%} more bytes"))
    seen = set()
    for op in tr.ops:
        if op.family != "matmul" or len(op.inputs) < 2 or not op.tensor_core:
            continue
        a, b = op.inputs[-2], op.inputs[-1]
        if len(a["shape"]) < 2 or len(b["shape"]) < 2:
            continue
        m, k, n = a["shape"][-2], a["shape"][-1], b["shape"][-1]
        bad = {name: v for name, v in (("K", k), ("N", n)) if v % TC_TILE}
        key = (m, k, n)
        if not bad or key in seen:
            continue
        seen.add(key)
        waste = {name: (-(-v // TC_TILE) * TC_TILE - v) / (-(-v // TC_TILE) * TC_TILE)
                 for name, v in bad.items()}
        out.append(_advice(
            "alignment", "matmul sizes off the tensor-core tile multiple",
            f"{op.op} M={m} K={k} N={n}: " + ", ".join(f"{n_}={v} is not a multiple of {TC_TILE}"
                                                        for n_, v in bad.items()),
            "the last tile is padded: " + ", ".join(f"{w:.1%} of the {n_} tile's work wasted"
                                                     for n_, w in waste.items())
            + f"; pad {', '.join(bad)} to {', '.join(str(-(-v // TC_TILE) * TC_TILE) for v in bad.values())}",
            op))
    return out


def intermediates(tr: Trace) -> list[dict]:
    """Forward tensors that are neither inputs nor outputs and outweigh all the inputs."""
    in_bytes = sum(tr.input_bytes[n] for n in tr.used_inputs)
    out, seen = [], set()
    for op in tr.ops:
        if op.phase != "forward" or not op.kernel:
            continue
        for meta, oid in zip(op.outputs, op.out_ids):
            key = (tuple(meta["shape"]), meta["dtype"])
            if oid in tr.out_ids or meta["bytes"] <= in_bytes or key in seen:
                continue
            seen.add(key)
            saved = (" and training saves it for the backward, where recomputing it from the "
                     "inputs costs no extra DRAM traffic" if tr.train else "")
            out.append(_advice(
                "recompute", "an intermediate larger than the inputs",
                f"{op.op} makes {meta['shape']} {meta['dtype']}: {meta['bytes']:,} B, more than "
                f"all inputs together ({in_bytes:,} B)",
                f"eager writes and reads it back: {2 * meta['bytes']:,} B a fused kernel keeps in "
                f"registers/shared memory (recompute it per tile instead of storing){saved}", op))
    return out


def dtype_choices(tr: Trace, fwd: dict, roof) -> list[dict]:
    """What storing the floating inputs and outputs in bf16 or fp8 would change."""
    items = []
    floats = [s for s in tr.inputs if s.dtype.is_floating_point]
    if not floats:
        return items
    widest = max(s.dtype.itemsize for s in floats)
    f = fwd["fused"]
    for name, size in (("bf16", 2), ("fp8", 1)):
        if size >= widest:
            continue
        used = [s for s in tr.inputs if s.name in tr.used_inputs]
        in_new = sum(_elements(s) * min(size, s.dtype.itemsize) if s.dtype.is_floating_point
                     else tr.input_bytes[s.name] for s in used)
        written = f["bytes"] - sum(tr.input_bytes[s.name] for s in used)
        new_bytes = int(in_new + written * size / widest)
        compute_s = _compute_in(tr, "forward", name, roof)
        new_s = max(compute_s, new_bytes / roof.bandwidth)
        err = ROUNDOFF[name]
        now = ROUNDOFF.get(_short(widest), 2.0 ** -24)
        items.append(_advice(
            "dtype", f"store in {name}",
            f"floating inputs and outputs are {_short(widest)} ({widest} B/element)",
            f"compulsory bytes {f['bytes']:,} -> {new_bytes:,} ({new_bytes / f['bytes']:.0%}); "
            f"fused forward floor {f['floor_s'] * 1e6:.2f} -> {new_s * 1e6:.2f} µs"
            + (f" (its matmuls at the {name} tensor-core peak)" if any(
                o.tensor_core for o in tr.ops if o.phase == "forward") else "") + "; "
            f"each stored value's rounding error {now:.1e} -> {err:.1e} (unit roundoff)"
            + ("; fp8 needs a scale per tensor or block, and accumulation in fp32"
               if name == "fp8" else "; keep accumulations in fp32")))
    return items


def _compute_in(tr: Trace, phase: str, dtype: str, roof) -> float:
    """Arithmetic seconds of a phase with its tensor-core FLOPs at `dtype`'s peak."""
    total = 0.0
    for o in tr.ops:
        if o.phase != phase:
            continue
        key = target_mod.peak_key(dtype if o.tensor_core else o.dtype, tensor_core=o.tensor_core)
        peak = roof.flops.get(key) or roof.flops.get("fp32")
        total += o.flops / peak if peak else 0.0
    return total


def _elements(s) -> int:
    return math.prod(s.shape)


def _short(itemsize: int) -> str:
    return {8: "fp64", 4: "fp32", 2: "bf16", 1: "fp8"}[itemsize]


def layout_advice(tr: Trace, phases: list[dict], roof) -> list[dict]:
    """What the trace says about layout and dtypes: strided reductions, alignment, saved
    intermediates and the dtype choices for this roof."""
    return strided_reductions(tr) + alignment(tr) + intermediates(tr) + dtype_choices(tr, phases[0], roof)


@functools.lru_cache(maxsize=256)
def _fused(fn: Callable, specs: tuple, train: bool) -> tuple[tuple[int, int], ...]:
    """(FLOPs, compulsory bytes) of each phase, forward first."""
    tr = trace(fn, [InputSpec(*s) for s in specs], train=train)
    out = []
    for phase in (("forward", "backward") if train else ("forward",)):
        reads, writes, _ = fused_io(tr, phase)
        out.append((sum(o.flops for o in tr.ops if o.phase == phase), reads + writes))
    return tuple(out)


def traced_cost(fn: Callable, shapes: Sequence[tuple], mode: str = "fwd"):
    """The fused Cost of `fn` at `shapes` ((name, shape, dtype) each): FLOPs of its ops and
    its compulsory bytes, forward ("fwd") or backward ("bwd"); what a written spec file's
    cost reads."""
    from speedlight.spec import Cost

    if mode not in ("fwd", "bwd"):
        raise ValueError(f"traced_cost: mode must be 'fwd' or 'bwd', got {mode!r}")
    specs = tuple((n, tuple(int(d) for d in s), d) for n, s, d in shapes)
    flops, nbytes = _fused(fn, specs, mode == "bwd")[0 if mode == "fwd" else 1]
    return Cost(int(flops), int(nbytes))
