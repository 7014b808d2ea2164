"""What crosses from one part of the package to another (docs/ARCHITECTURE.md, "Floors"):
typed requests and ordinary arguments, never a command line's argparse Namespace; public
names, never a module's private ones.

Read with `ast`, as tests/test_layers.py reads the imports (nothing is run).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from speedlight.cli import COMMANDS
from tests.test_layers import modules

# The modules that read a parsed command line: each sub-command's (cli.COMMANDS) and the
# flags they share (arguments.py, which defines them and reads them back).
COMMAND_MODULES = {module for module, _ in COMMANDS.values()} | {"speedlight.arguments"}


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _package(module: str, mods: dict[str, Path]) -> str:
    """The folder a module sits in (a package's __init__: its own)."""
    return module if mods[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _imports(module: str, tree: ast.Module, mods: dict[str, Path]) -> dict[str, tuple]:
    """Local name -> (speedlight module, the name taken from it; None: the module itself,
    line)."""
    out = {}
    package = module.split(".") if mods[module].name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                full = f"{source}.{a.name}"
                out[a.asname or a.name] = ((full, None) if full in mods else (source, a.name)) \
                    + (node.lineno,)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    local = a.asname or a.name.split(".")[0]
                    out[local] = (a.name if a.asname else local, None, node.lineno)
    return {k: v for k, v in out.items() if v[0] in mods}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _kernel(source: str, name: str) -> bool:
    """A Triton kernel imported by its launcher: STYLE.md names kernels `_<op>_fwd_kernel`
    (there the underscore marks a kernel, not a private name)."""
    return source.startswith("speedlight.kernels") and name.endswith("_kernel")


def private_imports(mods: dict[str, Path]) -> list[str]:
    """Private names (a leading underscore) a module takes from a module of another folder,
    by import or as an attribute of a module it imported."""
    found = []
    for module, path in mods.items():
        tree = _tree(path)
        imports = _imports(module, tree, mods)
        used = [(source, name, line) for source, name, line in imports.values()
                if name is not None and _private(name)]
        used += [(imports[n.value.id][0], n.attr, n.lineno) for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                 and n.value.id in imports and imports[n.value.id][1] is None
                 and _private(n.attr)]
        found += [f"{module}:{line} takes {source}.{name}" for source, name, line in used
                  if _package(source, mods) != _package(module, mods)
                  and not _kernel(source, name)]
    return sorted(set(found))


def _takes_a_namespace(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(p.annotation is not None and "Namespace" in ast.unparse(p.annotation)
               for p in params)


def namespaces_across_parts(mods: dict[str, Path]) -> list[str]:
    """Where a command line's Namespace reaches past the command that parsed it: one built
    by hand (to call a tool as its command would be), a function outside the command
    modules taking one, or a command module handing its `args` to another part."""
    found = []
    for module, path in mods.items():
        tree = _tree(path)
        imports = _imports(module, tree, mods)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("Namespace"):
                found.append(f"{module}:{node.lineno} builds a Namespace")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and module not in COMMAND_MODULES and _takes_a_namespace(node):
                found.append(f"{module}:{node.lineno} {node.name}() takes a Namespace")
            elif isinstance(node, ast.Call) and module in COMMAND_MODULES and any(
                    isinstance(a, ast.Name) and a.id == "args"
                    for a in node.args + [k.value for k in node.keywords]):
                root = node.func
                while isinstance(root, ast.Attribute):
                    root = root.value
                callee = imports.get(root.id, (None,))[0] if isinstance(root, ast.Name) else None
                if callee not in (None, "speedlight.arguments") and _part(callee) != _part(module):
                    found.append(f"{module}:{node.lineno} hands args to "
                                 f"{ast.unparse(node.func)} ({callee})")
    return sorted(set(found))


def test_no_namespace_crosses_a_part():
    assert namespaces_across_parts(modules()) == []


def test_no_private_name_is_taken_from_another_folder():
    assert private_imports(modules()) == []


def test_the_scans_find_what_they_look_for(tmp_path):
    """A module that builds a Namespace, takes one outside a command module, hands a
    command's args to another part, and takes a private name from another folder."""
    probe = tmp_path / "probe.py"
    probe.write_text("import argparse\nfrom speedlight.verify.harness import _grads\n"
                     "from speedlight import results\n"
                     "def f(args: argparse.Namespace):\n    return argparse.Namespace(x=1)\n")
    command = tmp_path / "command.py"
    command.write_text("from speedlight import results\n"
                       "def run(args):\n    return results.write_json(args, {})\n")
    mods = {name: modules()[name] for name in ("speedlight.results", "speedlight.verify.harness")}
    mods.update({"speedlight.bench.probe": probe, "speedlight.verify.command": command})
    found = namespaces_across_parts(mods)
    assert "speedlight.bench.probe:5 builds a Namespace" in found
    assert "speedlight.bench.probe:4 f() takes a Namespace" in found
    assert any(f.startswith("speedlight.verify.command:3 hands args to results.write_json")
               for f in found)
    assert "speedlight.bench.probe:2 takes speedlight.verify.harness._grads" in \
        private_imports(mods)
