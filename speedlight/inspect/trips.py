"""How many times each loop of a Triton kernel runs, per program, from its TTIR and a
launch's arguments: no run, any size.

The loop bounds of a Triton kernel are integer arithmetic on its arguments, its program id
and constants (`scf.for %n = %lo to %hi step %c64`), with early returns (`cf.cond_br` to a
block holding `tt.return`) and scalar `scf.if`s on the way. evaluate() follows that
arithmetic for a program: the trip count of every `scf.for`, keyed by its source line (the
`for` statement, which the SASS loop's back edge also names). A value read from memory
(`tt.load`: a varlen offset, a device-side flag) is unknown; a loop whose bounds depend on
one has no count, and an early return whose condition depends on one is taken as not
taken... unless it guards the loop, in which case the loop is counted as skipped: the
common case speedlight's own kernels have (a fault path gated on a flag that finite
inputs leave unset). Programs are sampled evenly over the grid (at most SAMPLES per axis)
and their counts averaged.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = 33  # program ids evaluated per grid axis (the first, the last, evenly between)

_DEF = re.compile(r"^\s*(%[\w.]+)(?::(\d+))?\s*=\s*([\w.]+)\s*(.*)$")
_LOC_LINE = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$")
_FOR = re.compile(r"scf\.for\s+(%[\w.]+)\s*=\s*(%[\w.]+)\s+to\s+(%[\w.]+)\s+step\s+(%[\w.]+)")


class Unknown(Exception):
    """A value that depends on memory (or on an op not followed)."""


@dataclass
class ForLoop:
    line: int
    file: str
    iv: str
    lo: str
    hi: str
    step: str
    parent: "ForLoop | None" = None
    guards: list = field(default_factory=list)  # (condition, taken-means-skip) before it


@dataclass
class Program:
    """A TTIR function as much as evaluate() needs: every scalar definition, the loops,
    the early returns."""

    args: list[str]
    defs: dict = field(default_factory=dict)  # name -> (op, operand text)
    ifs: dict = field(default_factory=dict)  # result name -> (cond, then yields, else yields)
    loops: list[ForLoop] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)  # conditions that return early


def _operands(text: str) -> list[str]:
    return re.findall(r"%[\w.]+(?:#\d+)?", text.split(" : ")[0])


def locations(lines: list[str]) -> dict[str, tuple[str, int]]:
    """#locN -> (file, line): a file location itself, a named one's ("acc"(#loc9)) or a
    call site's innermost (callsite(#loc3 at #loc7): where the code is, as nvdisasm's line
    info gives it)."""
    raw = {}
    for line in lines:
        m = _LOC_LINE.match(line)
        if m:
            raw[m.group(1)] = m.group(2)
    out: dict[str, tuple[str, int]] = {}

    def resolve(name: str, depth: int = 0) -> tuple[str, int]:
        if name in out or depth > 50:
            return out.get(name, ("", 0))
        body = raw.get(name, "")
        m = re.match(r'"([^"]+)":(\d+):\d+', body)
        if m:
            found = (m.group(1), int(m.group(2)))
        else:
            inner = re.search(r"#loc\d*", body)
            found = resolve(inner.group(0), depth + 1) if inner else ("", 0)
        out[name] = found
        return found

    for name in raw:
        resolve(name)
    return out


def _where(raw: str, locs: dict) -> tuple[str, int]:
    """(file, line) of an op from the location that ends its line."""
    at = raw.rfind(" loc(")
    if at < 0:
        return ("", 0)
    tail = raw[at:]
    m = re.search(r'"([^"]+\.py)":(\d+):\d+', tail)
    if m:
        return (m.group(1), int(m.group(2)))
    m = re.search(r"#loc\d*", tail)
    return locs.get(m.group(0), ("", 0)) if m else ("", 0)


def parse_ttir(ttir: str) -> Program | None:
    """The kernel function of a TTIR module (None when it has none)."""
    lines = ttir.splitlines()
    locs = locations(lines)
    head = next((i for i, line in enumerate(lines) if "tt.func public @" in line), None)
    if head is None:
        return None
    end = head
    while end < len(lines) and not lines[end].rstrip().endswith("{"):
        end += 1
    args = re.findall(r"(%[\w.]+): ", " ".join(lines[head:end + 1]))
    prog = Program(args)
    stack: list = []  # open regions: ("for", ForLoop) | ("if", name, branch) | ("other",)
    blocks: dict[str, list[str]] = {}
    current_block = None
    pending_ifs: dict[str, list] = {}
    branches = []
    for raw in lines[end + 1:]:
        text = re.sub(r"\bloc\((?:[^()]|\([^()]*\))*\)", "", raw).rstrip()
        stripped = text.strip()
        if not stripped:
            continue
        bb = re.match(r"\^(bb\d+)\s*:", stripped)
        if bb and not stack:  # a block of the function itself (not of a region)
            current_block = bb.group(1)
            blocks[current_block] = []
            continue
        if current_block is not None and not stack:
            blocks[current_block].append(stripped)
        where = _where(raw, locs)
        net = stripped.count("{") - stripped.count("}")
        d = _DEF.match(stripped)
        f = _FOR.search(stripped)
        if f and net > 0:
            parent = next((x[1] for x in reversed(stack) if x[0] == "for"), None)
            lp = ForLoop(where[1], where[0], f.group(1), f.group(2), f.group(3), f.group(4),
                         parent)
            prog.loops.append(lp)
            stack.append(("for", lp))
            continue
        if d and d.group(3) == "scf.if" and net > 0:
            pending_ifs[d.group(1)] = [_operands(d.group(4))[0], [], []]
            stack.append(("if", d.group(1), 1))
            continue
        if f is None and stripped.startswith("scf.if") and net > 0:  # an if without results
            stack.append(("other",))
            continue
        if stripped.startswith("} else {"):
            if stack and stack[-1][0] == "if":
                _, name, _ = stack.pop()
                stack.append(("if", name, 2))
            continue
        if stripped.startswith("scf.yield") and stack and stack[-1][0] == "if":
            _, name, branch = stack[-1]
            pending_ifs[name][branch] = _operands(stripped[len("scf.yield"):])
            continue
        if stripped.startswith("cf.cond_br") and not stack:
            ops = re.findall(r"%[\w.]+|\^bb\d+", stripped)
            if len(ops) >= 3:
                branches.append((ops[0], ops[1].lstrip("^"), ops[2].lstrip("^")))
            continue
        if d:
            prog.defs[d.group(1)] = (d.group(3), d.group(4))
        for _ in range(max(net, 0)):
            stack.append(("other",))
        for _ in range(max(-net, 0)):
            if stack:
                kind = stack.pop()
                if kind[0] == "if":
                    prog.ifs[kind[1]] = tuple(pending_ifs[kind[1]])
                elif kind[0] == "for":  # a region op's location follows its closing brace
                    kind[1].file, kind[1].line = where
    # an early return: a conditional branch whose target block only returns
    for cond, then_bb, else_bb in branches:
        if blocks.get(then_bb, [])[:1] == ["tt.return"]:
            prog.returns.append(cond)
        elif blocks.get(else_bb, [])[:1] == ["tt.return"]:
            prog.returns.append("!" + cond)
    for lp in prog.loops:  # every early return comes before the loops (at the top level)
        lp.guards = list(prog.returns)
    return prog


_BINARY = {
    "arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b,
    "arith.muli": lambda a, b: a * b,
    "arith.divsi": lambda a, b: int(a / b) if b else 0,
    "arith.divui": lambda a, b: a // b if b else 0,
    "arith.remsi": lambda a, b: int(math.fmod(a, b)) if b else 0,
    "arith.remui": lambda a, b: a % b if b else 0,
    "arith.ceildivsi": lambda a, b: -(-a // b) if b else 0,
    "arith.floordivsi": lambda a, b: a // b if b else 0,
    "arith.minsi": min, "arith.maxsi": max, "arith.minui": min, "arith.maxui": max,
    "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b,
    "arith.xori": lambda a, b: a ^ b, "arith.shli": lambda a, b: a << b,
    "arith.shrsi": lambda a, b: a >> b, "arith.shrui": lambda a, b: a >> b,
}
_CMP = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "slt": lambda a, b: a < b,
        "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b, "sge": lambda a, b: a >= b,
        "ult": lambda a, b: a < b, "ule": lambda a, b: a <= b, "ugt": lambda a, b: a > b,
        "uge": lambda a, b: a >= b}
_UNARY = ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.bitcast")


class Evaluator:
    """The scalar values of one program of a launch."""

    def __init__(self, prog: Program, args: dict, pid: tuple, grid: tuple):
        self.prog, self.args, self.pid, self.grid = prog, args, pid, grid
        self.memo: dict = {}
        self.returned_early = False  # a return before the loops, on a value read from memory

    def value(self, name: str, env: dict | None = None):
        if env and name in env:
            return env[name]
        if name in self.memo:
            return self.memo[name]
        out = self._compute(name, env)
        if not env:
            self.memo[name] = out
        return out

    def _compute(self, name: str, env):
        if name.startswith("!"):
            return not self.value(name[1:], env)
        base = name.split("#")[0]
        if base in self.args:
            v = self.args[base]
            if v is None:
                raise Unknown(base)
            return v
        if base in self.prog.ifs:
            cond, then, other = self.prog.ifs[base]
            index = int(name.split("#")[1]) if "#" in name else 0
            chosen = then if self.value(cond, env) else other
            return self.value(chosen[index], env)
        if base not in self.prog.defs:
            raise Unknown(name)
        op, rest = self.prog.defs[base]
        if op == "arith.constant":
            m = re.match(r"(true|false|-?\d+)\s*:\s*i\d+", rest.strip())
            if not m:
                raise Unknown(name)
            return {"true": True, "false": False}.get(m.group(1), None) if m.group(1) in (
                "true", "false") else int(m.group(1))
        if op in ("tt.get_program_id", "tt.get_num_programs"):
            axis = "xyz".index(rest.split()[0])
            return self.pid[axis] if op == "tt.get_program_id" else self.grid[axis]
        operands = _operands(rest)
        if op in _BINARY and len(operands) == 2:
            return _BINARY[op](self.value(operands[0], env), self.value(operands[1], env))
        if op in _UNARY and operands:
            return self.value(operands[0], env)
        if op == "arith.cmpi":
            pred = rest.split(",")[0].strip()
            return _CMP[pred](self.value(operands[0], env), self.value(operands[1], env))
        if op == "arith.select" and len(operands) == 3:
            return self.value(operands[1] if self.value(operands[0], env) else operands[2], env)
        raise Unknown(name)  # tt.load, a tensor, a float: not followed

    def trips(self, lp: ForLoop, env: dict | None = None) -> float:
        """The iterations `lp` runs in this program (its enclosing loops' iterations summed,
        sampled when there are many). Raises Unknown when its bounds depend on memory."""
        for cond in lp.guards:
            try:
                if self.value(cond):
                    return 0.0
            except Unknown:  # a data-dependent early return: taken (the module's docstring)
                self.returned_early = True
                return 0.0
        ancestors = []
        outer = lp.parent
        while outer is not None:
            ancestors.insert(0, outer)
            outer = outer.parent
        return self._nested(lp, ancestors, dict(env or {}))

    def _nested(self, lp: ForLoop, ancestors: list, env: dict) -> float:
        if not ancestors:
            return self._range(lp, env)
        outer = ancestors[0]
        lo, hi, step = (self.value(x, env) for x in (outer.lo, outer.hi, outer.step))
        values = list(range(lo, hi, step)) if step > 0 else []
        if not values:
            return 0.0
        picked = values if len(values) <= 16 else [values[round(i * (len(values) - 1) / 15)]
                                                   for i in range(16)]
        total = sum(self._nested(lp, ancestors[1:], dict(env, **{outer.iv: v})) for v in picked)
        return total * len(values) / len(picked)

    def _range(self, lp: ForLoop, env) -> float:
        lo, hi, step = (self.value(x, env) for x in (lp.lo, lp.hi, lp.step))
        return float(max(0, -(-(hi - lo) // step))) if step > 0 else 0.0


def _axis(n: int) -> list[int]:
    if n <= SAMPLES:
        return list(range(n))
    return sorted({round(i * (n - 1) / (SAMPLES - 1)) for i in range(SAMPLES)})


@dataclass
class LoopTrips:
    """A source loop's iterations per program: mean and most over the sampled programs."""

    file: str
    line: int
    mean: float
    most: float
    known: bool = True
    why: str = ""
    returned_early: bool = False  # skipped by an early return on a value read from memory

    def to_json(self) -> dict:
        return {"file": Path(self.file).name, "line": self.line, "mean": round(self.mean, 3),
                "most": self.most, "known": self.known, "why": self.why or None}


def launch_args(launch) -> dict:
    """TTIR argument name -> value for the scalars a launch passed (None: a pointer, a
    float, or a value specialised away)."""
    out = {}
    for a in launch.args:
        out[f"%{a.name}"] = int(a.value) if a.kind == "int" and a.value is not None else None
    return out


@functools.lru_cache(maxsize=256)
def _parsed(ttir: str) -> Program | None:
    return parse_ttir(ttir)


def loop_trips(ttir: str, launch) -> list[LoopTrips]:
    """Every scf.for of the kernel with its iterations per program for this launch."""
    prog = _parsed(ttir)
    if prog is None or not prog.loops:
        return []
    args = launch_args(launch)
    grid = tuple(launch.grid)
    pids = [(x, y, z) for x in _axis(grid[0]) for y in _axis(grid[1]) for z in _axis(grid[2])]
    out = []
    for lp in prog.loops:
        counts, why, early = [], "", False
        for pid in pids:
            try:
                ev = Evaluator(prog, args, pid, grid)
                counts.append(ev.trips(lp))
                early = early or ev.returned_early
            except (Unknown, KeyError, ValueError, ZeroDivisionError, TypeError, IndexError,
                    RecursionError) as e:
                why = f"its bounds depend on {e} (a value read from memory or not followed)"
                break
        if why:
            out.append(LoopTrips(lp.file, lp.line, 0.0, 0.0, False, why))
        else:
            out.append(LoopTrips(lp.file, lp.line, sum(counts) / len(counts), max(counts),
                                 returned_early=early))
    return out
