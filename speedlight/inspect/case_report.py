"""The one report inspect makes of a case, whichever compiler built its kernels: per
kernel the resources, occupancy, waves, instruction mix and per-source-line access widths;
per direction the bytes moved against the compulsory bytes; and the findings
(findings.py), the guard (guard.py), the rows (rows.py) and the tables (display.py) read
only this.

Two compilers feed it: Triton (a launch captured from the op's run, compiled by
compile.TritonCompiler for an NVIDIA or AMD target; analyse_kernel below reads its SASS or
AMDGCN) and nvcc (an OpSpec's CUDA C++ launches,
compiled by cuda_compile.NvccCompiler; cuda.analyse)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from speedlight.hardware import DeviceSpec
from speedlight.inspect import amdgcn, loops, sass
from speedlight.inspect.compile import Compiled
from speedlight.inspect.launches import Capture, Launch
from speedlight.inspect.occupancy import Occupancy, Waves, occupancy
from speedlight.inspect.traffic import Site, source_line, statement_span
from speedlight.spec import Case, CudaLaunch, KernelDesign, OpSpec
from speedlight.target import Target


@dataclass
class Access:
    """One global load or store in the source: what it compiled to, and (Triton, under the
    interpreter) what it touched. A CUDA C++ line is row data unless its source marks it
    scalar (`marked`: classified by the source's marks, not measured)."""

    kind: str  # load | store
    arg: str  # kernel argument it touches ('?' when not measured)
    file: str
    line: int
    source: str
    possible_bits: int  # widest access the addresses allow (0: not measured)
    sass: sass.LineAccess | None
    site: Site | None
    parameter: bool = False  # a 1-D tensor one block reads whole (a weight vector)
    marked: bool = False  # row data unless `scalar` (CUDA C++: `// speedlight: scalar`)
    scalar: bool = False  # narrower than the design by design (a marked line)

    @property
    def block_bytes(self) -> int:
        return self.site.numel * self.site.itemsize if self.site else 0

    @property
    def row_data(self) -> bool:
        """What the vector guard holds to full width. Measured (Triton): contiguous,
        16-byte-aligned rows, at least a warp's worth of 16-byte accesses per block (512
        bytes); not a per-row scalar (rstd of a few rows), nor a parameter vector each
        program reads whole once (w of [n_cols]), whose traffic the grid amortises.
        Marked (CUDA C++): every line not marked scalar."""
        if self.marked:
            return not self.scalar
        return self.possible_bits >= 128 and self.block_bytes >= 512 and not self.parameter

    @property
    def bits(self) -> int:
        """Narrowest width the machine code uses for it (0 when it compiled to no global
        access)."""
        return self.sass.narrowest if self.sass else 0

    def to_json(self) -> dict:
        return {"kind": self.kind, "arg": self.arg, "file": os.path.basename(self.file),
                "line": self.line, "source": self.source, "possible_bits": self.possible_bits,
                "sass": dict(self.sass.widths) if self.sass else {},
                "bytes": self.site.bytes if self.site else None, "row_data": self.row_data,
                "parameter": self.parameter, "scalar": self.scalar}


@dataclass
class KernelReport:
    """One launch of one kernel, compiled for the target: a Triton launch (`launch` a
    launches.Launch, `compiled` its Compiled) or a CUDA C++ one (`launch` a spec.CudaLaunch,
    `function` its cuda_compile.Function)."""

    launch: Launch | CudaLaunch
    design: KernelDesign
    compiled: Compiled | None = None
    function: object = None
    error: str = ""  # it did not compile for the target (or is not in the binary)
    num_warps: int = 0
    registers: int = 0  # per thread (AMD: VGPRs per lane)
    agprs: int = 0  # AMD: accumulation VGPRs per lane (MFMA results)
    sgprs: int = 0  # AMD: scalar registers per wave
    warp_size: int = 32  # lanes of a warp (64: an AMD wavefront)
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0  # static + dynamic shared memory, bytes per program
    occupancy: Occupancy | None = None
    waves: Waves | None = None
    mix: sass.Mix | None = None
    accesses: list[Access] = field(default_factory=list)
    has_dot: bool = False
    stages: int = 1  # buffers of the deepest multi-buffered shared allocation (pipeline_stages)
    # a warp-specialized kernel: its worker partitions, (warps, registers asked) from the
    # TTGIR (warp_roles), and the register counts its SASS moves warps to (USETMAXREG)
    partitions: list = field(default_factory=list)
    setmaxnreg: tuple = ()
    smem_limit: int = 0  # the target's shared memory per block (opt-in maximum)
    loops: list = field(default_factory=list)  # loops.Loop, in code order
    # what the prediction is made for: (the SKU, AMD or not); the prediction itself is made
    # on first use (`predicted`): simulating every loop costs, and most uses never ask
    predict_for: tuple | None = None
    _prediction: tuple | None = field(default=None, repr=False)
    findings: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.error

    def _predicted(self) -> tuple:
        """(predict.Prediction or None, why not), made once."""
        if self._prediction is None:
            from speedlight.inspect import prediction

            if self.error or self.predict_for is None or self.compiled is None:
                self._prediction = (None, "a CUDA C++ kernel: no TTIR to count its loops' "
                                          "iterations" if self.cuda else "not compiled")
            else:
                sku, amd = self.predict_for
                reader = amdgcn if amd else sass
                instrs = reader.parse(self.compiled.text("amdgcn" if amd else "sass"))
                try:
                    self._prediction = prediction.predict_kernel(
                        self, instrs, self.compiled.text("ttir"), sku, amd=amd)
                except (ValueError, KeyError, ZeroDivisionError, TypeError, IndexError,
                        RecursionError) as e:  # the figures are still reported
                    self._prediction = (None, f"the model failed: {type(e).__name__}: {e}")
        return self._prediction

    @property
    def predicted(self):
        """predict.Prediction of this launch on the target's SKU (None: see unpredicted)."""
        return self._predicted()[0]

    @property
    def unpredicted(self) -> str:
        """Why there is no prediction ('' when there is one)."""
        return self._predicted()[1]

    @property
    def steady_loop(self):
        """The loop that runs the kernel's steady state (loops.Loop), None without loops."""
        return loops.steady(self.loops)

    @property
    def resident(self) -> float:
        """Programs resident at once on an SM that has work: what the resources allow, or
        fewer when the grid does not fill the GPU (a grid smaller than the SM count leaves
        SMs idle, which the idle-sms finding tells, and one program on each of the rest)."""
        w = self.waves
        if not w or not w.programs:
            return 0.0
        return min(w.per_sm, max(1.0, w.programs / w.sms))

    def in_flight_per_sm(self) -> int:
        """Bytes of global loads each SM keeps in flight in the steady-state loop: a thread's
        (loops.Loop.in_flight) x the program's threads x the programs resident per SM."""
        lp = self.steady_loop
        if lp is None or not lp.in_flight:
            return 0
        return int(lp.in_flight * self.num_warps * self.warp_size * self.resident)

    def in_flight_json(self) -> dict | None:
        lp = self.steady_loop
        if lp is None:
            return None
        return {"loop": lp.index, "per_thread": lp.in_flight, "threads": self.num_warps *
                self.warp_size, "resident_per_sm": round(self.resident, 3),
                "per_sm": self.in_flight_per_sm(), "prefetch": lp.prefetch,
                "overlap": round(lp.overlap, 3)}

    @property
    def cuda(self) -> bool:
        return isinstance(self.launch, CudaLaunch)

    @property
    def name(self) -> str:
        """The kernel's name; a CUDA template's with its instance (k<__nv_bfloat16>)."""
        l = self.launch
        return f"{l.kernel}<{l.instance}>" if self.cuda and l.instance else l.kernel

    @property
    def direction(self) -> str:
        return self.launch.direction

    @property
    def programs(self) -> int:
        return self.launch.grid if self.cuda else self.launch.programs

    @property
    def grid_text(self) -> str:
        if self.cuda:
            return f"{self.launch.grid} x {self.launch.threads}"
        return "x".join(str(g) for g in self.launch.grid if g > 1) or "1"

    def _launch_json(self) -> dict:
        l = self.launch
        if self.cuda:
            return {"grid": l.grid, "threads": l.threads, "dynamic_smem": l.smem,
                    "num_warps": self.num_warps,
                    "function": self.function.demangled if self.function else None}
        out = {"launch": l.index, "grid": list(l.grid), "programs": l.programs,
               "num_warps": l.num_warps, "num_stages": l.num_stages,
               "args": [a.to_json() for a in l.args], "signature": l.signature}
        if l.measured:
            out.update(loaded=l.loaded, stored=l.stored)
        return out

    def to_json(self) -> dict:
        out = {"direction": self.direction, "kernel": self.name, **self._launch_json(),
               "error": self.error or None}
        if self.ok:
            if self.warp_size != 32:  # AMD: its registers, and the HIP knobs it compiled with
                meta = self.compiled.meta
                out.update(agprs=self.agprs, sgprs=self.sgprs, warp_size=self.warp_size,
                           hip_options={k: meta[k] for k in HIP_OPTIONS if k in meta})
            out.update(registers=self.registers, spill_stores=self.spill_stores,
                       spill_loads=self.spill_loads, stack=self.stack, smem=self.smem,
                       occupancy=self.occupancy.to_json(), waves=self.waves.to_json(),
                       sass=self.mix.to_json(), accesses=[a.to_json() for a in self.accesses],
                       has_dot=self.has_dot, stages=self.stages, smem_limit=self.smem_limit,
                       spill_bytes=self.spill_stores, loops=[lp.to_json() for lp in self.loops],
                       in_flight=self.in_flight_json(),
                       predicted=self.predicted.to_json() if self.predicted else None,
                       unpredicted=self.unpredicted or None)
            if self.partitions:
                out.update(partitions=[list(p) for p in self.partitions],
                           setmaxnreg=list(self.setmaxnreg))
        out["findings"] = [f.to_json() for f in self.findings]
        return out


# The AMD tuning knobs a compiled kernel's metadata records (to_json's hip_options)
HIP_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")


def read_resources(report: KernelReport, resources: dict, smem: int, instrs: list,
                   target: Target, sm_count: int) -> None:
    """What every compiler's kernel reports alike: registers, spills and stack (ptxas's
    resource report, or the AMDGCN assembler's), shared memory (LDS), occupancy on the
    target's SM (CU), waves of its grid on `sm_count` SMs, and the instruction mix."""
    report.registers = resources.get("registers", 0)
    report.spill_stores = resources.get("spill_stores", 0)
    report.spill_loads = resources.get("spill_loads", 0)
    report.stack = resources.get("stack", 0)
    report.smem = smem
    if target.vendor == "amd":
        report.agprs, report.sgprs = resources.get("agprs", 0), resources.get("sgprs", 0)
        report.warp_size = target.warp_size
        report.occupancy = amdgcn.occupancy(target.limits, report.num_warps,
                                            resources.get("total_vgprs", report.registers),
                                            report.sgprs, smem)
        report.mix = amdgcn.mix(instrs)
    else:
        report.occupancy = occupancy(target.limits, report.num_warps, report.registers, smem)
        report.mix = sass.mix(instrs)
    report.waves = Waves(report.programs, sm_count, report.occupancy.blocks_per_sm)
    report.smem_limit = target.limits.smem_per_block


@dataclass
class DirectionBytes:
    """What one direction's launches moved, against the OpSpec's compulsory bytes."""

    direction: str
    measured: int  # bytes loaded + stored by the direction's kernels (interpreter)
    compulsory: int
    kernels: list[str]
    by_arg: dict  # tensor (its address range) -> {"arg", "kernels", "loaded", "stored", "size"}
    allowed: float  # most bytes per compulsory byte the kernels' designs allow
    why: str
    # Measured on a smaller case with the same kernels (its label), the case itself being
    # too large to run under the interpreter; then `size_compulsory` is the compulsory
    # bytes of the case reported, at its own size.
    measured_on: str = ""
    size_compulsory: int = 0

    @property
    def ratio(self) -> float:
        return self.measured / self.compulsory if self.compulsory else float("nan")

    def to_json(self) -> dict:
        out = {"direction": self.direction, "measured_bytes": self.measured,
               "compulsory_bytes": self.compulsory, "ratio": round(self.ratio, 4),
               "allowed_ratio": self.allowed, "kernels": self.kernels,
               "by_tensor": list(self.by_arg.values())}
        if self.measured_on:
            out.update(measured_on=self.measured_on, size_compulsory_bytes=self.size_compulsory)
        return out


@dataclass
class CaseReport:
    """Everything inspect says of one (op, case, implementation) on a target."""

    op: str
    case: Case
    target: Target
    device: DeviceSpec  # the SKU launches are sized for
    kernels: list[KernelReport] = field(default_factory=list)
    directions: list[DirectionBytes] = field(default_factory=list)
    findings: list = field(default_factory=list)
    note: str = ""
    skipped: str = ""
    error: str = ""  # the op raised while captured, or its source did not compile
    impl: str = "triton"  # which implementation's kernels: triton | cuda
    source: str = ""  # the CUDA C++ source compiled ('' for Triton: each kernel's own file)
    binary_folder: object = None  # the CUDA cubin, SASS and ptxas log (for --dump)
    sm_count: int = 0  # the SMs launches are sized for (0: the device's)

    def __post_init__(self):
        self.sm_count = self.sm_count or self.device.sm_count

    @property
    def language(self) -> str:
        return "cuda" if self.impl == "cuda" else "triton"

    @property
    def all_findings(self) -> list:
        return self.findings + [f for k in self.kernels for f in k.findings]


def _same_file(a: str, b: str) -> bool:
    """Whether two source paths name the same kernel file. A compiled kernel is cached by
    its source, not its path, so its line table may name the same file in another checkout
    (a worktree, a CI clone): the last three path components decide."""
    if a == b or os.path.realpath(a) == os.path.realpath(b):
        return True
    tail = lambda p: tuple(os.path.normpath(p).split(os.sep)[-3:])  # noqa: E731
    return tail(a) == tail(b)


def analyse_kernel(launch: Launch, compiled: Compiled, target: Target, device: DeviceSpec,
                   design: KernelDesign) -> KernelReport:
    """A Triton launch's KernelReport from its compiled kernel (findings are filled by
    findings.case_findings)."""
    report = KernelReport(launch, design, compiled, error=compiled.error)
    if compiled.error:
        return report
    report.num_warps = int(compiled.meta.get("num_warps", launch.num_warps))
    reader = amdgcn if target.vendor == "amd" else sass
    instrs = reader.parse(compiled.text("amdgcn" if reader is amdgcn else "sass"))
    resources = compiled.resources
    smem = int(compiled.meta.get("shared", 0) or 0) + resources.get("smem_static", 0)
    read_resources(report, resources, smem, instrs, target, device.sm_count)
    ttir, ttgir = compiled.text("ttir"), compiled.text("ttgir")
    report.has_dot = ("tt.dot" in ttir or "tt.dot_scaled" in ttir
                      or any(op in ttgir for op in _GLUON_MMA))  # Gluon: no TTIR
    report.stages = pipeline_stages(ttgir)
    report.partitions = warp_roles(ttgir)
    report.setmaxnreg = tuple(sorted({int(m, 16) for m in _SETMAXNREG.findall(
        compiled.text("sass"))}))
    report.accesses = _join(launch, reader.accesses_by_line(instrs))
    report.loops = _kernel_loops(compiled, report.num_warps, reader is amdgcn)
    report.predict_for = (device, reader is amdgcn)
    return report


# A Gluon kernel's MMAs in its TTGIR (it has no TTIR's tt.dot)
_GLUON_MMA = ("ttng.warp_group_dot", "ttng.tc_gen5_mma")
# ttg.warp_specialize(...) attributes {requestedRegisters = array<i32: 240, 24>}, then each
# worker's `partitionN(...) num_warps(4) {`
_WS_REGS = re.compile(r"ttg\.warp_specialize\([^\n]*requestedRegisters = array<i32: ([\d, ]+)>")
_PARTITION = re.compile(r"^\s*partition\d+\([^\n]*\)\s*num_warps\((\d+)\)", re.M)
_SETMAXNREG = re.compile(r"USETMAXREG\.\w+\.\w+\s+(?:U?P\w+,\s*)?0x([0-9a-f]+)")


def warp_roles(ttgir: str) -> list[tuple[int, int | None]]:
    """A warp-specialized kernel's worker partitions, (warps, registers asked; None when
    none is asked), in order; [] for a kernel that is not warp-specialized."""
    warps = [int(w) for w in _PARTITION.findall(ttgir)]
    regs = _WS_REGS.search(ttgir)
    asked = [int(r) for r in regs.group(1).split(",")] if regs else []
    return [(w, asked[i] if i < len(asked) else None) for i, w in enumerate(warps)]


_LOOPS: dict = {}  # a compiled kernel's listing -> its loops (read once, however many launches)


def _kernel_loops(compiled: Compiled, num_warps: int, amd: bool) -> list:
    stage = "amdgcn" if amd else "sass"
    key = (compiled.files.get(stage), num_warps)
    if key[0] is None or key not in _LOOPS:
        found = loops.kernel_loops(compiled.text(stage), num_warps=num_warps,
                                   ttgir=compiled.text("ttgir"), amd=amd)
        if key[0] is None:
            return found
        if len(_LOOPS) > 2048:
            _LOOPS.clear()
        _LOOPS[key] = found
    return _LOOPS[key]


# A shared-memory allocation in TTGIR: `ttg.local_alloc : () -> !ttg.memdesc<4x128x64xbf16, ...`
_LOCAL_ALLOC = re.compile(r"ttg\.local_alloc\b[^\n]*?!ttg\.memdesc<((?:\d+x)+)([a-z]\w*)")


def pipeline_stages(ttgir: str) -> int:
    """How many stages a kernel's software pipeline has: the leading dimension of its
    deepest multi-buffered shared-memory allocation of operand tiles (Triton's pipeliner
    allocates `stages x tile` buffers for each operand a loop loads ahead, whether by
    cp.async or TMA; the mbarrier arrays beside them, i64, are not counted). 1 when
    nothing is multi-buffered."""
    stages = 1
    for m in _LOCAL_ALLOC.finditer(ttgir):
        dims = [int(d) for d in m.group(1).rstrip("x").split("x")]
        if len(dims) >= 3 and m.group(2) != "i64":
            stages = max(stages, dims[0])
    return stages


def _join(launch: Launch, by_line: dict) -> list[Access]:
    """Interpreter sites joined with the SASS lines they compiled to; SASS lines no site
    explains (nothing was measured) are kept with arg '?'."""
    out, used = [], set()
    for site in sorted(launch.sites.values(), key=lambda s: (s.line, s.kind)):
        first, last = statement_span(site.file, site.line)
        match = None
        for key, acc in by_line.items():
            if first <= key[1] <= last and key[2] == site.kind and _same_file(key[0], site.file):
                if match is None:
                    match = type(acc)(site.file, site.line, site.kind)
                match.widths.update(acc.widths)
                used.add(key)
        arg = launch.arg(site.arg)
        parameter = (arg is not None and arg.kind == "tensor" and len(arg.shape) == 1
                     and site.numel >= arg.shape[0])
        out.append(Access(site.kind, site.arg, site.file, site.line,
                          source_line(site.file, site.line).strip(), site.widest_bits, match,
                          site, parameter))
    for key, acc in sorted(by_line.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if key not in used and key[0] and not key[0].endswith(("standard.py", "core.py")):
            out.append(Access(key[2], "?", key[0], key[1], source_line(key[0], key[1]).strip(),
                              0, acc, None))
    return out


def direction_bytes(spec: OpSpec, capture: Capture) -> list[DirectionBytes]:
    """Per direction, the bytes the interpreter counted against cost(case, direction)."""
    out = []
    for d in ("fwd", "bwd"):
        launches = capture.direction(d)
        if not launches or not all(l.measured for l in launches):
            continue
        cost = spec.cost(capture.case, d)
        if cost is None:
            continue
        by_arg: dict = {}
        for l in launches:
            for s in l.sites.values():
                a = l.arg(s.arg)
                tensor = a is not None and a.kind == "tensor"
                key = (a.lo, a.hi) if tensor else (l.kernel, s.arg)
                entry = by_arg.setdefault(key, {"arg": s.arg, "kernels": [], "loaded": 0,
                                                "stored": 0, "size": 0})
                if l.kernel not in entry["kernels"]:
                    entry["kernels"].append(l.kernel)
                entry["loaded" if s.kind == "load" else "stored"] += s.bytes
                if tensor:
                    numel = 1
                    for n in a.shape:
                        numel *= n
                    entry["size"] = numel * s.itemsize
        designs = [spec.design(l.kernel) for l in launches]
        allowed = max(x.bytes_ratio for x in designs)
        why = "; ".join(sorted({x.why for x in designs if x.why}))
        out.append(DirectionBytes(d, sum(l.loaded + l.stored for l in launches), cost.bytes,
                                  [l.kernel for l in launches], by_arg, allowed, why))
    return out
