"""speedlight: a GPU kernel engineer's job, as software, for PyTorch users.

Importing speedlight compiles nothing, touches no GPU and prints nothing (but one warning
where torch, Triton or transformers is outside the versions tested); the ops load on first
use. Kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter
(TRITON_INTERPRET=1 in the environment before anything imports triton: see the README).
"""

import importlib

from speedlight.registry import BUILTIN_OPS

__version__ = "0.1.0"

# public name -> module that defines it; loaded on first access (PEP 562). Every built-in
# op's public function has the op's name, in speedlight.ops.<name>.
_EXPORTS = {name: f"speedlight.ops.{name}" for name in BUILTIN_OPS}
# speedlight.shape is a callable module (speedlight/shape/__init__.py): speedlight.shape(fn, x).
# speedlight.patch(model) is a function: the package that holds it is speedlight.patching,
# since a submodule named patch would replace the function on first import.
# speedlight.patch is the planning composer's: it passes through to
# speedlight.patching.apply_kinds and, for plan="measure", measures first (patching cannot
# import the composer).
_EXPORTS.update({"patch": "speedlight.planning", "unpatch": "speedlight.patching",
                 "plan": "speedlight.planning"})
_SUBMODULES = ("nn", "spec", "shapes", "shape", "hardware", "reference", "registry", "results",
               "launch", "runtime", "plans")

__all__ = sorted(_EXPORTS) + ["__version__"]

# one warning when torch, Triton or transformers is outside the versions tested (from
# their metadata: nothing imported); nothing printed inside them
from speedlight import versions as _versions

_versions.warn_if_untested()


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"speedlight.{name}")
    raise AttributeError(f"module 'speedlight' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS) + list(_SUBMODULES))
