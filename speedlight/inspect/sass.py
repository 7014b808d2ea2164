"""Read SASS: the instruction mix of a kernel and the width of each global memory access,
per source line.

Input is nvdisasm's listing with line info (`nvdisasm -c -gi`), where each run of
instructions is preceded by `//## File "...", line N [inlined at ...]`. Counts are static
(an instruction inside a loop counts once).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

_LOC = re.compile(r'^\s*//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^(\.L\w+):")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+"  # /*0120*/
                    r"(?:@(!?U?P[T0-9]+)\s+)?"  # an optional predicate: @P0, @!UP1, @PT
                    r"([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)"  # LDG.E.128.CONSTANT, HGMMA.64x64x16.F32
                    r"\s*([^;]*)")  # its operands: R4, R2, -R7

TENSOR_CORE = ("HMMA", "HGMMA", "QGMMA", "IMMA", "IGMMA", "BMMA", "DMMA", "OMMA", "UTCHMMA",
               "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA", "UTCBMMA")
TMA = ("UTMALDG", "UTMASTG", "UTMAPF", "UTMAREDG", "UTMACCTL", "UBLKCP", "UBLKRED", "UBLKPF")
SHARED = ("LDS", "STS", "LDSM", "STSM", "ATOMS", "LDGSTS")
LOCAL = ("LDL", "STL")
ATOMICS = ("ATOMG", "ATOM", "RED", "REDG")
_WIDTH_SUFFIX = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128,
                 "256": 256}


@dataclass(frozen=True)
class Instr:
    opcode: str  # the mnemonic with its modifiers: LDG.E.128.CONSTANT
    file: str
    line: int
    operands: tuple = ()  # ("R4", "R2", "-R7"): the destination first, where there is one
    predicate: str = ""  # "P0", "!UP1" ('' when it always executes)

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def width(self) -> int:
        """Bits moved per thread by a memory instruction (32 unless a suffix says)."""
        for part in reversed(self.opcode.split(".")[1:]):
            if part in _WIDTH_SUFFIX:
                return _WIDTH_SUFFIX[part]
        return 32


@dataclass
class Mix:
    """What a kernel's SASS is made of."""

    total: int = 0
    by_base: Counter = field(default_factory=Counter)
    global_loads: Counter = field(default_factory=Counter)  # width -> count
    global_stores: Counter = field(default_factory=Counter)
    async_copies: Counter = field(default_factory=Counter)  # LDGSTS (cp.async) by width
    tensor_core: Counter = field(default_factory=Counter)
    tma: Counter = field(default_factory=Counter)
    shared: Counter = field(default_factory=Counter)
    local: Counter = field(default_factory=Counter)
    mufu: Counter = field(default_factory=Counter)  # by function: EX2, RCP, RSQ...
    barriers: int = 0
    shuffles: int = 0
    atomics: int = 0
    generic: int = 0  # LD/ST without a state space: the address could not be proved global
    wide_addresses: int = 0  # global accesses with .E (64-bit addresses)
    rounding_leaks: list = field(default_factory=list)  # (file, line) of each, see below

    def to_json(self) -> dict:
        def c(counter):
            return {str(k): v for k, v in sorted(counter.items(), key=lambda kv: str(kv[0]))}
        return {"instructions": self.total, "global_loads": c(self.global_loads),
                "global_stores": c(self.global_stores), "async_copies": c(self.async_copies),
                "tensor_core": c(self.tensor_core), "tma": c(self.tma), "shared": c(self.shared),
                "local": c(self.local), "mufu": c(self.mufu), "barriers": self.barriers,
                "shuffles": self.shuffles, "atomics": self.atomics, "generic": self.generic,
                "rounding_leaks": [list(at) for at in self.rounding_leaks]}


def parse(listing: str) -> list[Instr]:
    """Every instruction with the innermost source location it is attributed to."""
    return parse_with_labels(listing)[0]


def parse_with_labels(listing: str) -> tuple[list[Instr], dict[str, int]]:
    """parse's instructions, and each label (`.L_x_1`) with the position of the
    instruction it marks (what a branch jumps to).

    An inlined call's instructions are preceded by their own location, `inlined at` the
    caller; the nvdisasm Triton 3.9 ships then adds the caller's location on a line of its
    own (Triton 3.6's prints the first line only). The first of consecutive locations is
    the innermost, so a location right after another is skipped."""
    out: list[Instr] = []
    labels: dict[str, int] = {}
    file, line = "", 0
    after_location = False
    for text in listing.splitlines():
        m = _LOC.match(text)
        if m:
            if not after_location:
                file, line = m.group(1), int(m.group(2))
            after_location = True
            continue
        m = _LABEL.match(text)
        if m:
            labels[m.group(1)] = len(out)
            continue
        m = _INSTR.match(text)
        if m:
            after_location = False
            ops = tuple(o.strip().replace(".reuse", "") for o in m.group(3).split(",")
                        if o.strip())
            out.append(Instr(m.group(2), file, line, ops, m.group(1) or ""))
    return out, labels


def is_global_load(i: Instr) -> bool:
    """LDG, LD, and LDGSTS (cp.async: a global load into shared memory, the loads of a
    software-pipelined loop)."""
    return i.base in ("LDG", "LD", "LDGSTS")


def is_global_store(i: Instr) -> bool:
    return i.base in ("STG", "ST")


def mix(instrs: list[Instr]) -> Mix:
    m = Mix(total=len(instrs))
    for i in instrs:
        b = i.base
        m.by_base[b] += 1
        if b in ("LDG", "LD"):
            m.global_loads[i.width] += 1
        elif b in ("STG", "ST"):
            m.global_stores[i.width] += 1
        elif b == "LDGSTS":
            m.async_copies[i.width] += 1
        if b in ("LD", "ST"):
            m.generic += 1
        if b in ("LDG", "STG", "LDGSTS") and "E" in i.opcode.split(".")[1:]:
            m.wide_addresses += 1
        if b in TENSOR_CORE:
            m.tensor_core[b] += 1
        if b in TMA:
            m.tma[b] += 1
        if b in SHARED and b != "LDGSTS":
            m.shared[b] += 1
        if b in LOCAL:
            m.local[b] += 1
        if b == "MUFU":
            fn = i.opcode.split(".")[1] if "." in i.opcode else "?"
            m.mufu[fn] += 1
        if b in ("BAR", "BARRIER"):
            m.barriers += 1
        if b == "SHFL":
            m.shuffles += 1
        if b in ATOMICS:
            m.atomics += 1
    m.rounding_leaks = [(i.file, i.line) for i in rounding_leaks(instrs)]
    return m


# Instructions whose first operand is an address or nothing, not a register written.
_NO_DESTINATION = ("ST", "STG", "STS", "STL", "RED", "REDG", "BRA", "BAR", "EXIT", "RET",
                   "BSYNC", "BSSY", "WARPSYNC", "NOP", "CALL", "MEMBAR", "FENCE", "YIELD")


@dataclass(frozen=True)
class Arithmetic:
    """What rounding_leaks needs to know of an instruction set: its fp32 multiplies and
    fused multiply-adds (destination, a, b[, c]), and whether an instruction writes its
    first operand."""

    mul: tuple
    fma: tuple
    writes: object  # Instr -> bool


def _registers(operand: str) -> tuple:
    """The registers an operand names: v[4:5] is v4 and v5 (AMDGCN's ranges)."""
    m = re.fullmatch(r"([a-z]+)\[(\d+):(\d+)\]", operand)
    if m:
        return tuple(f"{m.group(1)}{n}" for n in range(int(m.group(2)), int(m.group(3)) + 1))
    return (operand,)


SASS_ARITHMETIC = Arithmetic(mul=("FMUL",), fma=("FFMA",),
                             writes=lambda i: i.base not in _NO_DESTINATION)


def rounding_leaks(instrs: list, arithmetic: Arithmetic = SASS_ARITHMETIC) -> list:
    """Fused multiply-adds that subtract a product's own rounded value: FMUL d, a, b then
    FFMA x, a, b, -d (or -a, b, d), the registers unchanged between (AMDGCN: v_mul_f32
    and v_fma_f32). x is then exactly a * b's rounding error, where the source most
    likely meant a difference that cancels: a value minus a sum or mean it is part of,
    the multiply contracted into the subtraction on one side only (LayerNorm's backward
    at hidden 1: dy * w - mean(dy * w) gave 4.7e-6, not 0, on an H200). An error-free
    product (compensated arithmetic) is this pattern on purpose. The scan is
    straight-line: a product is forgotten once any of its registers is written."""
    products: dict[str, frozenset] = {}  # register -> the operands it is the product of
    out = []
    for i in instrs:
        ops = i.operands
        if i.base in arithmetic.fma and len(ops) == 4:
            a, b, c = ops[1], ops[2], ops[3]
            negated = sum(o.startswith("-") for o in (a, b, c)) % 2 == 1
            if negated and products.get(c.lstrip("-")) == frozenset((a.lstrip("-"),
                                                                      b.lstrip("-"))):
                out.append(i)
        if not ops or not arithmetic.writes(i):
            continue
        written = _registers(ops[0])
        products = {r: p for r, p in products.items()
                    if r not in written and not p.intersection(written)}
        factors = ops[1:]
        if (i.base in arithmetic.mul and len(ops) == 3 and not set(written) & set(factors)
                and not any(o.startswith("-") for o in factors)):
            products[ops[0]] = frozenset(factors)
    return out


@dataclass
class LineAccess:
    """The global loads or stores SASS issues for one source line."""

    file: str
    line: int
    kind: str  # load | store
    widths: Counter = field(default_factory=Counter)  # bits -> instruction count

    @property
    def narrowest(self) -> int:
        return min(self.widths) if self.widths else 0

    @property
    def widest(self) -> int:
        return max(self.widths) if self.widths else 0

    def describe(self) -> str:
        op = "LDG" if self.kind == "load" else "STG"
        return ", ".join(f"{op}.{w} x{n}" for w, n in sorted(self.widths.items(), reverse=True))


def accesses_by_line(instrs: list[Instr]) -> dict[tuple[str, int, str], LineAccess]:
    """(file, line, kind) -> the widths of the global memory instructions it compiled to."""
    out: dict[tuple[str, int, str], LineAccess] = {}
    for i in instrs:
        kind = "load" if is_global_load(i) else "store" if is_global_store(i) else None
        if kind is None:
            continue
        key = (i.file, i.line, kind)
        acc = out.get(key)
        if acc is None:
            acc = out[key] = LineAccess(i.file, i.line, kind)
        acc.widths[i.width] += 1
    return out
