"""A class's method compiled again from its source, with some of its module's names bound
to other values.

The patch gives a module instance a forward that is its class's own forward with a few
names changed: an attention layer's `apply_rotary_pos_emb` becomes speedlight's RoPE
(rotary.py), a decoder layer's residual add and norm one helper call (decoder_layer.py).
The source (decorators included) is compiled against the modeling module's own globals,
inside an enclosing function whose parameters are the bound names: the method reads those
as free variables in place of the module's globals, so the module itself is never changed
(other models of the family keep its functions) and nothing is looked up at call time
(torch.compile traces the forward as it traces the original).
"""

from __future__ import annotations

import __future__
import ast
import inspect
import textwrap
from typing import Callable

_MAKER = "_speedlight_make"


class SourceError(Exception):
    """The method's source cannot be compiled again; the message says why."""


def recompile(method, names: tuple[str, ...],
              edit: Callable[[ast.FunctionDef], object] | None = None):
    """(make, edited): make(*values) returns `method` (decorated as in its source) compiled
    again with each of `names` bound to the value in its place; `edited` is what
    edit(function definition) returned (None without edit), which may rewrite the parsed
    definition first. SourceError if the source is not available, not a plain function,
    a closure, or already uses one of the names as a local."""
    function = inspect.unwrap(method)
    where = function.__qualname__
    if function.__code__.co_freevars:
        raise SourceError(f"{where} is a closure (free variables "
                          f"{function.__code__.co_freevars}); its source cannot be recompiled")
    clash = [n for n in names if n in function.__code__.co_varnames]
    if clash:
        raise SourceError(f"{where} has a local variable named {', '.join(clash)}")
    try:
        source = textwrap.dedent(inspect.getsource(function))
        filename = inspect.getsourcefile(function) or f"<{where}>"
    except (OSError, TypeError) as e:
        raise SourceError(f"the source of {where} is not available ({e})") from None
    tree = ast.parse(source)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise SourceError(f"{where} is not a plain function")
    edited = edit(fdef) if edit is not None else None
    outer = ast.parse(f"def {_MAKER}({', '.join(names)}):\n    return None").body[0]
    outer.body = [fdef, ast.Return(ast.Name(fdef.name, ast.Load()))]
    module = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, function.__code__.co_firstlineno - 1)  # tracebacks: the file's lines
    flags = function.__code__.co_flags & __future__.annotations.compiler_flag
    code = compile(module, filename, "exec", flags=flags, dont_inherit=True)
    namespace: dict = {}
    exec(code, function.__globals__, namespace)  # defines _speedlight_make only
    return namespace[_MAKER], edited
