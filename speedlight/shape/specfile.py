"""Write a spec file for a shaped op: an OpSpec with the function as reference (and, until a
kernel replaces it, as implementation), the traced fused cost as its cost, suites at the
given shapes and their odd neighbours, and the standard tolerances. `speedlight verify
--spec` and `speedlight bench --spec` read it as they read any team's spec file.

Shape parameters: every distinct dimension value of the inputs becomes one named parameter
(a, b, ...), so dimensions that are equal at the given shapes stay equal in every case
(x=[8,4096], w=[4096] -> a=8, b=4096; x=[a,b], w=[b]).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from speedlight.shape.trace import InputSpec
from speedlight.spec import dtype_name

SMALL = (3, 5, 17, 37, 67, 131, 257)  # the quick suite's stand-ins for large dims, in order


def dim_symbols(inputs: Sequence[InputSpec]) -> dict[int, str]:
    """dimension value -> parameter name, in order of first appearance."""
    names: dict[int, str] = {}
    for s in inputs:
        for d in s.shape:
            names.setdefault(d, _letters(len(names)))
    return names


def _letters(i: int) -> str:
    """a, b, ..., z, aa, ab, ...: short parameter names that read well in case ids (a8-b4096)."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(ord("a") + r) + name
    return name


def main_dtype(inputs: Sequence[InputSpec]) -> torch.dtype:
    floats = [s.dtype for s in inputs if s.dtype.is_floating_point and s.dtype.itemsize >= 2]
    return max(set(floats), key=floats.count) if floats else torch.float32


def _traces(fn, inputs: Sequence[InputSpec], params: dict[str, int]) -> bool:
    """Whether `fn` runs on fake tensors at these parameter values."""
    from speedlight.shape.trace import trace

    syms = dim_symbols(inputs)
    try:
        trace(fn, [InputSpec(s.name, tuple(params[syms[d]] for d in s.shape), s.dtype)
                   for s in inputs])
    except ValueError:
        return False
    return True


STEPS = (1, 2, 4, 8, 16)  # a function may need a dim divisible by these (chunk, heads...)


def suite_values(inputs: Sequence[InputSpec], fn=None) -> tuple[dict[str, list[dict]], list[str]]:
    """Parameter values of each suite's cases, and notes on the cases left out.

    quick: small stand-ins for the large dims (odd first), and their neighbours; model: the
    shapes traced; full: those and their odd neighbours (each large dim +-1). When `fn` is
    given, every case is traced on fake tensors first; where an odd size breaks the
    function (a chunk in two, a reshape into heads) the smallest step that keeps the
    function running (2, 4, 8, 16) is taken instead, and a case none fits is left out,
    with a note."""
    syms = dim_symbols(inputs)
    given = {name: v for v, name in syms.items()}
    ok = (lambda p: _traces(fn, inputs, p)) if fn is not None else (lambda p: True)
    ranked = sorted(v for v in syms if v > 3)
    notes: list[str] = []

    def steps_needed(make) -> dict[str, int] | None:
        """Per-dimension steps (1: any size) under which make(steps) runs the function: all
        odd first, then one dimension at a time on a coarser step, then all of them."""
        names = sorted(given, key=lambda n: -given[n])
        tries = [{n: 1 for n in given}]
        for m in STEPS[1:]:
            tries += [{n: (m if n == one and given[n] % m == 0 else 1) for n in given} for one in names]
            tries.append({n: (m if given[n] % m == 0 else 1) for n in given})
        for steps in tries:
            if ok(make(steps)):
                return steps
        return None

    def small_with(steps):
        return {name: (v if v <= 3 else min(v, steps[name] * SMALL[min(ranked.index(v), len(SMALL) - 1)]))
                for v, name in syms.items()}

    def shifted(base, names, delta, steps):
        return {n: (v + delta * steps[n] if n in names else v) for n, v in base.items()}

    quick, full = [], [given]
    steps = steps_needed(small_with)
    if steps is None:
        notes.append("no small stand-in of the shapes runs the function; quick uses the shapes traced")
    else:
        small = small_with(steps)
        quick.append(small)
        nb = shifted(small, [n for n, v in small.items() if v > 3], 1, steps)
        if nb != small and ok(nb):
            quick.append(nb)
    big = [n for n, v in given.items() if v > 16]
    for delta, what in ((1, "larger"), (-1, "smaller")):
        st = steps_needed(lambda st: shifted(given, big, delta, st)) if big else None
        if st is None:
            if big:
                notes.append(f"no {what} neighbour of the shapes traced runs the function")
            continue
        c = shifted(given, big, delta, st)
        if c not in full:
            full.append(c)
    return {"quick": quick or [given], "model": [given], "full": full}, notes


def write_spec_file(path: Path, fn_file: Path, fn_name: str, inputs: Sequence[InputSpec], *,
                    train: bool, summary: str, fn=None) -> Path:
    """Write the spec file at `path` and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    syms = dim_symbols(inputs)
    main = main_dtype(inputs)
    rel = os.path.relpath(fn_file, path.parent.resolve())
    entries = []
    for s in inputs:
        dims = "(" + "".join(f'"{syms[d]}", ' for d in s.shape) + ")"
        fixed = "None" if s.dtype == main else f'"{dtype_name(s.dtype)}"'
        entries.append(f'    ("{s.name}", {dims}, {fixed}),')
    dtypes = ["torch.float32", "torch.float16", "torch.bfloat16"]
    grads = tuple(s.name for s in inputs if s.dtype.is_floating_point and s.dtype.itemsize >= 2) if train else ()
    name = fn_name
    values, notes = suite_values(inputs, fn)
    noted = "".join(f"\n# left out: {n}" for n in notes)
    text = f'''"""{name}: the spec `speedlight shape` wrote for {fn_file.name}:{fn_name}.

    speedlight verify --spec {path.name} --only-spec
    speedlight bench --spec {path.name} --only-spec

Until a kernel replaces IMPL, the implementation is the function itself, so verify checks
the function against its own float64 run (PyTorch's error in each dtype) and bench times
eager PyTorch. Put your kernel (or inductor's) in IMPL and rerun.

At the shapes traced:
{summary}
"""

import importlib.util
import sys
from pathlib import Path

import torch

from speedlight.shape import traced_cost
from speedlight.spec import Case, OpSpec, TOLERANCES, parse_dtype, rand_tensor


def _load(path: Path, name: str):
    module_name = f"speedlight_shaped_{{abs(hash(str(path)))}}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[module_name], name)


FN = _load((Path(__file__).parent / {rel!r}).resolve(), {fn_name!r})
IMPL = FN  # replace with the kernel to verify and bench

# (input, its dims as shape parameters, its dtype: None = the case's dtype)
INPUTS = (
{chr(10).join(entries)}
)
# the shapes traced and their odd neighbours (quick: small stand-ins for a CPU run)
SUITES = {values!r}{noted}


def _shapes(case):
    return [(name, tuple(case[d] for d in dims), parse_dtype(fixed) if fixed else case.dtype)
            for name, dims, fixed in INPUTS]


def _make_inputs(case, device):
    out = {{}}
    for i, (name, shape, dtype) in enumerate(_shapes(case)):
        if dtype.is_floating_point:
            out[name] = rand_tensor(shape, case, device, dtype=dtype, salt=i)
        else:
            g = torch.Generator().manual_seed(case.seed + i)
            out[name] = torch.randint(0, 2, shape, generator=g).to(device=device, dtype=dtype)
    return out


def _cost(case, mode):
    # the fused floor, traced at the case's shapes: inputs read once, outputs written once
    return traced_cost(FN, _shapes(case), mode)


def _suite(suite):
    return lambda: [Case({name!r}, params, model="traced" if suite == "model" else None)
                    for params in SUITES[suite]]


SPEC = OpSpec(
    name={name!r},
    impl=lambda **inputs: IMPL(*inputs.values()),
    reference=lambda **inputs: FN(*inputs.values()),
    make_inputs=_make_inputs,
    cost=_cost,
    suites={{s: _suite(s) for s in SUITES}},
    grad_inputs={grads!r},
    dtypes=({", ".join(dtypes)},),
    tolerances=TOLERANCES,
)
'''
    path.write_text(text)
    return path
