"""The floors of docs/ARCHITECTURE.md, held against every import in the package.

Every `import` and `from ... import` of every module is read with `ast`, wherever it sits
(top level, inside a function, under TYPE_CHECKING), so a lazy import counts as much as an
eager one. A top-level part is a module or package directly under speedlight/.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "speedlight"

# part -> floor, bottom up (docs/ARCHITECTURE.md says what each floor is for)
FLOORS = {
    # 1 vocabulary
    "hardware": 1, "shapes": 1, "reference": 1, "results": 1, "runtime": 1, "kernels": 1,
    "csrc": 1, "versions": 1,
    # 2 description
    "spec": 2, "target": 2, "tuning": 2, "launch": 2, "arguments": 2, "cluster": 2,
    "plans": 2, "predict": 2, "plan_prior": 2,
    # 3 ops
    "ops": 3, "registry": 3,
    # 4 what the tools share about models
    "nn": 4, "workloads": 4, "candidates": 4,
    # 5 tools, side by side
    "verify": 5, "bench": 5, "inspect": 5, "profile": 5, "patching": 5, "report": 5,
    # 6 composers
    "pipeline": 6, "tune": 6, "shape": 6, "cli": 6, "planning": 6,
}
TOOLS = ("verify", "bench", "inspect", "profile", "patching")
COMPOSERS = tuple(p for p, f in FLOORS.items() if f == 6)
SIDEWAYS = {("bench", "verify")}  # bench verifies a case before it reports a speedup
LONGEST_CHAIN = 7  # parts on the longest import chain between top-level parts
# the package's entry points, not parts: speedlight/__init__.py (lazy exports of the ops and
# of speedlight.patch) and __main__.py (python -m speedlight: the CLI)
ENTRY_POINTS = {"speedlight/__init__.py": None, "speedlight/__main__.py": "cli"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(module: str, path: Path) -> set[str]:
    """The speedlight modules `module` imports (a name imported from a package resolves to
    its submodule when there is one)."""
    known, found = modules(), set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                found.add(f"{source}.{a.name}" if f"{source}.{a.name}" in known else source)
    out = set()
    for name in found:
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in known and name != module:
            out.add(name)
    return out


@lru_cache(maxsize=None)
def module_graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(_imported(m, p)) for m, p in modules().items()}


def part_of(module: str) -> str | None:
    """The top-level part a module belongs to (None for speedlight/__init__.py)."""
    path = str(modules()[module].relative_to(PACKAGE.parent))
    if path in ENTRY_POINTS:
        return ENTRY_POINTS[path]
    return module.split(".")[1] if "." in module else None


@lru_cache(maxsize=None)
def part_graph() -> dict[str, frozenset[str]]:
    edges: dict[str, set[str]] = {}
    for m, targets in module_graph().items():
        a = part_of(m)
        for t in targets:
            b = part_of(t)
            if a is not None and b is not None and a != b:
                edges.setdefault(a, set()).add(b)
    return {a: frozenset(bs) for a, bs in edges.items()}


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one node."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2
    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def longest_chain(graph: dict[str, frozenset[str]]) -> list[str]:
    @lru_cache(maxsize=None)
    def down(n: str) -> tuple[str, ...]:
        below = [down(m) for m in graph.get(n, ())]
        return (n,) + max(below, key=len, default=())
    return list(max((down(n) for n in graph), key=len, default=()))


def test_every_part_has_a_floor():
    parts = {part_of(m) for m in modules()} - {None}
    assert sorted(parts - set(FLOORS)) == [], "a new top-level part: give it a floor here and in docs/ARCHITECTURE.md"
    assert sorted(set(FLOORS) - parts) == [], "a part left the package: take it out of FLOORS"


def test_the_graph_is_read():
    # a known lazy import inside a function (the report projects with speedlight.patch) and
    # a relative-free eager one are both seen
    assert "speedlight.patching" in module_graph()["speedlight.pipeline.projection_stage"]
    assert "speedlight.verify.harness" in module_graph()["speedlight.bench.runner"]


def test_parts_import_only_their_floor_and_below():
    up = [f"{a} (floor {FLOORS[a]}) imports {b} (floor {FLOORS[b]})"
          for a, bs in part_graph().items() for b in sorted(bs) if FLOORS[b] > FLOORS[a]]
    assert up == []


def test_no_tool_imports_another_tool():
    sideways = [f"{a} imports {b}" for a in TOOLS for b in sorted(part_graph().get(a, ()))
                if FLOORS[b] == FLOORS[a] and (a, b) not in SIDEWAYS]
    assert sideways == []


def test_only_composers_compose():
    composing = sorted(a for a, bs in part_graph().items()
                       if any(b in TOOLS and (a, b) not in SIDEWAYS for b in bs))
    assert set(composing) <= set(COMPOSERS), composing


@pytest.mark.parametrize("level", ["modules", "parts"])
def test_no_import_cycle(level):
    graph = module_graph() if level == "modules" else part_graph()
    assert [" > ".join(c) for c in _cycles(graph)] == []


def test_the_longest_import_chain_between_parts():
    chain = longest_chain(part_graph())
    assert len(chain) <= LONGEST_CHAIN, " > ".join(chain)
