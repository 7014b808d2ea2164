"""The built-in OpSpecs, and a user's own spec files.

A spec file is a Python file that defines `SPEC` (one OpSpec) or `SPECS` (a list); the
same harnesses then verify, bench and inspect the user's kernel against the user's
reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # importing spec loads torch: speedlight/__init__ reads BUILTIN_OPS without
    from speedlight.spec import OpSpec

# The one list of built-in ops. Each is the module speedlight.ops.<name>, whose public
# function <name> is speedlight.<name> and whose SPEC (an OpSpec named <name>) every tool
# reads; the package's exports, profile's advice, bench's baselines and the patcher's
# kinds are derived from it and from the OpSpecs.
BUILTIN_OPS = (
    "rms_norm",
    "softmax",
    "rope",
    "cross_entropy",
    "layer_norm",
    "add_rms_norm",
    "swiglu",
    "geglu",
    "matmul",
    "gated_matmul",
    "attention",
    "linear_cross_entropy",
    "grouped_matmul",
    "moe_experts",
)
BUILTIN_MODULES = tuple(f"speedlight.ops.{name}" for name in BUILTIN_OPS)


def builtin_specs() -> list[OpSpec]:
    return [importlib.import_module(m).SPEC for m in BUILTIN_MODULES]


def builtin_spec(name: str) -> OpSpec:
    """The OpSpec of built-in op `name` (ValueError naming the known ones otherwise)."""
    if name not in BUILTIN_OPS:
        raise ValueError(f"unknown op {name!r}; known: {', '.join(BUILTIN_OPS)}")
    return importlib.import_module(f"speedlight.ops.{name}").SPEC


def import_file(path: Path, name: str):
    """Run the Python file `path` as module `name` (registered in sys.modules, so its own
    imports and dataclasses resolve); on an error the module is unregistered and the
    error raised as it is."""
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_spec_file(path: str | Path) -> list[OpSpec]:
    """The OpSpecs a user's file defines (SPEC or SPECS)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec file {str(path)!r} does not exist")
    name = f"speedlight_user_spec_{abs(hash(str(path.resolve())))}"
    try:
        module = import_file(path, name)
    except Exception as e:
        detail = e.msg if isinstance(e, SyntaxError) else e
        raise ValueError(f"spec file {str(path)!r} failed to load: {_where(e, path)}"
                         f"{type(e).__name__}: {detail}") from None
    from speedlight.spec import OpSpec
    found = []
    if isinstance(getattr(module, "SPEC", None), OpSpec):
        found.append(module.SPEC)
    found += [s for s in getattr(module, "SPECS", []) if isinstance(s, OpSpec)]
    if not found:
        raise ValueError(f"spec file {str(path)!r} defines no SPEC (an OpSpec) or SPECS "
                         f"(a list of OpSpecs)")
    return found


def _where(e: Exception, path: Path) -> str:
    """'line N: ' of the spec file where loading it failed (the syntax error's own line,
    or the last frame in that file), or '' when it cannot be told."""
    if isinstance(e, SyntaxError) and e.lineno:
        return f"line {e.lineno}: "
    line, tb, here = None, e.__traceback__, str(path.resolve())
    while tb is not None:
        if str(Path(tb.tb_frame.f_code.co_filename).resolve()) == here:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"line {line}: " if line else ""


def select(names: Sequence[str] | None = None, spec_files: Iterable[str | Path] = (),
           include_builtin: bool = True) -> list[OpSpec]:
    """Built-in specs (unless only spec files were asked for) plus those of spec files,
    filtered by name."""
    spec_files = list(spec_files)
    specs = builtin_specs() if include_builtin else []
    for f in spec_files:
        specs += load_spec_file(f)
    if not names:
        return specs
    by_name = {s.name: s for s in specs}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]
