"""The versions of torch, Triton and transformers speedlight is tested with, and the one
warning, at import, for an environment outside them.

TESTED is the one statement of the range in the package (pyproject.toml's pins say the
same); `speedlight report`'s header and every results row name the versions in use
(results.environment). Read from the installed distributions' metadata: importing
speedlight imports none of them (Triton imported early would fix whether its language is
interpreted, see runtime.py).
"""

from __future__ import annotations

import re
import warnings
from importlib import metadata

# package -> (oldest, newest) minor version tested, both included: torch 2.11 (the GPU
# machines') to 2.15, each with the Triton it pins, transformers 5.17 to the newest tested
TESTED = {"torch": ((2, 11), (2, 15)), "triton": ((3, 6), (3, 9)),
          "transformers": ((5, 17), (5, 25))}
# the distributions a package is installed as (ROCm's and nightly torch ship Triton so)
_DISTRIBUTIONS = {"triton": ("triton", "pytorch-triton-rocm", "pytorch-triton")}


class UntestedVersionWarning(UserWarning):
    """torch, Triton or transformers is outside the versions speedlight is tested with."""


def installed(package: str) -> str | None:
    """The installed version of `package` (e.g. '2.13.0+cpu'), None when it is not."""
    for name in _DISTRIBUTIONS.get(package, (package,)):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _range(package: str) -> str:
    (a, b), (c, d) = TESTED[package]
    return f"{package} {a}.{b} to {c}.{d}"


def untested(found: dict[str, str | None]) -> str | None:
    """The warning's text for versions (package -> version, None: not installed) outside
    TESTED, or None when every installed one is inside."""
    outside = []
    for package, version in found.items():
        minor = _minor(version) if version else None
        if minor is None:
            continue
        oldest, newest = TESTED[package]
        if not oldest <= minor <= newest:
            outside.append(f"{package} {version} ({'older' if minor < oldest else 'newer'} "
                           f"than tested)")
    if not outside:
        return None
    return (f"speedlight is tested with {', '.join(_range(p) for p in TESTED)}; this "
            f"environment has {', '.join(outside)}: its kernels or patches may fail or give "
            f"wrong results there. Install a tested version, or check your model with "
            f"`speedlight report` first.")


def warn_if_untested() -> None:
    """One UntestedVersionWarning naming every package outside TESTED; nothing otherwise.
    Called once, when speedlight is imported."""
    text = untested({p: installed(p) for p in TESTED})
    if text is not None:
        warnings.warn(text, UntestedVersionWarning, stacklevel=2)
