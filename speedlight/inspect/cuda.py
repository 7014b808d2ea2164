"""Inspect CUDA C++ kernels: compile a `.cu` source for any target with nvcc (no GPU needed),
read ptxas's resources and the SASS, and judge each launch as Triton kernels are judged.

    binary = compile_source(Path("speedlight/csrc/rms_norm.cu"), 90)   # sm_90a cubin + SASS
    reports = inspect_launches(cuda_kernels, case, target)              # one per CudaLaunch

Compiling: `nvcc -cubin -arch=sm_XX -lineinfo -Xptxas -v` (sm_90a / sm_100a from 9.0 on, as
Triton compiles), so registers, spills, stack and static shared memory per function come
from ptxas's report, and nvdisasm's listing (`-c -gi`) ties every SASS instruction to its
source line. Binaries are cached under hardware.cache_dir()/inspect-cuda by the hash of the
source (and of the local headers it includes), the flags and nvcc's version: a second run
costs a file read.

Launch geometry is not captured from a run (a CPU machine cannot run the kernels): the
OpSpec's CudaKernels.launches(case, sm_count) returns what its launcher would launch (the
kernel, its template instance, grid, threads, dynamic shared memory), sized by the same
functions the launcher calls (speedlight.launch.cuda_row_launch).

Access widths: every global load and store of a kernel is grouped by source line. A line
whose accesses are scalar by design (the scalar tail after a row's 16-byte vectors, a row
on the misaligned path, a per-row statistic) says so with the comment
`// speedlight: scalar` on that line; every other line is row data, held to its
KernelDesign.vector_bits.
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
from speedlight.inspect.findings import ERROR, INFO, WARN, Finding
from speedlight.inspect.guard import Shortfall
from speedlight.inspect.occupancy import Occupancy, Waves, occupancy
from speedlight.spec import Case, CudaKernels, CudaLaunch, KernelDesign
from speedlight.target import Target, arch_name

SCALAR_MARK = "speedlight: scalar"
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


_PTXAS_FIELDS = {
    "registers": r"Used (\d+) registers",
    "stack": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "barriers": r"used (\d+) barriers",
    "smem_static": r"(\d+) bytes smem",
}


def parse_ptxas(log: str) -> dict[str, dict]:
    """mangled name -> ptxas -v's resources of it (registers, stack, spills, smem_static)."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?([\w$.]+)'?", line)
        if m:
            current = out.setdefault(m.group(1), {k: 0 for k in _PTXAS_FIELDS})
            continue
        if current is None:
            continue
        for key, pattern in _PTXAS_FIELDS.items():
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


class Compiler:
    """Compiles each (source, arch) once per process (and once per machine: the cache)."""

    def __init__(self):
        self._done: dict[tuple, Binary] = {}

    def get(self, source: str | Path, arch: int, include_dirs=()) -> Binary:
        key = (str(source), arch, tuple(str(d) for d in include_dirs))
        if key not in self._done:
            self._done[key] = compile_source(source, arch, include_dirs=include_dirs)
        return self._done[key]


# --- one launch, judged ------------------------------------------------------------------

@dataclass
class LineAccess:
    """The global loads or stores one source line compiled to."""

    kind: str
    file: str
    line: int
    source: str
    sass: sass.LineAccess
    scalar: bool  # marked `// speedlight: scalar`: narrower than the design by design

    @property
    def bits(self) -> int:
        return self.sass.narrowest

    def to_json(self) -> dict:
        return {"kind": self.kind, "file": os.path.basename(self.file), "line": self.line,
                "source": self.source, "sass": dict(self.sass.widths), "scalar": self.scalar}


@dataclass
class CudaKernelReport:
    """One CUDA launch of a case: its kernel's resources, occupancy, waves, SASS and the
    findings, against its KernelDesign."""

    launch: CudaLaunch
    design: KernelDesign
    function: Function | None
    error: str = ""
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0  # static + the launch's dynamic shared memory, bytes per block
    occupancy: Occupancy | None = None
    waves: Waves | None = None
    mix: sass.Mix | None = None
    accesses: list[LineAccess] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def name(self) -> str:
        l = self.launch
        return f"{l.kernel}<{l.instance}>" if l.instance else l.kernel

    def to_json(self) -> dict:
        l = self.launch
        out = {"direction": l.direction, "kernel": self.name, "grid": l.grid,
               "threads": l.threads, "dynamic_smem": l.smem, "error": self.error or None,
               "function": self.function.demangled if self.function else None}
        if not self.error:
            out.update(registers=self.registers, spill_stores=self.spill_stores,
                       spill_loads=self.spill_loads, stack=self.stack, smem=self.smem,
                       occupancy=self.occupancy.to_json(), waves=self.waves.to_json(),
                       sass=self.mix.to_json(), accesses=[a.to_json() for a in self.accesses])
        out["findings"] = [f.to_json() for f in self.findings]
        return out


@dataclass
class CudaCaseReport:
    op: str
    case: Case
    target: Target
    sm_count: int
    source: str
    kernels: list[CudaKernelReport] = field(default_factory=list)
    error: str = ""
    binary_folder: Path | None = None  # the cached cubin, SASS and ptxas log


def _source_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return []


def scalar_lines(lines: list[str]) -> set[int]:
    """The 1-based lines `// speedlight: scalar` covers: the marked line, and when its code
    opens a block ('{'), every line to the brace that closes it."""
    out: set[int] = set()
    for i, text in enumerate(lines):
        if SCALAR_MARK not in text:
            continue
        out.add(i + 1)
        code = text.split("//")[0]
        if "{" not in code:
            continue
        depth = 0
        for j in range(i, len(lines)):
            part = lines[j].split("//")[0]
            depth += part.count("{") - part.count("}")
            out.add(j + 1)
            if depth <= 0:
                break
    return out


def analyse(launch: CudaLaunch, design: KernelDesign, binary: Binary, target: Target,
            sm_count: int) -> CudaKernelReport:
    """Resources, occupancy, waves, SASS mix and per-line access widths of one launch,
    with its findings."""
    report = CudaKernelReport(launch, design, None)
    if binary.error:
        report.error = binary.error
    else:
        fn = binary.find(launch.kernel, launch.instance)
        if fn is None:
            report.error = (f"no kernel {report.name} in {os.path.basename(binary.source)} "
                            f"(it has {', '.join(binary.kernels()) or 'none'})")
        report.function = fn
    if report.error:
        report.findings = [Finding("compile-error", ERROR, f"{report.name} did not compile "
                                   f"for {target.arch_name}: {report.error}", report.name)]
        return report
    fn = report.function
    p = fn.ptxas
    report.registers, report.stack = p.get("registers", 0), p.get("stack", 0)
    report.spill_stores, report.spill_loads = p.get("spill_stores", 0), p.get("spill_loads", 0)
    report.smem = p.get("smem_static", 0) + launch.smem
    warps = -(-launch.threads // 32)
    report.occupancy = occupancy(target.limits, warps, report.registers, report.smem)
    report.waves = Waves(launch.grid, sm_count, report.occupancy.blocks_per_sm)
    instrs = fn.instrs
    report.mix = sass.mix(instrs)
    text_of: dict[str, tuple[list[str], set[int]]] = {}
    for (file, line, kind), acc in sorted(sass.accesses_by_line(instrs).items()):
        if file not in text_of:
            lines = _source_lines(file)
            text_of[file] = (lines, scalar_lines(lines))
        lines, scalar = text_of[file]
        src = lines[line - 1].split("//")[0].strip() if 0 < line <= len(lines) else ""
        report.accesses.append(LineAccess(kind, file, line, src, acc, line in scalar))
    report.findings = findings(report, target.arch_name)
    return report


def findings(k: CudaKernelReport, target_name: str) -> list[Finding]:
    """What findings.py says of a Triton kernel, for a CUDA one: narrow row accesses (by
    source line), spills, tensor-core family, occupancy, the last wave and idle SMs."""
    name, d, out = k.name, k.design, []
    scalar = []
    for a in k.accesses:
        if a.bits >= d.vector_bits:
            continue
        if a.scalar:
            scalar.append(a)
            continue
        out.append(Finding(
            "narrow-access", WARN, f"line {a.line} `{a.source[:60]}`: {a.kind}s of row data "
            f"are {a.bits}-bit ({a.sass.describe()}), designed for {d.vector_bits}-bit",
            name, {"line": a.line, "sass": dict(a.sass.widths), "scalar": False}))
    if scalar:
        lines = sorted({a.line for a in scalar})
        out.append(Finding(
            "narrow-access", INFO, f"{len(scalar)} narrower accesses on lines marked scalar by "
            f"design ({', '.join(map(str, lines))}: `// {SCALAR_MARK}`)", name,
            {"lines": lines, "scalar": True}))
    local = sum(k.mix.local.values())
    if k.spill_stores or k.spill_loads or local:
        out.append(Finding(
            "spill", WARN, f"{k.spill_stores} bytes spilled to local memory ({k.spill_loads} "
            f"bytes reloaded): {k.registers} registers/thread, {k.stack}-byte stack frame, "
            f"{k.mix.local.get('STL', 0)} STL / {k.mix.local.get('LDL', 0)} LDL instructions",
            name, {"spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
                   "registers": k.registers, "stack": k.stack}))
    tc = k.mix.tensor_core
    if d.mma and not tc.get(d.mma):
        got = ", ".join(f"{op} x{n}" for op, n in sorted(tc.items())) or "no tensor-core op"
        out.append(Finding("no-wgmma", WARN, f"designed for {d.mma} on {target_name}, SASS has "
                           f"{got}", name, {"tensor_core": dict(tc)}))
    if d.tma and not k.mix.tma.get("UTMALDG"):
        out.append(Finding("no-tma", WARN, f"designed for TMA loads but the SASS on "
                           f"{target_name} has no UTMALDG", name, {"tma": dict(k.mix.tma)}))
    occ = k.occupancy
    if occ.fraction + 1e-9 < d.min_occupancy:
        out.append(Finding(
            "occupancy", WARN, f"theoretical occupancy {occ.fraction:.0%} ({occ.warps_per_sm} "
            f"of {occ.max_warps_per_sm} warps per SM, {occ.blocks_per_sm} blocks of "
            f"{k.launch.threads} threads), limited by {occ.limiter} ({k.registers} registers/"
            f"thread, {k.smem} bytes of shared memory); designed for at least "
            f"{d.min_occupancy:.0%}", name, occ.to_json()))
    w = k.waves
    if w.programs > w.per_wave and w.idle_share >= 0.5:
        out.append(Finding("last-wave", WARN, f"grid of {w.programs} blocks on {w.sms} SMs x "
                           f"{w.per_sm} resident: {w.waves:.2f} waves, the last one "
                           f"{w.idle_share:.0%} idle", name, w.to_json()))
    elif w.programs < w.sms:
        out.append(Finding("idle-sms", INFO, f"grid of {w.programs} blocks on {w.sms} SMs: "
                           f"{w.sms - w.programs} SMs have no work", name, w.to_json()))
    return out


def check(k: CudaKernelReport) -> list[Shortfall]:
    """The guard (guard.check_kernel's checks for a CUDA kernel): a compile error; a
    row-data line narrower than vector_bits; no access of vector_bits at all in a kernel
    designed for vectors; spills; occupancy; the tensor-core family and TMA a design names."""
    name, d = k.name, k.design
    if k.error:
        return [Shortfall(name, "compile", k.error)]
    out = []
    for a in k.accesses:
        if not a.scalar and a.bits < d.vector_bits:
            out.append(Shortfall(name, "vector", f"line {a.line} {a.kind} `{a.source[:60]}`: "
                                 f"{a.sass.describe()}, designed for {d.vector_bits}-bit"))
    for kind, widths in (("load", k.mix.global_loads), ("store", k.mix.global_stores)):
        if widths and d.vector_bits > 32 and not any(b >= d.vector_bits for b in widths):
            got = ", ".join(f"{b}-bit x{n}" for b, n in sorted(widths.items()))
            out.append(Shortfall(name, "vector", f"no {d.vector_bits}-bit global {kind} at "
                                 f"all ({got})"))
    if not d.spills and (k.spill_stores or k.spill_loads or sum(k.mix.local.values())):
        out.append(Shortfall(name, "spill", f"{k.spill_stores} bytes spilled "
                             f"({k.registers} registers/thread)"))
    if k.occupancy.fraction + 1e-9 < d.min_occupancy:
        out.append(Shortfall(name, "occupancy", f"{k.occupancy.fraction:.0%} theoretical "
                             f"(limited by {k.occupancy.limiter}), designed for at least "
                             f"{d.min_occupancy:.0%}"))
    if d.mma and not k.mix.tensor_core.get(d.mma):
        out.append(Shortfall(name, "mma", f"designed for {d.mma}, SASS has none"))
    if d.tma and not k.mix.tma.get("UTMALDG"):
        out.append(Shortfall(name, "tma", "designed for TMA loads, SASS has no UTMALDG"))
    return out


def inspect_case(op: str, kernels: CudaKernels, designs, case: Case, target: Target,
                 sm_count: int, compiler: Compiler | None = None) -> CudaCaseReport:
    """Every launch kernels.launches(case, sm_count) names, compiled for `target` and judged
    against designs[kernel] (an OpSpec's kernels; KernelDesign() for one not named)."""
    compiler = compiler or Compiler()
    report = CudaCaseReport(op, case, target, sm_count, str(kernels.source)[:200])
    try:
        binary = compiler.get(kernels.source, target.arch, kernels.include_dirs)
        launches = list(kernels.launches(case, sm_count))
    except (CudaToolError, FileNotFoundError, ValueError) as e:
        report.error = str(e)
        return report
    report.source, report.binary_folder = binary.source, binary.folder
    for launch in launches:
        report.kernels.append(analyse(launch, designs.get(launch.kernel, KernelDesign()),
                                      binary, target, sm_count))
    return report


def judge(spec, report: CudaCaseReport) -> tuple[list[Shortfall], list[Shortfall]]:
    """(held, informational), as guard.judge for Triton kernels: a compile error always
    counts; the designs cover aligned cases (guard.aligned: contiguous rows, 16-byte
    aligned widths, finite inputs); elsewhere a shortfall is information."""
    from speedlight.inspect import guard

    found = [Shortfall(report.op, "compile", report.error)] if report.error else \
        [s for k in report.kernels for s in check(k)]
    covered = guard.aligned(spec, report.case)
    held = [s for s in found if s.check == "compile" or covered]
    return held, [s for s in found if s not in held]


# --- output --------------------------------------------------------------------------------

def rows(report: CudaCaseReport, base: dict) -> list[dict]:
    """inspect.jsonl rows of a report (`base`: the fields every row of the run carries)."""
    base = dict(base, op=report.op, implementation="speedlight-cuda", case_id=report.case.id,
                case=report.case.to_json(), target=report.target.arch_name,
                sm_count=report.sm_count, source=report.source)
    if report.error or not report.kernels:
        return [dict(base, level="case", status="error" if report.error else "no-launch",
                     reason=report.error or "no CUDA launch for this case")]
    return [dict(base, level="kernel", **k.to_json()) for k in report.kernels]


def print_case(report: CudaCaseReport, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = (f"{report.op} {report.case.id} (CUDA C++, "
             f"{os.path.basename(report.source)}) on {report.target.arch_name}, launches "
             f"sized for {report.sm_count} SMs")
    if report.error:
        console.print(f"[red]{escape(title)}: {escape(report.error)}[/]", highlight=False)
        return
    t = Table(title=title, title_justify="left")
    for col in ("dir", "kernel", "grid x threads", "regs", "spills", "smem", "occupancy",
                "waves", "global loads", "global stores"):
        t.add_column(col)
    for k in report.kernels:
        l = k.launch
        if k.error:
            t.add_row(l.direction, escape(k.name), f"{l.grid} x {l.threads}", "", "", "", "",
                      "", f"[red]{escape(k.error)}[/]", "")
            continue
        widths = lambda c: ", ".join(f"{b}b x{n}" for b, n in sorted(c.items(), reverse=True))
        t.add_row(l.direction, escape(k.name), f"{l.grid} x {l.threads}", str(k.registers),
                  str(k.spill_stores), str(k.smem), f"{k.occupancy.fraction:.0%}",
                  f"{k.waves.waves:.2f}", widths(k.mix.global_loads),
                  widths(k.mix.global_stores))
    console.print(t)
    for k in report.kernels:
        for f in k.findings:
            style = {"error": "red", "warn": "yellow"}.get(f.severity, "dim")
            console.print(f"[{style}]{f.severity}[/] {escape(f.kernel)}: {f.code}: "
                          f"{escape(f.text)}", highlight=False)


def print_summary(reports: list[CudaCaseReport], console) -> None:
    """One row per kernel of every case (`inspect --all --impl cuda`), then the warnings."""
    from rich.markup import escape
    from rich.table import Table

    if not reports:
        return
    r0 = reports[0]
    t = Table(title=f"CUDA C++ kernels on {r0.target.arch_name} (launches sized for "
                    f"{r0.sm_count} SMs)", title_justify="left")
    for col in ("op", "case", "dir", "kernel", "grid x threads", "regs", "spills",
                "occupancy", "waves", "128-bit loads", "warnings"):
        t.add_column(col)
    for r in reports:
        if r.error:
            t.add_row(r.op, r.case.id, "", "", "", "", "", "", "", "",
                      f"[red]{escape(r.error[:80])}[/]")
            continue
        for k in r.kernels:
            l = k.launch
            warns = sum(f.severity != INFO for f in k.findings)
            if k.error:
                t.add_row(r.op, r.case.id, l.direction, escape(k.name), "", "", "", "", "", "",
                          f"[red]{escape(k.error[:80])}[/]")
                continue
            loads = sum(k.mix.global_loads.values())
            wide = sum(n for b, n in k.mix.global_loads.items() if b >= 128)
            t.add_row(r.op, r.case.id, l.direction, escape(k.name), f"{l.grid} x {l.threads}",
                      str(k.registers), str(k.spill_stores), f"{k.occupancy.fraction:.0%}",
                      f"{k.waves.waves:.2f}", f"{wide}/{loads}",
                      f"[yellow]{warns}[/]" if warns else "0")
    console.print(t)
    for r in reports:
        for k in r.kernels:
            for f in k.findings:
                if f.severity != INFO:
                    console.print(f"[yellow]{f.severity}[/] ({r.case.id}) {escape(f.kernel)}: "
                                  f"{f.code}: {escape(f.text)}", highlight=False)
