"""`speedlight shape`: shape a new operation before anyone writes its kernel.

    speedlight shape path/to/op.py:fn --shapes "x=[8,4096,4096]:bf16,w=[4096]:bf16" [--target h200] [--train]
    speedlight.shape(fn, *example_inputs, target="h200", train=False)

traces the function on fake tensors (trace.py: every aten op, its FLOPs and bytes by
profile's formulas), puts the fused floor beside the eager ops' floors with the bound
(analysis.py), gives layout and dtype advice with the number each changes, asks
torch.compile where it can generate Triton (compiled.py), and writes a spec file for
`speedlight verify --spec` / `speedlight bench --spec` (specfile.py).

`speedlight.shape` is both this package and the function: the package's module object is
callable (calling it calls `shape()`), so `import speedlight.shape` does not hide the
function behind the module.
"""

from __future__ import annotations

import inspect
import sys
import types
from pathlib import Path
from typing import Callable, Sequence

import torch

from speedlight.shape.analysis import traced_cost
from speedlight.shape.trace import InputSpec, parse_shapes, trace


def _input_specs(fn: Callable, example_inputs: Sequence) -> list[InputSpec]:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    specs = []
    for i, x in enumerate(example_inputs):
        name = params[i] if i < len(params) else f"arg{i}"
        if isinstance(x, InputSpec):
            specs.append(x)
        elif isinstance(x, torch.Tensor):
            specs.append(InputSpec(name, tuple(x.shape), x.dtype))
        else:
            raise TypeError(f"shape: example input {i} ({name}) must be a tensor (any device, "
                            f"meta included) or an InputSpec, got {type(x).__name__}")
    if not specs:
        raise ValueError("shape: give at least one example input")
    return specs


def shape(fn: Callable, *example_inputs, target=None, train: bool = False,
          spec_path: str | Path | None = None, compile: bool = True,
          source: tuple[Path, str] | None = None) -> dict:
    """Shape `fn` at the shapes and dtypes of `example_inputs` (tensors, meta ones are
    enough, or InputSpecs): the JSON document `speedlight shape` prints and writes.

    target: a --target name or a speedlight.target.Target (default: the GPU in use, else H200). train: trace the backward
    too. spec_path: also write a spec file there (needs `source`, the function's file and
    name, or a function defined in a file). compile: ask torch.compile for its Triton kernels and read them with
    inspect (compiled for the target; on a CPU they run through the interpreter)."""
    from speedlight import target as target_mod
    from speedlight.shape import analysis, compiled, specfile

    if not callable(fn):
        raise TypeError(f"shape: fn must be callable, got {type(fn).__name__}")
    inputs = _input_specs(fn, example_inputs)
    tgt = target if isinstance(target, target_mod.Target) else target_mod.resolve(target)
    if tgt.roof is None:
        raise ValueError(f"shape: {tgt.roof_note}")
    tr = trace(fn, inputs, train=train)
    phases = analysis.floors(tr, tgt.roof)
    doc = {
        "function": getattr(fn, "__qualname__", repr(fn)),
        "inputs": [s.to_json() for s in inputs],
        "train": train,
        "target": tgt.to_json(),
        "target_note": tgt.describe(),
        "launch_s": analysis.LAUNCH_S,
        "ops": [o.to_json() for o in tr.ops],
        "outputs": tr.outputs,
        "grads": tr.grads,
        "phases": phases,
        "advice": analysis.layout_advice(tr, phases, tgt.roof),
        "inductor": (compiled.inductor(fn, inputs, train=train, target=tgt,
                                       fused_bytes={p["phase"]: p["fused"]["bytes"] for p in phases})
                     if compile else {"status": "skipped", "reason": "not asked (--no-compile)"}),
        "spec_file": None,
    }
    if spec_path is not None:
        if source is None:
            file = inspect.getsourcefile(fn)
            if file is None:
                raise ValueError("shape: spec_path needs a function defined in a file")
            source = (Path(file).resolve(), fn.__name__)
        doc["spec_file"] = str(specfile.write_spec_file(Path(spec_path), source[0], source[1], inputs,
                                                        train=train, summary=summary_lines(doc), fn=fn))
    return doc


def summary_lines(doc: dict) -> str:
    """The floors in a few plain lines (the spec file's docstring quotes them)."""
    lines = []
    for p in doc["phases"]:
        f, e = p["fused"], p["eager"]
        lines.append(f"  {p['phase']}: fused floor {f['floor_s'] * 1e6:.2f} us ({f['flops']:,} FLOP, "
                     f"{f['bytes']:,} B, {f['bound']}-bound); eager {e['launches']} launches, "
                     f"{e['bytes']:,} B, {e['with_launch_s'] * 1e6:.2f} us with launches "
                     f"(on {doc['target']['name']})")
    return "\n".join(lines)


class _CallableModule(types.ModuleType):
    def __call__(self, fn, *example_inputs, **kwargs):
        return shape(fn, *example_inputs, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["shape", "traced_cost", "parse_shapes", "InputSpec", "trace"]
