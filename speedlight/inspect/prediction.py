"""A compiled kernel's predicted time on the target GPU: inspect's figures (each loop's
body, its iterations per program from the TTIR, occupancy, the grid) handed to the model
in speedlight/predict.py. Every number is a prediction from compiled code, labelled so.

Instructions become predict.Op: the pipe, the registers written and read, and what an
instruction starts or waits for (a global load, an asynchronous MMA or copy, a wait on
them, a barrier). A loop's iterations per program come from trips.py (its bounds followed
through the TTIR for the launch's arguments); a loop whose count is unknown (bounds read
from memory, or a CUDA C++ kernel, which has no TTIR) leaves the kernel without a
prediction, and says why.
"""

from __future__ import annotations

import re
from pathlib import Path

from speedlight import predict
from speedlight.inspect import loops as loops_mod
from speedlight.inspect import sass, trips

_REG = re.compile(r"(?<![A-Za-z_])(U?R\d+|U?P\d)(\.64)?")


def _regs(text: str) -> list[str]:
    out = []
    for m in _REG.finditer(text):
        out.append(m.group(1))
        if m.group(2) and m.group(1)[-1].isdigit():
            head = m.group(1).rstrip("0123456789")
            out.append(f"{head}{int(m.group(1)[len(head):]) + 1}")
    return out


def _written(i: sass.Instr) -> tuple:
    """The registers a SASS instruction writes: its first operand, widened for a 64- or
    128-bit load and for a warp group MMA's accumulator (M x N / 128 fp32 per thread)."""
    if i.base in sass._NO_DESTINATION or not i.operands:
        return ()
    first = i.operands[0]
    m = re.fullmatch(r"(U?R)(\d+)", first)
    if not m:
        return tuple(_regs(first)[:1])
    head, n = m.group(1), int(m.group(2))
    count = 1
    if i.base in ("LDG", "LD", "LDS", "LDSM", "LDL", "LDC"):
        count = max(1, i.width // 32)
    elif i.base.endswith("GMMA"):
        g = re.search(r"(\d+)x(\d+)x\d+", i.opcode)
        count = int(g.group(1)) * int(g.group(2)) // 128 if g else 1
    elif ".WIDE" in i.opcode or i.opcode.endswith(".64") or i.base in ("DADD", "DMUL", "DFMA"):
        count = 2
    return tuple(f"{head}{n + k}" for k in range(count))


def sass_op(i: sass.Instr, dots: dict, num_warps: int) -> predict.Op:
    b = i.base
    pipe = loops_mod.sass_pipe(i)
    writes = _written(i)
    reads = [r for o in (i.operands[1:] if writes else i.operands) for r in _regs(o)]
    if pipe == "mma":  # MMAs chained on one accumulator queue up; they do not wait for it
        reads = [r for r in reads if r not in writes]
    if i.predicate:
        reads.append(i.predicate.lstrip("!"))
    kind, flops, keep = "", 0, 0
    if b in ("LDG", "LD"):
        kind = "load"
    elif pipe == "mma":
        # the last MMA of a wgmma group carries gsb0 (it commits the group)
        kind = "mma_commit" if "gsb0" in i.operands else "mma"
        flops = loops_mod.sass_mma_flops(i, dots, num_warps) // max(num_warps, 1)
    elif b == "WARPGROUP" and "DEPBAR" in i.opcode:
        m = re.search(r"gsb0,\s*(0x[0-9a-f]+|\d+)", ",".join(i.operands))
        kind, keep = "mma_wait", int(m.group(1), 0) if m else 0
    elif b in ("LDGSTS", "UTMALDG", "UBLKCP"):
        kind = "copy"
    elif b == "LDGDEPBAR":
        kind = "commit"
    elif b == "DEPBAR":
        m = re.search(r"SB0,\s*(0x[0-9a-f]+|\d+)", ",".join(i.operands))
        kind, keep = "copy_wait", int(m.group(1), 0) if m else 0
    elif b == "SYNCS" and "PHASECHK" in i.opcode:
        kind = "sync_wait"
    elif b in ("BAR", "BARRIER") and ".ARV" not in i.opcode:
        kind = "barrier"
    return predict.Op(pipe, writes, tuple(reads), kind, flops, keep)


def amd_op(i, num_warps: int) -> predict.Op:
    pipe = loops_mod.amd_pipe(i)
    ops = [r for o in i.operands for r in sass._registers(o.lstrip("-"))]
    stores = i.opcode.startswith(("global_store", "buffer_store", "flat_store", "scratch_store",
                                  "ds_write", "ds_store", "s_waitcnt", "s_branch", "s_cbranch",
                                  "s_barrier"))
    writes = tuple(ops[:1]) if ops and not stores else ()
    reads = tuple(ops[1:] if writes else ops)
    kind, flops = "", 0
    if i.opcode.startswith(("global_load", "buffer_load", "flat_load")):
        kind = "load"
    elif pipe == "mma":
        kind, flops = "mma", loops_mod.amd_mma_flops(i, num_warps) // max(num_warps, 1)
    elif i.opcode.startswith("s_barrier"):
        kind = "barrier"
    return predict.Op(pipe, writes, reads, kind, flops)


def _bytes(lp) -> int:
    return lp.load_bytes + lp.store_bytes


def _outside(instrs: list, found: list) -> list:
    inside = set()
    for lp in found:
        inside.update(range(lp.first, lp.last + 1))
    return [i for p, i in enumerate(instrs) if p not in inside]


_OPS: dict = {}  # a compiled kernel -> its loops' and outside code's Ops


def _ops_of(k, instrs: list, amd: bool) -> list:
    """Each loop body's Ops, then the code outside loops', read once per compiled kernel."""
    key = (k.compiled.files.get("amdgcn" if amd else "sass"), k.num_warps) if k.compiled \
        else None
    if key is None or key[0] is None or key not in _OPS:
        dots = loops_mod.ttgir_dots(k.compiled.text("ttgir")) if k.compiled and not amd else {}
        make = (lambda i: amd_op(i, k.num_warps)) if amd else \
            (lambda i: sass_op(i, dots, k.num_warps))
        found = [[make(i) for i in lp.body] for lp in k.loops]
        found.append([make(i) for i in _outside(instrs, k.loops)])
        if key is None or key[0] is None:
            return found
        if len(_OPS) > 2048:
            _OPS.clear()
        _OPS[key] = found
    return _OPS[key]


def figures(k, instrs: list, ttir: str, *, amd: bool = False
            ) -> tuple[predict.LaunchFigures | None, str]:
    """The model's figures for a Triton kernel report (its parsed listing `instrs` and
    TTIR): (figures, '') or (None, why not)."""
    if not k.ok or k.occupancy is None:
        return None, "not compiled"
    if k.occupancy.blocks_per_sm == 0:
        return None, "no program fits an SM (it cannot launch)"
    counted = {(Path(t.file).name, t.line): t for t in trips.loop_trips(ttir, k.launch)} \
        if ttir else {}
    ops = _ops_of(k, instrs, amd)
    segments, early = [], False
    for n, lp in enumerate(k.loops):
        t = counted.get((Path(lp.file).name, lp.line))
        if t is None or not t.known:
            why = t.why if t is not None else "no loop of the TTIR at its line"
            return None, f"iterations of the loop at {Path(lp.file).name}:{lp.line} unknown: {why}"
        early = early or t.returned_early
        segments.append(predict.Segment(
            ops[n], t.mean, t.most, lp.instructions, lp.mma_flops,
            lp.mma_dtype or "bf16", _bytes(lp), f"{Path(lp.file).name}:{lp.line}",
            k.stages))
    rest, rest_ops = _outside(instrs, k.loops), ops[-1]
    if early:  # a return on a value read from memory, taken: the code up to the first exit
        exit_at = next((n for n, i in enumerate(rest) if i.base == "EXIT" or
                        i.opcode.startswith("s_endpgm")), len(rest) - 1)
        rest, rest_ops = rest[:exit_at + 1], rest_ops[:exit_at + 1]
    rest_bytes = sum(i.width // 8 for i in rest if i.base in ("LDG", "STG", "LDGSTS", "LD", "ST")) \
        if not amd else sum(i.width // 8 for i in rest if i.space in ("global", "buffer", "flat")
                            and i.kind in ("load", "store"))
    segments.append(predict.Segment(rest_ops, 1.0, 1.0, len(rest), 0, "bf16", rest_bytes))
    return predict.LaunchFigures(k.programs, k.num_warps, k.warp_size,
                                 k.occupancy.blocks_per_sm, segments), ""


def predict_kernel(k, instrs: list, ttir: str, sku, *, amd: bool = False, **kw):
    """(predict.Prediction, '') for a kernel report, or (None, why not)."""
    f, why = figures(k, instrs, ttir, amd=amd)
    if f is None:
        return None, why
    return predict.predict_launch(f, sku, **kw), ""

