"""A kernel's loops, read from its SASS (or AMDGCN): what one iteration issues, pipe by
pipe, and what it costs against the tensor cores and the memory system.

A loop is a backward branch to a label before it (nvdisasm's `BRA \\`(.L_x_1)`, AMDGCN's
`s_cbranch_scc1 .LBB0_2`); its body is the code between the label and the branch, an inner
loop's body counted with the inner loop, not the outer one. Counts are per thread (per lane
on AMD) and per iteration, every instruction of the body counted once (a branch inside the
body, taken or not, does not change the count: both sides are counted).

Per loop:
  pipes      instructions by the pipe that executes them (PIPES): tensor MMA, FMA, ALU,
             MUFU, load/store and async copy, shuffles, barriers, predicate/select, and the
             uniform datapath, control and waits, conversions
  MMA FLOPs  of one iteration of one program, from each MMA instruction's shape (HMMA.16816
             per warp, HGMMA.64x64x16 per warp group, v_mfma_f32_32x32x8 per wave; tcgen05's
             UTCHMMA, whose shape lives in a register, from the TTGIR dot on its source line)
  per tile   warp-instructions per MMA_TILE of MMA FLOPs: the issue cost of a unit of tensor
             work, which more warps or a larger tile do not move
  lines      the body's instructions by source line (nvdisasm's line info), most first
  in flight  the bytes of global loads one thread has issued and not yet used, at most, in the
             steady state (the body walked until what earlier iterations left pending is
             full, so a load used in the next iteration, a prefetch, stays in flight across
             the back edge); cp.async groups retire at their DEPBAR
  steady     the loop that runs the kernel's steady state: the innermost loop with the most
             MMA FLOPs per iteration (of equals, the one with the fewest instructions: the
             interior tiles, where a masked variant serves the edges); without MMA, the one
             moving the most bytes per iteration
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from speedlight.inspect import sass
from speedlight.inspect.traffic import source_line

# The pipes an instruction is counted under, in the order they are shown.
PIPES = ("mma", "fma", "alu", "mufu", "memory", "shuffle", "barrier", "select", "uniform",
         "control", "convert", "other")
PIPE_NAMES = {"mma": "tensor MMA", "fma": "FMA", "alu": "ALU", "mufu": "MUFU",
              "memory": "load/store", "shuffle": "shuffle", "barrier": "barrier",
              "select": "predicate/select", "uniform": "uniform", "control": "control/wait",
              "convert": "convert", "other": "other"}
# The unit of MMA work the issue cost is normalized by: one 128 x 128 x 64 tile
# (2 * 128 * 128 * 64 FLOPs).
MMA_TILE = (128, 128, 64)
MMA_TILE_FLOPS = 2 * MMA_TILE[0] * MMA_TILE[1] * MMA_TILE[2]

# --- SASS: which pipe ------------------------------------------------------------------

_SASS_PIPES = {
    "fma": ("FFMA", "FMUL", "FADD", "FFMA2", "FMUL2", "FADD2", "FSWZADD", "HFMA2", "HMUL2",
            "HADD2", "IMAD", "IMUL", "IDP", "IDP4A", "DFMA", "DMUL", "DADD", "IMMA_SP"),
    "alu": ("IADD3", "IADD", "IADD32I", "LOP3", "LOP", "LOP32I", "SHF", "SHL", "SHR", "LEA",
            "FMNMX", "IMNMX", "VIMNMX", "VIMNMX3", "HMNMX2", "VIADD", "VIADDMNMX", "MOV",
            "MOV32I", "PRMT", "IABS", "POPC", "FLO", "BREV", "BMSK", "SGXT", "F2FP", "CS2R",
            "IADD3X", "VABSDIFF", "VABSDIFF4", "FRND", "I2IP", "BMOV", "ISCADD", "XMAD"),
    "select": ("FSEL", "SEL", "ISETP", "FSETP", "HSETP2", "DSETP", "PLOP3", "P2R", "R2P",
               "PSETP", "CSEL", "VOTE", "FCHK"),
    "mufu": ("MUFU",),
    "convert": ("F2F", "F2I", "I2F", "I2FP", "F2IP", "I2I"),
    "shuffle": ("SHFL", "REDUX", "MATCH"),
    "barrier": ("BAR", "BARRIER", "SYNCS", "MEMBAR", "ERRBAR", "CCTL"),
    "memory": ("LDG", "STG", "LD", "ST", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDL", "STL",
               "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "LDC", "LDTRAM", "SUST", "SULD",
               "TLD", "TEX") + sass.TMA,
    "control": ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "CALL", "BSSY", "BSYNC", "WARPSYNC",
                "NOP", "YIELD", "KILL", "DEPBAR", "LDGDEPBAR", "WARPGROUP", "S2R", "S2UR",
                "ELECT", "NANOSLEEP", "ACQBULK", "FENCE", "PMTRIG", "UCGABAR_ARV",
                "UCGABAR_WAIT", "ENDCOLLECTIVE", "PREEXIT"),
}
_SASS_PIPE = {op: pipe for pipe, ops in _SASS_PIPES.items() for op in ops}


def sass_pipe(i: sass.Instr) -> str:
    """The pipe a SASS instruction issues to (PIPES)."""
    b = i.base
    if b in sass.TENSOR_CORE:
        return "mma"
    pipe = _SASS_PIPE.get(b)
    if pipe is not None:
        return pipe
    if b.startswith("U") or b == "R2UR":
        return "uniform"
    return "other"


# --- AMDGCN: which pipe -------------------------------------------------------------------

def amd_pipe(i) -> str:
    """The pipe an AMDGCN instruction issues to (PIPES, in SASS's vocabulary)."""
    op = i.opcode
    if op.startswith(("v_mfma", "v_smfmac")):
        return "mma"
    if op.startswith(("ds_bpermute", "ds_permute", "ds_swizzle", "v_permlane")):
        return "shuffle"
    if op.startswith(("global_", "buffer_", "flat_", "scratch_", "ds_", "s_load", "s_buffer_load",
                      "s_store")):
        return "memory"
    if op.startswith("s_barrier"):
        return "barrier"
    if op.startswith(("s_waitcnt", "s_branch", "s_cbranch", "s_endpgm", "s_nop", "s_setprio",
                      "s_sleep", "s_setpc", "s_getpc", "s_swappc")):
        return "control"
    if op.startswith(("v_cndmask", "v_cmp", "s_cselect", "s_cmp", "v_cmpx")):
        return "select"
    if op.startswith(("v_exp_", "v_log_", "v_rcp_", "v_rsq_", "v_sqrt_", "v_sin_", "v_cos_")):
        return "mufu"
    if op.startswith("v_cvt_"):
        return "convert"
    if op.startswith(("v_fma", "v_fmac", "v_mul_f", "v_add_f", "v_sub_f", "v_subrev_f",
                      "v_pk_fma", "v_pk_mul", "v_pk_add", "v_mad", "v_mul_lo", "v_mul_hi",
                      "v_dot")):
        return "fma"
    if op.startswith("v_"):
        return "alu"
    if op.startswith("s_"):
        return "uniform"
    return "other"


# --- MMA shapes -------------------------------------------------------------------------------

_HMMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "16832": (16, 8, 32), "884": (8, 8, 4),
                "8816": (8, 8, 16), "8832": (8, 8, 32), "16864": (16, 8, 64),
                "168128": (16, 8, 128), "168256": (16, 8, 256)}
_GMMA = re.compile(r"(\d+)x(\d+)x(\d+)")
_MFMA = re.compile(r"(\d+)x(\d+)x(\d+)")


def mma_dtype(opcode: str) -> str:
    """The operand type of a tensor-core instruction, in hardware.DeviceSpec's names."""
    parts = opcode.upper().replace("_", ".").split(".")
    for name, dtype in (("BF16", "bf16"), ("F16", "fp16"), ("TF32", "tf32"), ("XF32", "tf32"),
                        ("E4M3", "fp8"), ("E5M2", "fp8"), ("FP8", "fp8"), ("F8", "fp8"),
                        ("BF8", "fp8"), ("S8", "int8"), ("U8", "int8"), ("I8", "int8"),
                        ("F64", "fp64")):
        if name in parts[1:] or name.lower() in opcode.split("_"):
            return dtype
    base = parts[0]  # no operand type named: SASS's default, fp16 (HGMMA.64x64x16.F32)
    if base in ("QGMMA", "UTCQMMA"):
        return "fp8"
    if base in ("IMMA", "IGMMA", "UTCIMMA"):
        return "int8"
    return "fp16"


def sass_mma_flops(i: sass.Instr, dots: dict, num_warps: int) -> int:
    """FLOPs one program's execution of an MMA instruction performs: HMMA per warp (every
    warp issues it), HGMMA per warp group (each of its 4 warps issues it), tcgen05 once per
    program (one thread issues it; its M x N from the TTGIR dot on the same line, K 32
    bytes of operand)."""
    b = i.base
    if b in ("HMMA", "IMMA", "BMMA", "DMMA"):
        parts = i.opcode.split(".")
        shape = _HMMA_SHAPES.get(parts[1]) if len(parts) > 1 else None
        return 2 * shape[0] * shape[1] * shape[2] * num_warps if shape else 0
    if b.endswith("GMMA"):
        m = _GMMA.search(i.opcode)
        return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) * num_warps // 4 if m else 0
    if b.startswith("UTC") and b.endswith("MMA"):
        dot = dots.get((Path(i.file).name, i.line)) or (next(iter(dots.values()))
                                                        if len(set(dots.values())) == 1 else None)
        if dot is None:
            return 0
        m, n, elem_bytes = dot
        return 2 * m * n * (32 // elem_bytes)
    return 0


def amd_mma_flops(i, num_warps: int) -> int:
    """FLOPs of one v_mfma across a program: M x N x K (x blocks) per wave, every wave."""
    m = _MFMA.search(i.opcode)
    if not m:
        return 0
    blocks = re.search(r"_(\d+)b_", i.opcode)
    n = int(blocks.group(1)) if blocks else 1
    return 2 * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) * n * num_warps


_DOT = re.compile(r"(?:tt\.dot|ttng\.warp_group_dot|ttng\.tc_gen5_mma|tt\.dot_scaled)\b[^\n]*?"
                  r"(?:memdesc|tensor)<(\d+)x(\d+)x(\w+?)[,>][^\n]*?loc\((#loc\d*)\)")
_LOC_DEF = re.compile(r'^(#loc\d*) = loc\("([^"]+)":(\d+):\d+\)', re.M)
_ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "tf32": 4, "f8E4M3FN": 1, "f8E5M2": 1, "i8": 1}


def ttgir_dots(ttgir: str) -> dict:
    """(file name, line) -> (M, N, operand bytes) of each dot in a kernel's TTGIR: the A
    operand's M x K gives M and the operand type; N is the result's (the last tensor type
    on the line)."""
    locs = {m.group(1): (Path(m.group(2)).name, int(m.group(3))) for m in _LOC_DEF.finditer(ttgir)}
    out = {}
    for text in ttgir.splitlines():
        if not re.search(r"\b(tt\.dot|ttng\.warp_group_dot|ttng\.tc_gen5_mma|tt\.dot_scaled)\b",
                         text) or "_wait" in text:
            continue
        shapes = re.findall(r"(?:memdesc|tensor)<(\d+)x(\d+)x(\w+?)[,>]", text)
        loc = re.search(r"loc\((#loc\d*)\)\s*$", text.strip())
        if len(shapes) < 2 or loc is None or loc.group(1) not in locs:
            continue
        a, b = shapes[0], shapes[1]
        m, n = int(a[0]), int(b[1])
        out[locs[loc.group(1)]] = (m, n, _ELEM_BYTES.get(a[2], 2))
    return out


# --- finding loops ----------------------------------------------------------------------------

@dataclass
class Line:
    """One source line's share of a loop's body."""

    file: str
    line: int
    count: int
    pipes: Counter
    source: str = ""

    def to_json(self, total: int) -> dict:
        return {"file": Path(self.file).name, "line": self.line, "instructions": self.count,
                "share": round(self.count / total, 4) if total else 0.0,
                "pipes": dict(self.pipes.most_common()), "source": self.source}


@dataclass
class Loop:
    """One loop of a kernel, per iteration of one program (see the module's docstring)."""

    index: int  # order in the code
    file: str  # where its back-edge branch is (the `for` statement)
    line: int
    depth: int  # 0: outermost
    first: int  # the body's first and last instruction (positions in the listing)
    last: int
    inner: list = field(default_factory=list)  # indices of the loops directly inside
    instructions: int = 0  # per thread per iteration, inner loops' bodies excluded
    pipes: Counter = field(default_factory=Counter)
    opcodes: Counter = field(default_factory=Counter)
    pipe_of: dict = field(default_factory=dict)  # opcode -> its pipe
    mma_flops: int = 0  # per program per iteration
    mma_dtype: str = ""
    num_warps: int = 1
    load_bytes: int = 0  # global loads (LDG, LDGSTS), bytes per thread per iteration
    store_bytes: int = 0
    tma_loads: int = 0  # UTMALDG: bytes set by a descriptor, not counted above
    in_flight: int = 0  # bytes of loads issued and not yet used, per thread, at most
    # the longest stretch of the body a load spends in flight before its first use, as a
    # share of the body (1.0: used only in the next iteration); compute in that stretch
    # overlaps the load's latency
    overlap: float = 0.0
    prefetch: bool = False  # a load is in flight across at least half the body (or a later
    # iteration's cp.async group): issued ahead of its use, not where it is used
    lines: list = field(default_factory=list)  # Line, most instructions first
    body: list = field(default_factory=list, repr=False)  # its own instructions (not in JSON)
    steady: bool = False
    barriers: int = 0  # CTA barriers (BAR.SYNC / s_barrier) per iteration

    @property
    def warp_instructions(self) -> int:
        """Instructions one program's warps issue per iteration (the uniform datapath's and
        a warp group's MMA included: each warp issues them)."""
        return self.instructions * self.num_warps

    @property
    def per_mma_tile(self) -> float | None:
        """Warp-instructions per MMA_TILE's worth of MMA FLOPs (None without MMA)."""
        return self.warp_instructions * MMA_TILE_FLOPS / self.mma_flops if self.mma_flops else None

    def share(self, pipe: str) -> float:
        return self.pipes.get(pipe, 0) / self.instructions if self.instructions else 0.0

    def to_json(self) -> dict:
        return {"index": self.index, "file": Path(self.file).name, "line": self.line,
                "depth": self.depth, "inner": self.inner, "steady": self.steady,
                "instructions": self.instructions,
                "pipes": {p: self.pipes[p] for p in PIPES if self.pipes.get(p)},
                "opcodes": dict(self.opcodes.most_common(12)),
                "mma_flops": self.mma_flops, "mma_dtype": self.mma_dtype or None,
                "warp_instructions": self.warp_instructions,
                "warp_instructions_per_mma_tile": (round(self.per_mma_tile, 1)
                                                   if self.per_mma_tile else None),
                "load_bytes_per_thread": self.load_bytes,
                "store_bytes_per_thread": self.store_bytes, "tma_loads": self.tma_loads,
                "in_flight_bytes_per_thread": self.in_flight, "prefetch": self.prefetch,
                "overlap": round(self.overlap, 3),
                "barriers": self.barriers,
                "lines": [x.to_json(self.instructions) for x in self.lines[:8]]}


_SASS_TARGET = re.compile(r"`\((\.L\w+)\)")
_SPIN = ("SYNCS", "BRA", "NANOSLEEP", "YIELD", "NOP", "s_sleep", "s_branch", "s_cbranch_scc0",
         "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz")


def _sass_branch(i: sass.Instr) -> str | None:
    """The label a SASS branch jumps to (None for other instructions)."""
    if i.base not in ("BRA", "JMP"):
        return None
    for o in i.operands:
        m = _SASS_TARGET.search(o)
        if m:
            return m.group(1)
    return None


def _amd_branch(i) -> str | None:
    if not i.opcode.startswith(("s_branch", "s_cbranch")):
        return None
    return next((o for o in i.operands if o.startswith(".L")), None)


def find_loops(instrs: list, labels: dict, *, amd: bool = False) -> list[Loop]:
    """Every loop in a parsed listing (`labels`: label -> position of the instruction it
    marks), outermost first where two share a start, nested ones linked."""
    branch = _amd_branch if amd else _sass_branch
    spans = []
    for pos, i in enumerate(instrs):
        target = branch(i)
        # a branch to itself is the trap after EXIT (`.L_x_2: BRA .L_x_2`), not a loop
        if target is not None and target in labels and labels[target] < pos:
            spans.append((labels[target], pos))
    # one loop per head: several back edges to one label (a `continue`) make one loop
    by_head: dict[int, int] = {}
    for first, last in spans:
        by_head[first] = max(by_head.get(first, last), last)
    ordered = sorted(by_head.items(), key=lambda fl: (fl[0], -fl[1]))
    # a wait that spins (an mbarrier try-wait retried: SYNCS then a branch back) is a wait,
    # not a loop; a branch back into a loop from code laid out after it (the retry of a wait
    # placed out of line) makes no loop of its own
    ordered = [(a, b) for a, b in ordered
               if not all(instrs[p].base in _SPIN for p in range(a, b + 1))]
    ordered = [(a, b) for a, b in ordered
               if not any(x < a <= y < b for x, y in ordered if (x, y) != (a, b))]
    loops = []
    for first, last in ordered:
        b = instrs[last]
        loops.append(Loop(len(loops), b.file, b.line, 0, first, last))
    for lp in loops:
        outer = [o for o in loops if o is not lp and o.first <= lp.first and lp.last <= o.last]
        lp.depth = len(outer)
        if outer:
            parent = min(outer, key=lambda o: o.last - o.first)
            parent.inner.append(lp.index)
    return loops


# --- what one iteration does ---------------------------------------------------------------

_REG = re.compile(r"(?<![A-Za-z_])R(\d+)(?:\.64)?")


def _dest_regs(i: sass.Instr) -> set[int]:
    """The registers a global load writes: R4 for 32 bits, R4-R7 for 128."""
    if not i.operands:
        return set()
    m = re.fullmatch(r"R(\d+)", i.operands[0])
    if not m:
        return set()
    first = int(m.group(1))
    return set(range(first, first + max(1, i.width // 32)))


def _read_regs(i: sass.Instr) -> set[int]:
    """The registers an instruction reads (every operand but a written destination; an
    address like [R2.64] reads R2 and R3)."""
    ops = i.operands[1:] if i.base not in sass._NO_DESTINATION else i.operands
    out = set()
    for o in ops:
        for m in _REG.finditer(o):
            n = int(m.group(1))
            out.add(n)
            if ".64" in m.group(0):
                out.add(n + 1)
    return out


def _in_flight(body: list) -> tuple[int, float]:
    """(the most bytes of global loads one thread has in flight at once, the longest share
    of the body a load stays in flight before its first use), in the steady state: the
    body walked until what earlier iterations left pending stops growing, the last walk
    counted, so what an iteration issues for the next is seen in flight across the back
    edge. A register load stays in flight until an instruction reads its destination (a
    copy of it too: the copy waits for the data); a load no instruction of the loop reads,
    a value for after the loop, is left out. cp.async (LDGSTS) copies until the DEPBAR.LE
    SB0, N that leaves at most N commit groups pending; a group left pending over the back
    edge was issued for a later iteration (overlap 1.0). A pipeline's prologue commits its
    first groups before the loop, so at steady state N groups are pending when the body
    starts: N + 2 walks (at most 10) fill them from none."""
    n = len(body)
    keeps = [_depbar_keep(i) for i in body if i.base == "DEPBAR"]
    walks = 2 + min(max(keeps, default=0), 8)
    reads = [_read_regs(i) for i in body]
    loads = {p: _dest_regs(i) for p, i in enumerate(body) if i.base in ("LDG", "LD")}
    loads = {p: regs for p, regs in loads.items() if regs and any(regs & r for r in reads)}
    pending: dict[int, tuple[int, set]] = {}  # step issued -> (bytes, registers)
    groups: list[int] = []  # committed cp.async groups' bytes, oldest first
    open_group = 0
    peak, overlap = 0, 0.0
    last = (walks - 1) * n  # the first step of the counted walk
    for step in range(walks * n):
        pos = step % n
        i = body[pos]
        if pending:
            for issued in [s for s, (_, regs) in pending.items() if regs & reads[pos]]:
                if step >= last:
                    overlap = max(overlap, min(1.0, (step - issued) / n))
                del pending[issued]
        if i.base == "DEPBAR":
            keep = _depbar_keep(i)
            del groups[:max(0, len(groups) - keep)]
        if pos in loads:
            pending[step] = (i.width // 8, loads[pos])
        elif i.base == "LDGSTS":
            open_group += i.width // 8
        elif i.base == "LDGDEPBAR":
            groups.append(open_group)
            open_group = 0
        if step >= last:
            peak = max(peak, sum(b for b, _ in pending.values()) + sum(groups) + open_group)
    return peak, 1.0 if groups else overlap


def _depbar_keep(i: sass.Instr) -> int:
    """N of a DEPBAR.LE SB0, N: the cp.async groups it leaves pending (0 if another
    scoreboard's)."""
    m = re.search(r"SB0,\s*(0x[0-9a-f]+|\d+)", ",".join(i.operands))
    return int(m.group(1), 0) if m else 0


def measure_loops(loops: list[Loop], instrs: list, *, num_warps: int, dots: dict | None = None,
            amd: bool = False) -> list[Loop]:
    """Fill each loop's per-iteration figures (its own body, inner loops excluded) and
    choose the steady-state loop."""
    dots = dots or {}
    pipe = amd_pipe if amd else sass_pipe
    for lp in loops:
        inner = [loops[j] for j in lp.inner]
        body = [instrs[p] for p in range(lp.first, lp.last + 1)
                if not any(x.first <= p <= x.last for x in inner)]
        lp.num_warps = num_warps
        lp.body = body
        lp.instructions = len(body)
        by_line: dict[tuple, Line] = {}
        for i in body:
            p = pipe(i)
            lp.pipes[p] += 1
            lp.opcodes[i.base] += 1
            lp.pipe_of[i.base] = p
            key = (i.file, i.line)
            if key not in by_line:
                by_line[key] = Line(i.file, i.line, 0, Counter())
            by_line[key].count += 1
            by_line[key].pipes[p] += 1
            if p == "mma":
                flops = amd_mma_flops(i, num_warps) if amd else sass_mma_flops(i, dots, num_warps)
                lp.mma_flops += flops
                lp.mma_dtype = lp.mma_dtype or mma_dtype(i.opcode)
            if amd:
                if i.space in ("global", "buffer", "flat") and i.kind == "load":
                    lp.load_bytes += i.width // 8
                elif i.space in ("global", "buffer", "flat") and i.kind == "store":
                    lp.store_bytes += i.width // 8
                lp.barriers += i.opcode == "s_barrier"
            else:
                if i.base in ("LDG", "LDGSTS") or (i.base == "LD"):
                    lp.load_bytes += i.width // 8
                elif i.base in ("STG", "ST"):
                    lp.store_bytes += i.width // 8
                lp.tma_loads += i.base == "UTMALDG"
                lp.barriers += i.base in ("BAR", "BARRIER")
        lp.lines = sorted(by_line.values(), key=lambda x: (-x.count, x.file, x.line))
        for x in lp.lines[:8]:
            x.source = source_line(x.file, x.line).strip() if x.file else ""
        lp.in_flight, lp.overlap = (_amd_in_flight if amd else _in_flight)(body)
        lp.prefetch = lp.overlap >= 0.5
    _choose_steady(loops)
    return loops


def _amd_in_flight(body: list) -> tuple[int, float]:
    """AMDGCN's loads stay in flight until the s_waitcnt vmcnt(N) that leaves at most N
    outstanding: the same two-walk count as _in_flight, by counter instead of register."""
    pending: list[tuple[int, int]] = []  # (step issued, bytes), oldest first
    peak, overlap, n = 0, 0.0, len(body)
    for step in range(2 * n):
        i = body[step % n]
        if i.opcode.startswith("s_waitcnt"):
            m = re.search(r"vmcnt\((\d+)\)", " ".join(i.operands) + " " + i.opcode)
            if m:
                keep = int(m.group(1))
                while len(pending) > keep:
                    issued, _ = pending.pop(0)
                    if step >= n:
                        overlap = max(overlap, min(1.0, (step - issued) / n))
        elif i.space in ("global", "buffer", "flat") and i.kind == "load":
            pending.append((step, i.width // 8))
        if step >= n:
            peak = max(peak, sum(b for _, b in pending))
    return peak, overlap


def _choose_steady(loops: list[Loop]) -> None:
    innermost = [lp for lp in loops if not lp.inner and lp.instructions]
    if not innermost:
        return
    if any(lp.mma_flops for lp in innermost):
        best = max(innermost, key=lambda lp: (lp.mma_flops, -lp.instructions))
    else:
        best = max(innermost, key=lambda lp: (lp.load_bytes + lp.store_bytes, lp.instructions))
    best.steady = True


def steady(loops: list[Loop]) -> Loop | None:
    return next((lp for lp in loops if lp.steady), None)


def kernel_loops(listing: str, *, num_warps: int, ttgir: str = "", amd: bool = False) -> list[Loop]:
    """The loops of one kernel's SASS (nvdisasm -c -gi) or AMDGCN listing, measured."""
    if amd:
        from speedlight.inspect import amdgcn

        instrs, labels = amdgcn.parse_with_labels(listing)
    else:
        instrs, labels = sass.parse_with_labels(listing)
    loops = find_loops(instrs, labels, amd=amd)
    return measure_loops(loops, instrs, num_warps=num_warps, dots=ttgir_dots(ttgir) if ttgir else {},
                   amd=amd)


def select_lines(lp: Loop) -> list[Line]:
    """The lines whose instructions are mostly predicate/select (a mask applied in the
    loop), most first."""
    return [x for x in lp.lines if x.pipes.get("select", 0) * 2 >= x.count and x.count >= 4]


# --- two dots into one accumulator ---------------------------------------------------------

_TTIR_DOT = re.compile(r"^\s*(%[\w.#]+)\s*=\s*tt\.dot\s+(%[\w.#]+),\s*(%[\w.#]+),\s*(%[\w.#]+)")


def chained_dots(ttir: str) -> list[tuple[int, int]]:
    """(line, line) of each pair of tl.dot in one loop body where the second accumulates
    into the first one's result (`acc = tl.dot(a1, b1, acc); acc = tl.dot(a2, b2, acc)`, or
    `acc += tl.dot(...)` twice, which Triton combines into the same chain), read from the
    TTIR: the pattern Triton's tcgen05 path on Blackwell compiles to wrong results."""
    from speedlight.inspect.trips import _where, locations

    lines = ttir.splitlines()
    locs = locations(lines)
    out, depth_dots = [], []  # per open loop: {result: line} of its dots
    depth = []  # per open region: whether it is an scf.for
    for raw in lines:
        text = re.sub(r"\bloc\((?:[^()]|\([^()]*\))*\)", "", raw)
        net = text.count("{") - text.count("}")
        if "scf.for" in text and net > 0:
            depth.append(True)
            depth_dots.append({})
            continue
        m = _TTIR_DOT.match(text)
        if m and depth_dots:
            result, acc = m.group(1), m.group(4)
            line = _where(raw, locs)[1]
            body = depth_dots[-1]
            if acc in body:
                out.append((body[acc], line))
            body[result] = line
        for _ in range(max(net, 0)):
            depth.append(False)
        for _ in range(max(-net, 0)):
            if depth and depth.pop():
                depth_dots.pop()
    return out
