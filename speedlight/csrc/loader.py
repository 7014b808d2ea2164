"""Building CUDA C++ extensions on first use: speedlight's own (the RMSNorm binding) and a
team's (a spec file's kernel), with torch.utils.cpp_extension.

Nothing is built at import. The first call that needs an extension builds it with ninja
into a cache directory keyed by torch version, CUDA version and GPU architecture
(speedlight's cache: `$SPEEDLIGHT_CACHE`, else `$XDG_CACHE_HOME/speedlight`, else
`~/.cache/speedlight`; then `csrc/torch<ver>-cuda<ver>-sm_<cc>/<name>`), so a second
process loads it in milliseconds. Each build's wall time is recorded in `BUILDS` (and returned by
`build_seconds`), so gpu-check and a benchmark count it apart from the kernels' time.

`unavailable(device)` says why an extension cannot run here (a CPU build of torch, no GPU,
a CPU tensor, a missing compiler), or None: verify and bench record a CUDA implementation
as skipped with that reason instead of failing it; `load` raises `CudaBuildError` with
the same sentence.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Sequence

import torch

CSRC = Path(__file__).resolve().parent

# speedlight's own extensions: name -> the sources (relative to CSRC) nvcc and c++ compile
EXTENSIONS = {
    "rms_norm": ("rms_norm.cu", "rms_norm_binding.cpp"),
}


class CudaBuildError(RuntimeError):
    """A CUDA C++ extension cannot be built or run here; the message says why and what to
    install."""


@dataclass(frozen=True)
class Build:
    """One extension loaded in this process: how long its build (or its load from the
    cache) took, and where it lives."""

    name: str
    seconds: float
    directory: Path


BUILDS: dict[str, Build] = {}
_MODULES: dict[str, ModuleType] = {}
_LOCK = threading.Lock()


# --- where it can run ---------------------------------------------------------------------

def missing_compilers() -> list[str]:
    """The compilers a build needs and this machine lacks, each with what provides it."""
    missing = []
    if _nvcc() is None:
        missing.append("nvcc (the CUDA toolkit: set CUDA_HOME or put nvcc on PATH)")
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        missing.append("ninja (pip install ninja, or `pip install speedlight[cuda]`)")
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        missing.append(f"a C++ compiler ({cxx!r} is not on PATH; set CXX)")
    return missing


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def unavailable(device: torch.device | str | None = None) -> str | None:
    """Why a CUDA C++ extension cannot run on `device` here (None: it can). Cheap: checks
    torch's build, the device and the compilers, builds nothing."""
    if getattr(torch.version, "hip", None):
        return (f"the CUDA C++ implementation (csrc/) needs an NVIDIA GPU and a CUDA build "
                f"of torch; torch {torch.__version__} is a ROCm build (HIP "
                f"{torch.version.hip}): use the Triton implementation (impl='triton')")
    if torch.version.cuda is None:
        return (f"the CUDA C++ implementation needs a CUDA build of torch; torch "
                f"{torch.__version__} is a CPU build")
    if device is not None and torch.device(device).type != "cuda":
        return (f"the CUDA C++ implementation runs on CUDA tensors only; this run is on "
                f"{torch.device(device).type}")
    if not torch.cuda.is_available():
        return "the CUDA C++ implementation needs a CUDA GPU; torch sees none"
    missing = missing_compilers()
    if missing:
        return f"building the CUDA C++ implementation needs {'; '.join(missing)}"
    return None


# --- where builds go ----------------------------------------------------------------------

def build_key(arch: str | None = None) -> str:
    """torch<version>-cuda<version>-<arch>: what an extension binary depends on. arch: the
    current GPU's (sm_90...) unless given."""
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    version = torch.__version__.replace("+", "_")
    return f"torch{version}-cuda{torch.version.cuda}-{arch}"


def build_directory(name: str, arch: str | None = None) -> Path:
    """Where extension `name` is built for this torch, CUDA and arch."""
    from speedlight.hardware import cache_dir
    return cache_dir() / "csrc" / build_key(arch) / name


# --- building -----------------------------------------------------------------------------

def _check_can_build() -> None:
    reason = unavailable()
    if reason:
        raise CudaBuildError(reason)


def _timed(name: str, directory: Path, build) -> ModuleType:
    with _LOCK:
        if name in _MODULES:
            return _MODULES[name]
        _check_can_build()
        directory.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            module = build()
        except (RuntimeError, OSError) as e:  # cpp_extension raises these for compile errors
            raise CudaBuildError(f"building CUDA C++ extension {name!r} in {directory} "
                                 f"failed: {e}") from e
        BUILDS[name] = Build(name, time.perf_counter() - start, directory)
        _MODULES[name] = module
        return module


def load(name: str, sources: Sequence[str | Path], *, extra_cuda_cflags: Sequence[str] = (),
         extra_cflags: Sequence[str] = (), verbose: bool = False) -> ModuleType:
    """The extension `name` built from `sources` (.cu and .cpp files; one of them binds
    with PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)), built on the first call (cached per
    torch/CUDA/arch on disk, per process in memory)."""
    from torch.utils import cpp_extension

    _check_can_build()  # before build_directory, which asks the GPU its architecture
    directory = build_directory(name)
    paths = [str(Path(s).resolve()) for s in sources]
    return _timed(name, directory, lambda: cpp_extension.load(
        name=f"speedlight_{name}", sources=paths, build_directory=str(directory),
        extra_include_paths=[str(CSRC)], extra_cflags=["-O3", *extra_cflags],
        extra_cuda_cflags=["-O3", *extra_cuda_cflags], verbose=verbose))


def load_inline(name: str, cpp_sources: str | Sequence[str], cuda_sources: str | Sequence[str],
                functions: Sequence[str], *, extra_cuda_cflags: Sequence[str] = (),
                verbose: bool = False) -> ModuleType:
    """A team's extension from source text: `cuda_sources` (kernels and host launchers),
    `cpp_sources` (the declarations of `functions`, which are bound by name), built as
    `load` does."""
    from torch.utils import cpp_extension

    _check_can_build()
    directory = build_directory(name)
    return _timed(name, directory, lambda: cpp_extension.load_inline(
        name=f"speedlight_{name}", cpp_sources=cpp_sources, cuda_sources=cuda_sources,
        functions=list(functions), build_directory=str(directory),
        extra_cuda_cflags=["-O3", *extra_cuda_cflags], verbose=verbose))


def extension(name: str) -> ModuleType:
    """speedlight's own extension `name` (EXTENSIONS), built on first use."""
    if name not in EXTENSIONS:
        raise ValueError(f"no CUDA C++ extension {name!r}; known: {', '.join(EXTENSIONS)}")
    return load(name, [CSRC / s for s in EXTENSIONS[name]])


def build_seconds() -> dict[str, float]:
    """Seconds each extension loaded in this process took to build (or load from cache)."""
    return {name: b.seconds for name, b in BUILDS.items()}
