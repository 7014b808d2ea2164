"""Names once: each public top-level class or function name of speedlight/ is defined in one
module, so a name means one thing (issue 26, item 6).

Read with `ast` (nothing of the package is run; the registry's list of ops is read). A name in ALLOWED may be defined in the modules it
lists and no others; each entry says why."""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from speedlight.registry import BUILTIN_OPS

PACKAGE = Path(__file__).resolve().parent.parent / "speedlight"

OPS = "ops/*"  # any module of speedlight/ops
COMMANDS = ("*/command.py", "bench/probe_command.py")
ISA = ("inspect/sass.py", "inspect/amdgcn.py")

ALLOWED: dict[str, tuple[str, ...]] = {
    # One role, one implementation per module, reached through the module chosen for it:
    # an OpSpec's parts, named as the fields they fill (DESIGN-NOTES, "Files split, names once")
    **{part: (OPS,) for part in (
        "make_inputs", "cost", "cases", "skip", "for_model", "case_of", "recognise")},
    # each subcommand's module: configure(parser) and run(args); verify.run is the public harness
    "configure": COMMANDS,
    "run": COMMANDS + ("verify/harness.py",),
    # the function a Ray task calls, named by "<module>:worker" (cluster.run_on_ray)
    "worker": ("*/on_cluster.py",),
    # a candidate module's hooks (candidates/__init__.py, bench/gemm_baselines.py): adapt
    # the inputs, whether it applies
    "adapt": ("candidates/*.py", "bench/gemm_baselines.py"),
    "applies": ("candidates/*.py", "bench/gemm_baselines.py"),
    # SASS and AMDGCN read into one report: the same parser interface per instruction set
    # (amdgcn.LineAccess subclasses sass.LineAccess); occupancy.py is NVIDIA's occupancy
    **{n: ISA for n in ("Instr", "LineAccess", "accesses_by_line", "mix", "parse",
                        "parse_with_labels")},
    "occupancy": ("inspect/amdgcn.py", "inspect/occupancy.py"),
    # reference.py's float64 references carry the name of the op they check
    # (every built-in op, from the registry's one list)
    **{op: (f"ops/{op}.py", "reference.py") for op in BUILTIN_OPS},
    # the CUDA C++ implementation's two launchers stand in for the Triton ones under the same
    # names (the others are made from these two: ops/_rms_norm_launchers.py)
    **{launcher: ("ops/rms_norm.py", "ops/rms_norm_cuda.py")
       for launcher in ("rms_norm_residual_fwd", "rms_norm_bwd")},
    # a process's entry point: the CLI and inspect's compile worker (python -m)
    "main": ("cli.py", "inspect/_worker.py"),
}


@lru_cache(maxsize=None)
def _definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and not node.name.startswith("_"):
                where[node.name].append(path.relative_to(PACKAGE).as_posix())
    return where


def _allowed(name: str, module: str) -> bool:
    return any(Path(module).match(pattern) if "*" in pattern else module == pattern
               for pattern in ALLOWED.get(name, ()))


def test_each_public_name_is_defined_once():
    twice = {name: modules for name, modules in _definitions().items()
             if len(modules) > 1 and not all(_allowed(name, m) for m in modules)}
    assert not twice, ("public names defined in more than one module of speedlight/ (rename "
                       "the less central one to say what it is, or import the one): "
                       + "; ".join(f"{n}: {', '.join(ms)}" for n, ms in sorted(twice.items())))


def test_the_scan_finds_a_second_definition():
    assert _definitions()["make_inputs"][1:], "the scan reads every module"
    assert not _allowed("check_report", "verify/compare.py")
    assert not _allowed("make_inputs", "bench/runner.py") and _allowed("make_inputs", "ops/rope.py")
