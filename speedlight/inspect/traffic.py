"""Count what an interpreted launch loads and stores, and how its accesses are laid out.

Hooked into the interpreter's masked load and store (launches.intercept), each access adds
its live lanes' bytes (masked-off lanes excluded) to a Site: one source line (the kernel
statement issuing it, found on the Python stack: the interpreter runs the kernel's own
code with the file's real line numbers) and one tensor argument (the one whose memory the
addresses fall in). A Site also records what the addresses allow: whether the innermost
dimension is contiguous, how its row starts are aligned, how long its rows are, and so the
widest global access a compiler could have used.
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

import numpy as np

_TRITON_PKG = os.path.join(os.path.dirname(os.path.abspath(__import__("triton").__file__)), "")
_OWN_FILES = {os.path.join(os.path.dirname(os.path.abspath(__file__)), f)
              for f in ("traffic.py", "launches.py")}


@dataclass
class Site:
    """The traffic of one load or store in the source (file, line) on one argument."""

    kind: str  # load | store
    arg: str
    file: str
    line: int
    itemsize: int
    bytes: int = 0
    calls: int = 0
    lanes: int = 0  # elements addressed, masked ones included
    contiguous: bool = True  # every call's innermost dim is unit-stride
    align: int = 16  # largest power of two (<= 16 bytes) dividing every row start seen
    row_bytes: int = 1 << 62  # smallest innermost extent seen (bytes)
    numel: int = 1 << 62  # smallest block seen (elements)
    stride_elems: int = 0  # innermost lane stride when not contiguous (-1: not uniform)
    widest_bits: int = 0  # the widest access the addresses allow (set by finish_sites)

    @property
    def aligned16(self) -> bool:
        return self.align >= 16

    def to_json(self) -> dict:
        return {"kind": self.kind, "arg": self.arg, "file": self.file, "line": self.line,
                "bytes": self.bytes, "calls": self.calls, "contiguous": self.contiguous,
                "align": self.align, "row_bytes": self.row_bytes,
                "widest_bits": self.widest_bits}


def _caller_line() -> tuple[str, int]:
    """(file, line) of the kernel source statement issuing the current load/store: the
    first frame outside the triton package (the interpreter runs the kernel's own code,
    compiled with the file's real line numbers)."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.startswith(_TRITON_PKG)
                             or f.f_code.co_filename in _OWN_FILES):
        f = f.f_back
    if f is None:
        return "?", 0
    return os.path.abspath(f.f_code.co_filename), f.f_lineno


def count_access(launch, kind: str, ptrs, mask) -> None:
    addr = np.asarray(ptrs.data).astype(np.int64, copy=False)
    live = np.broadcast_to(np.asarray(mask.data).astype(bool, copy=False), addr.shape)
    itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    file, line = _caller_line()
    arg = _owner(launch, addr, live, file, line)
    key = (kind, arg, file, line)
    site = launch.sites.get(key)
    if site is None:
        site = launch.sites[key] = Site(kind, arg, file, line, itemsize)
    site.bytes += int(live.sum()) * itemsize
    site.calls += 1
    site.lanes += addr.size
    site.numel = min(site.numel, addr.size)
    if addr.ndim == 0 or addr.shape[-1] < 2:
        site.contiguous = False
        site.row_bytes = min(site.row_bytes, itemsize)
        return
    steps = np.diff(addr, axis=-1)
    if np.all(steps == itemsize):
        site.row_bytes = min(site.row_bytes, addr.shape[-1] * itemsize)
        starts = int(np.bitwise_or.reduce(addr[..., 0].reshape(-1) | 16))
        site.align = min(site.align, starts & -starts)
    else:
        site.contiguous = False
        site.row_bytes = min(site.row_bytes, itemsize)
        first = int(steps.flat[0])
        uniform = bool(np.all(steps == first))
        site.stride_elems = first // itemsize if uniform and site.stride_elems != -1 else -1


def _owner(launch, addr, live, file: str, line: int) -> str:
    """The tensor argument whose memory the access falls in. When several do (one tensor
    passed twice, as a placeholder), the one named in the source statement wins."""
    if addr.size == 0:
        return "?"
    sel = addr[np.broadcast_to(live, addr.shape)] if live.any() else addr.reshape(-1)
    lo, hi = int(sel.min()), int(sel.max())
    owners = [a.name for a in launch.args if a.kind == "tensor" and a.lo <= lo and hi < a.hi]
    if len(owners) > 1:
        text = source_line(file, line)
        named = [n for n in owners if n in text]
        owners = named or owners
    return owners[0] if owners else "?"


_LINES: dict[str, list[str]] = {}
_SPANS: dict[str, list[tuple[int, int]]] = {}


def statement_span(file: str, line: int) -> tuple[int, int]:
    """(first, last) line of the innermost statement starting at or spanning `line`: a
    call split over lines is one access, whichever of its lines the compiler names."""
    if file not in _SPANS:
        spans = []
        try:
            with open(file) as f:
                tree = ast.parse(f.read())
            spans = [(n.lineno, n.end_lineno) for n in ast.walk(tree)
                     if isinstance(n, ast.stmt) and not isinstance(
                         n, (ast.FunctionDef, ast.ClassDef, ast.For, ast.While, ast.If, ast.With))]
        except (OSError, SyntaxError):
            pass
        _SPANS[file] = spans
    inside = [s for s in _SPANS[file] if s[0] <= line <= s[1]]
    return min(inside, key=lambda s: s[1] - s[0]) if inside else (line, line)


def source_line(file: str, line: int) -> str:
    if file not in _LINES:
        try:
            with open(file) as f:
                _LINES[file] = f.read().splitlines()
        except OSError:
            _LINES[file] = []
    lines = _LINES[file]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def finish_sites(launch) -> None:
    """Set each site's widest access the memory layout allows: the largest power of two
    (bytes, at most 16) dividing the contiguous row extent and every row start. Whether the
    launch gives each thread that much is a question of its block and num_warps, which
    the findings ask separately."""
    for s in launch.sites.values():
        s.row_bytes = s.itemsize if s.row_bytes >= 1 << 62 else s.row_bytes
        s.numel = 1 if s.numel >= 1 << 62 else s.numel
        width = s.itemsize
        if s.contiguous:
            width = next(w for w in (16, 8, 4, 2, 1) if w <= s.align and s.row_bytes % w == 0)
            width = max(width, s.itemsize)
        s.widest_bits = 8 * width
