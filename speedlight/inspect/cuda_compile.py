"""Compile CUDA C++ for any target with nvcc (no GPU needed) and read what came out: the
resources ptxas reports and the SASS of every kernel, with demangled names.

    binary = compile_source("speedlight/csrc/rms_norm.cu", 90)   # sm_90a cubin + SASS
    fn = binary.find("rms_norm_fwd_kernel", "__nv_bfloat16")     # one template instance

`nvcc -cubin -arch=sm_XX -lineinfo -Xptxas -v` (sm_90a / sm_100a from 9.0 on, as Triton
compiles): registers, spills, stack and static shared memory per function come from
ptxas's report, and nvdisasm's listing (`-c -gi`) ties every SASS instruction to its source
line. Binaries are cached under hardware.cache_dir()/inspect-cuda by the hash of the source
(and of the local headers it includes), the flags and nvcc's version: a second run costs a
file read. inspect/cuda.py judges the kernels.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from speedlight import hardware
from speedlight.inspect import sass
from speedlight.inspect._worker import PTXAS_PATTERNS
from speedlight.target import arch_name

NVCC_FLAGS = ("-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v")


class CudaToolError(RuntimeError):
    """A CUDA tool inspect needs is missing (the message names it and where it looked)."""


# --- the tools -----------------------------------------------------------------------------

def nvcc() -> str:
    """nvcc: $CUDA_HOME/bin, then PATH, then /usr/local/cuda/bin."""
    places = [Path(os.environ[v]) / "bin" / "nvcc" for v in ("CUDA_HOME", "CUDA_PATH")
              if os.environ.get(v)]
    found = shutil.which("nvcc")
    places += [Path(found)] if found else []
    places.append(Path("/usr/local/cuda/bin/nvcc"))
    for p in places:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    raise CudaToolError("nvcc not found ($CUDA_HOME/bin, PATH, /usr/local/cuda/bin): install "
                        "the CUDA toolkit to inspect CUDA C++ kernels")


def missing_nvcc() -> str | None:
    """Why CUDA C++ kernels cannot be compiled here (no nvcc), or None."""
    try:
        nvcc()
    except CudaToolError as e:
        return str(e)
    return None


@functools.lru_cache(maxsize=None)
def _toolkit_bin() -> Path:
    """The bin folder of nvcc's own toolkit (also through a wrapper script such as
    /usr/local/bin/nvcc: `nvcc --dryrun` names the folder it runs from, _HERE_)."""
    out = subprocess.run([nvcc(), "--dryrun", "-cubin", "-x", "cu", os.devnull],
                         capture_output=True, text=True, timeout=60)
    m = re.search(r"^#\$ _HERE_=(\S+)", out.stderr + out.stdout, re.M)
    return Path(m.group(1)) if m else Path(nvcc()).resolve().parent


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, timeout=60)
    lines = [x for x in out.stdout.splitlines() if x.strip()]
    return lines[-1] if lines else "unknown"


@functools.lru_cache(maxsize=None)
def nvdisasm() -> str:
    """nvdisasm of nvcc's own toolkit when it ships one, else Triton's (CUDA 12.8, which
    reads sm_80 to sm_100a cubins)."""
    own = _toolkit_bin() / "nvdisasm"
    if own.is_file():
        return str(own)
    from speedlight.inspect._worker import tool

    return tool("nvdisasm")


@functools.lru_cache(maxsize=None)
def demangler() -> str | None:
    """cu++filt of nvcc's toolkit, else binutils' c++filt (CUDA names are Itanium-mangled),
    else None (names are shown mangled)."""
    own = _toolkit_bin() / "cu++filt"
    if own.is_file():
        return str(own)
    return shutil.which("c++filt")


def demangle(names: list[str]) -> dict[str, str]:
    """mangled -> demangled, in one demangler call; a name it cannot read stays as is."""
    tool = demangler()
    if not names or tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                         text=True, timeout=60)
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != len(names):
        return {n: n for n in names}
    return dict(zip(names, lines))


def split_name(demangled: str) -> tuple[str, str]:
    """('rms_norm_bwd_kernel', '__nv_bfloat16, true') of
    'void speedlight::(anonymous namespace)::rms_norm_bwd_kernel<__nv_bfloat16, true>(...)'."""
    depth, end = 0, len(demangled)
    for i, ch in enumerate(demangled):  # the parameter list: the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and not demangled.startswith("(anonymous", i):
            end = i
            break
    head = demangled[:end].strip()
    instance = ""
    if head.endswith(">"):
        depth = 0
        for i in range(len(head) - 1, -1, -1):
            depth += {">": 1, "<": -1}.get(head[i], 0)
            if depth == 0:
                instance, head = head[i + 1:-1].strip(), head[:i]
                break
    return head.split("::")[-1].split(" ")[-1], instance


# --- compiling -----------------------------------------------------------------------------

@dataclass
class Function:
    """One kernel (a template instance) of a compiled source."""

    mangled: str
    demangled: str
    base: str  # rms_norm_fwd_kernel
    instance: str  # its template arguments: __nv_bfloat16, true
    ptxas: dict
    listing: str  # its nvdisasm section

    @property
    def instrs(self) -> list[sass.Instr]:
        return sass.parse(self.listing)


@dataclass
class Binary:
    """A `.cu` source compiled for one target: the cubin, its SASS and its functions."""

    source: str  # the file compiled (an inline source is written into the cache)
    arch: int
    folder: Path | None = None
    functions: dict = field(default_factory=dict)  # mangled -> Function
    error: str = ""
    cached: bool = False

    def find(self, kernel: str, instance: str = "") -> Function | None:
        """The function named `kernel` with template arguments `instance` ('' : the only one,
        or an instance of a non-template kernel)."""
        matches = [f for f in self.functions.values() if f.base == kernel and
                   (not instance or _norm(f.instance) == _norm(instance))]
        return matches[0] if len(matches) == 1 or (matches and instance) else None

    def kernels(self) -> list[str]:
        return sorted({f"{f.base}<{f.instance}>" if f.instance else f.base
                       for f in self.functions.values()})


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text)


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _local_headers(path: Path, include_dirs: tuple[Path, ...],
                   seen: set | None = None) -> list[Path]:
    """The quoted #include files `path` reaches (found next to it or in include_dirs)."""
    seen = set() if seen is None else seen
    out = []
    for name in _INCLUDE.findall(path.read_text(errors="replace")):
        for folder in (path.parent, *include_dirs):
            cand = (folder / name).resolve()
            if cand.is_file():
                if cand not in seen:
                    seen.add(cand)
                    out += [cand] + _local_headers(cand, include_dirs, seen)
                break
    return out


def _source_file(source: str | Path, cache: Path) -> Path:
    """The file to compile: `source` itself when it names an existing file, else the inline
    source text written into the cache under its hash."""
    text = str(source)
    if "\n" not in text and text.endswith((".cu", ".cuh")):
        path = Path(text)
        if not path.is_file():
            raise FileNotFoundError(f"CUDA source {text!r} does not exist")
        return path.resolve()
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    path = cache / "inline" / f"{digest}.cu"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path




def parse_ptxas(log: str) -> dict[str, dict]:
    """mangled name -> ptxas -v's resources of it (registers, stack, spills, smem_static)."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?", line)
        if m:
            current = out.setdefault(m.group(1), {k: 0 for k in PTXAS_PATTERNS})
            continue
        if current is None:
            continue
        for key, pattern in PTXAS_PATTERNS.items():
            f = re.search(pattern, line)
            if f:
                current[key] = int(f.group(1))
    return out


_SECTION = re.compile(r"^\.text\.(\S+):\s*$", re.M)


def split_listing(listing: str) -> dict[str, str]:
    """mangled name -> its part of nvdisasm's listing."""
    marks = [(m.group(1), m.start()) for m in _SECTION.finditer(listing)]
    return {name: listing[start:marks[i + 1][1] if i + 1 < len(marks) else len(listing)]
            for i, (name, start) in enumerate(marks)}


def cache_root() -> Path:
    return hardware.cache_dir() / "inspect-cuda"


def compile_source(source: str | Path, arch: int, *, include_dirs=(), flags=()) -> Binary:
    """`source` (a .cu path or inline CUDA C++) compiled for compute capability `arch`
    (80, 90, 100...), from the cache when the source, its local headers, the flags and
    nvcc's version are unchanged. A compile error is returned in Binary.error, not raised;
    a missing nvcc raises CudaToolError."""
    root = cache_root()
    path = _source_file(source, root)
    includes = tuple(Path(d).resolve() for d in include_dirs)
    cmd_flags = (*NVCC_FLAGS, "-cubin", f"-arch={arch_name(arch)}", f"-I{path.parent}",
                 *(f"-I{d}" for d in includes), *flags)
    h = hashlib.sha256()
    for f in (path, *_local_headers(path, includes)):
        h.update(str(f).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps([cmd_flags, nvcc_version()]).encode())
    folder = root / h.hexdigest()[:24]
    binary = Binary(str(path), arch, folder)
    if not (folder / "meta.json").exists():
        _build(path, cmd_flags, folder)
    else:
        binary.cached = True
    meta = json.loads((folder / "meta.json").read_text())
    if meta.get("error"):
        binary.error = meta["error"]
        return binary
    listing = (folder / "kernel.sass").read_text()
    resources = parse_ptxas((folder / "ptxas.log").read_text())
    sections = split_listing(listing)
    names = demangle(list(sections))
    for mangled, text in sections.items():
        base, instance = split_name(names[mangled])
        binary.functions[mangled] = Function(mangled, names[mangled], base, instance,
                                             resources.get(mangled, {}), text)
    return binary


def _build(path: Path, cmd_flags: tuple, folder: Path) -> None:
    """Compile into a fresh folder and move it into place whole (concurrent runs and a
    killed one never leave a half-written cache entry)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    cubin = work / "kernel.cubin"
    out = subprocess.run([nvcc(), *cmd_flags, str(path), "-o", str(cubin)],
                         capture_output=True, text=True, timeout=600)
    (work / "ptxas.log").write_text(out.stderr + out.stdout)
    meta = {"source": str(path), "flags": list(cmd_flags), "nvcc": nvcc_version()}
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()
        meta["error"] = "nvcc failed: " + " / ".join(
            [x for x in tail if "error" in x][:3] or tail[-3:])
    else:
        dis = subprocess.run([nvdisasm(), "-c", "-gi", str(cubin)], capture_output=True,
                             text=True, timeout=600)
        if dis.returncode != 0:
            meta["error"] = f"nvdisasm failed: {dis.stderr.strip()}"
        (work / "kernel.sass").write_text(dis.stdout)
    (work / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        work.rename(folder)
    except OSError:  # another process finished the same entry first
        shutil.rmtree(work, ignore_errors=True)


class NvccCompiler:
    """Compiles each (source, arch) once per process (and once per machine: the cache)."""

    def __init__(self):
        self._done: dict[tuple, Binary] = {}

    def get(self, source: str | Path, arch: int, include_dirs=()) -> Binary:
        key = (str(source), arch, tuple(str(d) for d in include_dirs))
        if key not in self._done:
            self._done[key] = compile_source(source, arch, include_dirs=include_dirs)
        return self._done[key]
