"""The vocabulary every speedlight tool shares: Case, Cost, Tolerance, OpSpec.

An operation is described once, by its OpSpec; verify, bench, inspect, profile and report
read that description and need no per-op code of their own.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

LAYOUTS = ("contiguous", "strided", "transposed")

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
    "fp8": torch.float8_e4m3fn,  # fp8 GEMM operands (e4m3); their outputs are bf16
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """Short name used in case ids and results: fp32, fp16, bf16."""
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Accept 'bf16', 'bfloat16', 'torch.bfloat16' or a torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = name.strip().lower().replace("torch.", "")
    aliases = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
               "bfloat16": "bf16", "float64": "fp64", "double": "fp64",
               "float8_e4m3fn": "fp8", "e4m3": "fp8"}
    key = aliases.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[key]


def _freeze(mapping: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> tuple:
    if mapping is None:
        return ()
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple((str(k), v) for k, v in items)


@dataclass(frozen=True)
class Case:
    """One concrete input configuration of an op.

    `params` are the named shape parameters in the order they appear in the id
    (`rows=4096, hidden=4096`); `flags` are options that change what is computed
    (`causal`, `weight=False`); `layout` says how the inputs sit in memory:
    contiguous, strided (a view whose row stride is larger than the row), or
    transposed (the reduced dimension is not the innermost one in memory).
    """

    op: str
    params: tuple = ()
    dtype: torch.dtype = torch.float32
    layout: str = "contiguous"
    flags: tuple = ()
    seed: int = 0
    model: str | None = None  # the model configuration this shape comes from, if any

    def __post_init__(self):
        object.__setattr__(self, "params", _freeze(self.params))
        object.__setattr__(self, "flags", _freeze(self.flags))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    def __getitem__(self, name: str) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"case {self.id} has no shape parameter {name!r}")

    def flag(self, name: str, default: Any = None) -> Any:
        for k, v in self.flags:
            if k == name:
                return v
        return default

    @property
    def shape(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def id(self) -> str:
        """op-params-dtype[-layout][-flags], e.g. rms_norm-rows4096-hidden4096-bf16-strided."""
        return "-".join([self.op, self._shape_label(), dtype_name(self.dtype)] + self._tail())

    @property
    def label(self) -> str:
        """The id without op and dtype: rows4096-hidden4096-strided."""
        return "-".join([self._shape_label()] + self._tail())

    def _shape_label(self) -> str:
        return "-".join(f"{k}{v}" for k, v in self.params)

    def _tail(self) -> list[str]:
        parts = []
        if self.layout != "contiguous":
            parts.append(self.layout)
        for k, v in self.flags:
            if v is True:
                parts.append(k)
            elif v is False:
                parts.append(f"no{k}")
            elif v is not None:
                parts.append(f"{k}{v}")
        return parts

    def with_(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {"op": self.op, "id": self.id, "params": dict(self.params),
                "dtype": dtype_name(self.dtype), "layout": self.layout,
                "flags": dict(self.flags), "seed": self.seed, "model": self.model}


@dataclass(frozen=True)
class Cost:
    """FLOPs and compulsory bytes of the ideal implementation of one direction.

    FLOP counts a multiply-add as 2. Bytes are every input read once and every output
    written once, in the dtypes given. `saved`: the bytes the op holds besides its inputs,
    outputs and gradients, what its forward keeps for the backward (rstd, logsumexp) or,
    where more, holds while it runs (linear_cross_entropy's chunk of logits); profile's
    advice weighs it against what the chain it replaces keeps.
    """

    flops: int
    bytes: int
    saved: int = 0

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes,
                    self.saved + other.saved)


@dataclass(frozen=True)
class Tolerance:
    """When an output of dtype d passes against the float64 reference.

    An error passes when it is at most `k` times the error PyTorch itself makes on the
    same inputs in dtype d, that error taken as at least `floor` (one rounding of d), and
    it never passes above `ceiling`, however large PyTorch's own error is.
    The rule is applied to the relative L2 error and to the max abs error (the latter
    scaled by max |reference|).
    """

    k: float
    floor: float
    ceiling: float


# The one tolerance table. floor = the unit roundoff of the dtype (half an ulp at 1.0, the
# error of one correct rounding); ceiling = the largest relative L2 error any speedlight
# kernel may have in that dtype.
TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(k=4.0, floor=2.0 ** -24, ceiling=1e-4),
    torch.float16: Tolerance(k=4.0, floor=2.0 ** -11, ceiling=1e-2),
    torch.bfloat16: Tolerance(k=4.0, floor=2.0 ** -8, ceiling=4e-2),
    # fp8 (e4m3) operands: exact in float64, so the error is the GEMM's own; the output is
    # bf16 (bf16's floor), and the gradients of fp8 operands come back in fp8, one e4m3
    # rounding (unit roundoff 2^-4) each, which the ceiling allows beside the k-rule
    torch.float8_e4m3fn: Tolerance(k=4.0, floor=2.0 ** -8, ceiling=0.1),
}


@dataclass(frozen=True)
class KernelDesign:
    """What one Triton kernel was designed to compile to, on the GPU it is sized for.

    `speedlight inspect` reports against it, and its CI guards fail a kernel that falls
    short: `min_occupancy` is the theoretical occupancy (resident warps / the SM's maximum)
    the kernel's registers, shared memory and num_warps must allow; `vector_bits` the width
    of every global load and store of a contiguous, 16-byte-aligned row it moves (128 =
    LDG/STG.128); `spills` whether it may spill registers to local memory; `bytes_ratio`
    the most bytes it may move per compulsory byte of its direction when it is the only
    kernel of that direction (1.05: each input read once, each output written once), with
    `why` saying why a kernel needs more (e.g. a second pass over rows too long to hold).

    A matrix kernel's design also names what its main loop compiles to: `mma` the
    tensor-core instruction family its SASS must contain ("HGMMA": wgmma on bf16/fp16,
    "QGMMA": fp8 wgmma, "HMMA": mma.sync; None: not held to one); `tma` whether its
    operands arrive by TMA (UTMALDG in the SASS: tensor-descriptor loads); `min_stages`
    the pipeline depth its operand tiles must rotate through in shared memory (the
    buffers of its multi-buffered allocations in the TTGIR; 1: no pipeline required).
    Every kernel is also held to the target's shared memory per block (a kernel over it
    does not launch). A warp-specialized kernel's design names its worker partitions:
    `partitions`, (warps, registers) pairs (FlashAttention-3's roles: a consumer
    warpgroup at 240 registers, a producer warp at 24), which its TTGIR's
    ttg.warp_specialize must have and its SASS must move registers to (USETMAXREG).

    A design is written for the GPU its kernel was tuned on (sm_90a for speedlight's);
    `per_arch` gives the design for another compute capability, as (arch, KernelDesign)
    pairs (e.g. (100, ...): sm_100a's tcgen05 MMA, "UTCHMMA", whose accumulator lives in
    tensor memory); for_arch picks it.
    """

    min_occupancy: float = 0.25
    vector_bits: int = 128
    spills: bool = False
    bytes_ratio: float = 1.05
    why: str = ""
    mma: str | None = None
    tma: bool = False
    min_stages: int = 1
    partitions: tuple = ()
    per_arch: tuple = ()

    def for_arch(self, arch: int | None) -> "KernelDesign":
        """The design on compute capability `arch` (90, 100...): its per_arch entry, else
        this one."""
        return next((d for a, d in self.per_arch if a == arch), self)


@dataclass(frozen=True)
class CudaLaunch:
    """One launch of a CUDA C++ kernel, as its launcher would make it: the kernel's name in
    the source (rms_norm_fwd_kernel), its template arguments as a demangler writes them
    ("__nv_bfloat16, true"; "" for a kernel that is not a template), grid (blocks), threads
    per block, dynamic shared memory in bytes, and the direction (fwd | bwd)."""

    kernel: str
    instance: str = ""
    grid: int = 1
    threads: int = 128
    smem: int = 0
    direction: str = "fwd"


@dataclass(frozen=True)
class CudaKernels:
    """An op's CUDA C++ kernels as `speedlight inspect` reads them, with no GPU: `source`
    a torch-free .cu file (a path) or its text inline, which nvcc compiles alone;
    `launches(case, sm_count)` the CudaLaunch list its launcher makes for a case on a GPU
    of sm_count SMs (sized by the functions the launcher itself calls, e.g.
    speedlight.ops.rms_norm_cuda.cuda_row_launch); `include_dirs` where its quoted
    #includes are (besides the source's folder). The kernels' designs are OpSpec.kernels entries under
    the kernel's name, as for Triton kernels. `of_impl`: OpSpec.impl itself launches these
    kernels (a team's CUDA op: inspect has no Triton launches to capture), rather than
    another implementation beside a Triton one (speedlight's rms_norm)."""

    source: str
    launches: Callable[[Case, int], Sequence[CudaLaunch]]
    include_dirs: tuple[str, ...] = ()
    of_impl: bool = False


def _runs_anywhere(device: torch.device) -> str | None:
    return None


@dataclass(frozen=True)
class Implementation:
    """One implementation of an op, run side by side with the op's others by verify, bench,
    inspect and report, each row naming it.

    fn takes the OpSpec's inputs as keyword arguments (as OpSpec.impl does). language:
    "triton" or "cuda" (CUDA C++). verified: False until a GPU run has verified it: it is
    then never an op's default and every row and report labels it unverified.
    unavailable(device): why it cannot run there (a CPU build of torch, no GPU, no
    compiler), or None; verify and bench record it as skipped with that reason. (What
    `speedlight inspect` reads of a CUDA implementation's kernels is OpSpec.cuda.)
    named_only: run only where asked for by name (OpSpec.swept): an implementation no GPU
    has run at all (Gluon's, which the interpreter cannot run either), so a sweep over
    every implementation does not include it unasked.
    """

    fn: Callable[..., Any]
    language: str = "triton"
    verified: bool = True
    unavailable: Callable[[torch.device], str | None] = _runs_anywhere
    named_only: bool = False


def cuda_implementation(fn: Callable[..., Any], *, verified: bool = True) -> Implementation:
    """A CUDA C++ implementation: unavailable where speedlight.csrc.loader says an
    extension cannot run (a CPU build of torch, a CPU device, no GPU, no nvcc/ninja/c++)."""
    def unavailable(device: torch.device) -> str | None:
        from speedlight.csrc import loader  # torch only: no import cycle
        return loader.unavailable(device)
    return Implementation(fn, "cuda", verified, unavailable)


Inputs = dict  # keyword arguments of impl / reference: tensors and plain values


@dataclass
class Chain:
    """A run of PyTorch ops in a model's forward that one call of an op replaces, as the op's
    `OpSpec.recognise` finds it in a profile's graph: what was matched (in words), the
    forward ops' indices, the module it sits in, and the Case of the call that replaces it
    (which `OpSpec.cost` counts). `inside`: ops whose chains hold this one where both
    overlap (a softmax inside attention: it is part of theirs). `unstored`: bytes the chain
    holds that autograd's saved tensors do not show and the op never makes (the logits
    linear_cross_entropy never writes). profile sets `op` (the OpSpec's name) and
    `external` (the chain's ops whose outputs leave it)."""

    pattern: str
    fwd: set[int]
    module: str | None
    case: Case
    note: str = ""
    inside: tuple[str, ...] = ()
    unstored: int = 0
    op: str = ""
    external: set[int] = field(default_factory=set)


@dataclass
class OpSpec:
    """Everything the tools need to know about one operation.

    impl and reference take the same keyword arguments, the dict `make_inputs(case,
    device)` returns, and return a tensor or a tuple of tensors. `grad_inputs` names the
    tensor arguments that take gradients; every floating output is differentiated with a
    random upstream gradient. `cost(case, "fwd" | "bwd")` returns the Cost of each
    direction (None for "bwd" when the op has no backward). `suites[name]()` returns the
    cases of a suite in the case dtype float32; the harness sets dtype and seed.
    `skip(case, device)` returns the reason a runtime cannot run a case, or None.
    """

    # The op's name; "": its public function's (impl.__name__), as for every built-in op.
    name: str = ""
    impl: Callable[..., Any] | None = None
    _: dataclasses.KW_ONLY
    # The float64-capable reference; None: speedlight.reference.<name>, where every
    # built-in op's lives (a team's own op passes its own).
    reference: Callable[..., Any] | None = None
    make_inputs: Callable[[Case, torch.device], Inputs]
    cost: Callable[[Case, str], Cost | None]
    suites: Mapping[str, Callable[[], Sequence[Case]]]
    grad_inputs: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    tolerances: Mapping[torch.dtype, Tolerance] = field(default_factory=lambda: TOLERANCES)
    skip: Callable[[Case, torch.device], str | None] = lambda case, device: None
    notes: str = ""
    # Which role the op plays in a model; profile and report read it.
    family: str = "memory-bound"
    # for_model(model_config, batch, seq) -> the cases of this op inside that model (a
    # shapes.ModelConfig) at batch x seq tokens; [] when the model does not use the op.
    # `speedlight report` verifies and benches each op at these shapes.
    for_model: Callable[[Any, int, int], list[Case]] | None = None
    # Optional: kernel name -> what it was designed to compile to (inspect's guards hold
    # each kernel to it); a kernel not named is held to KernelDesign()'s defaults.
    kernels: Mapping[str, KernelDesign] = field(default_factory=dict)
    # Optional: whether a case's rows are contiguous and 16-byte aligned, so that its
    # kernels can be held to full-width vectors (inspect's guards compile those cases).
    # None: every shape parameter after the first (the row count) is a width that must be
    # a multiple of 16 elements, and the layout contiguous (aligned_rows below).
    aligned: Callable[[Case], bool] | None = None
    # Optional: how many rows (tokens) a case has; None: its first shape parameter.
    # inspect picks its representative and bytes-guard cases by it.
    count_rows: Callable[[Case], int] | None = None
    # Optional: case_of(call, args) -> the Case of one call of the op's registered custom
    # op (`call` its name without namespace, e.g. "rms_norm_bwd"; `args` its arguments by
    # name), or None when the call is not this op's. profile costs the call through `cost`.
    case_of: Callable[[str, Mapping[str, Any]], Case | None] | None = None
    # What the op fuses, as profile's advice names it: the PyTorch chain it replaces.
    fuses: str = ""
    # Optional: recognise(graph, calls) -> the Chains of PyTorch ops this op replaces in a
    # profiled forward (`graph` a speedlight.profile.patterns.Graph of its ops, `calls` the
    # module calls), each with the Case of the call replacing it; profile's advice costs
    # them through `cost`. None: profile advises nothing for the op.
    recognise: Callable[[Any, Sequence[Any]], list[Chain]] | None = None
    # Other libraries' function computing the same, compared with by bench:
    # library -> function name, e.g. {"liger": "liger_rms_norm"}.
    peers: Mapping[str, str] = field(default_factory=dict)
    # What speedlight.patch swaps for this op in a Hugging Face model (its kinds:
    # "rms_norm", "mlp", "rope", "cross_entropy", "decoder_layer"), or None when it
    # patches none.
    patches: str | None = None
    # Every implementation the tools run side by side, by name ("triton", "cuda"); the
    # first is the one rows label plain "speedlight". Empty: impl alone, as {"triton":
    # impl}, or {"cuda": impl} when cuda.of_impl. impl may be left out when given (the
    # first implementation's fn).
    implementations: Mapping[str, Implementation] = field(default_factory=dict)

    # Optional: the op's CUDA C++ kernels, which `speedlight inspect --impl cuda` compiles
    # with nvcc and holds to the designs in `kernels` (a CudaKernels).
    cuda: CudaKernels | None = None
    # Optional: the configuration space its launchers ask `speedlight.launch.config` in (a
    # speedlight.tuning.Configs of op `name`), which `speedlight tune` sweeps.
    configs: Any = None

    def __post_init__(self):
        _check_fields(self)
        if self.impl is None and self.implementations:
            self.impl = next(iter(self.implementations.values())).fn
        if self.impl is None:
            raise TypeError(f"OpSpec {self.name!r} needs impl, the function under test")
        if not self.implementations:  # impl alone: Triton's, or CUDA C++ (cuda.of_impl)
            self.implementations = (
                {"cuda": cuda_implementation(self.impl)} if self.cuda and self.cuda.of_impl
                else {"triton": Implementation(self.impl)})
        self.implementations = dict(self.implementations)
        first = next(iter(self.implementations))
        if self.implementations[first].fn is not self.impl:
            # a copy with another impl (dataclasses.replace(spec, impl=...)): impl stands
            # alone, as the first implementation
            self.implementations = {first: dataclasses.replace(self.implementations[first],
                                                               fn=self.impl)}
        self.name = self.name or self.impl.__name__
        if self.reference is None:
            from speedlight import reference  # no import cycle: reference needs only torch

            self.reference = getattr(reference, self.name, None)
            if self.reference is None:
                raise TypeError(f"OpSpec {self.name!r} has no reference: pass reference=, "
                                f"speedlight.reference has no {self.name!r}")

    def label(self, impl: str) -> str:
        """The `implementation` rows give implementation `impl`: "speedlight" for the
        first, "speedlight-<impl>" for the others (speedlight-cuda)."""
        return "speedlight" if impl == next(iter(self.implementations)) else f"speedlight-{impl}"

    def swept(self, named: Sequence[str] = ()) -> dict[str, Implementation]:
        """The implementations a sweep runs (verify, bench): every one but those run only
        by name (Implementation.named_only), unless `named` lists it (by name or label)."""
        return {n: i for n, i in self.implementations.items()
                if not i.named_only or n in named or self.label(n) in named}

    def cases(self, suite: str) -> list[Case]:
        if suite not in self.suites:
            raise ValueError(f"op {self.name!r} has no suite {suite!r}: "
                             f"expected one of {', '.join(self.suites)}")
        return list(self.suites[suite]())

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        return self.tolerances.get(dtype, TOLERANCES.get(dtype, TOLERANCES[torch.float32]))

    def design(self, kernel: str, arch: int | None = None) -> KernelDesign:
        """What `kernel` was designed to compile to on compute capability `arch` (its
        default design when None)."""
        return self.kernels.get(kernel, KernelDesign()).for_arch(arch)

    def rows(self, case: Case) -> int:
        """The case's rows (tokens): the OpSpec's count_rows, else its first parameter."""
        if self.count_rows is not None:
            return int(self.count_rows(case))
        return int(case.params[0][1]) if case.params else 0

    def aligned_rows(self, case: Case) -> bool:
        """Whether the case's rows are contiguous and 16-byte aligned: the OpSpec's own
        `aligned` rule, else every shape parameter after the first a multiple of 16
        elements with a contiguous layout. Triton specialises integer arguments on
        divisibility by 16 only, so a width of 8k (1000) leaves a mask it cannot prove
        constant over 8 lanes; every model width is a multiple of 16."""
        if self.aligned is not None:
            return bool(self.aligned(case))
        widths = [v for _, v in case.params[1:]]
        return case.layout == "contiguous" and all(isinstance(v, int) and v % 16 == 0
                                                   for v in widths)


def _mapping_of(key: type, value: type | Callable) -> Callable[[Any], bool]:
    def check(v) -> bool:
        ok = value if not isinstance(value, type) else (lambda x: isinstance(x, value))
        return isinstance(v, Mapping) and all(isinstance(k, key) and ok(x) for k, x in v.items())
    return check


def _sequence_of(kind: type) -> Callable[[Any], bool]:
    return lambda v: (isinstance(v, (tuple, list)) and all(isinstance(x, kind) for x in v))


# OpSpec's fields, each with its check and what it must be (None allowed where it says so)
_FIELDS = {
    "name": (lambda v: isinstance(v, str), "a str"),
    "impl": (lambda v: v is None or callable(v), "a function (the op under test)"),
    "reference": (lambda v: v is None or callable(v), "None or a function"),
    "make_inputs": (callable, "a function (case, device) -> dict of arguments"),
    "cost": (callable, "a function (case, mode) -> Cost"),
    "suites": (_mapping_of(str, callable), "a dict of suite name -> function returning Cases"),
    "grad_inputs": (_sequence_of(str), "a tuple of argument names"),
    "dtypes": (lambda v: _sequence_of(torch.dtype)(v) and len(v) > 0,
               "a non-empty tuple of torch dtypes"),
    "tolerances": (_mapping_of(torch.dtype, Tolerance), "a dict of torch dtype -> Tolerance"),
    "skip": (callable, "a function (case, device) -> reason or None"),
    "notes": (lambda v: isinstance(v, str), "a str"),
    "family": (lambda v: isinstance(v, str), "a str"),
    "for_model": (lambda v: v is None or callable(v), "None or a function"),
    "kernels": (_mapping_of(str, KernelDesign), "a dict of kernel name -> KernelDesign"),
    "aligned": (lambda v: v is None or callable(v), "None or a function"),
    "count_rows": (lambda v: v is None or callable(v), "None or a function"),
    "case_of": (lambda v: v is None or callable(v), "None or a function"),
    "fuses": (lambda v: isinstance(v, str), "a str"),
    "recognise": (lambda v: v is None or callable(v), "None or a function"),
    "peers": (_mapping_of(str, str), "a dict of library -> function name"),
    "patches": (lambda v: v is None or isinstance(v, str), "None or a str"),
    "implementations": (_mapping_of(str, Implementation), "a dict of name -> Implementation"),
    "cuda": (lambda v: v is None or isinstance(v, CudaKernels), "None or a CudaKernels"),
}


def _check_fields(spec: OpSpec) -> None:
    """TypeError naming the first field of `spec` that has the wrong type, when it is built
    (not a traceback deep in a tool that reads it later)."""
    for name, (ok, want) in _FIELDS.items():
        value = getattr(spec, name)
        if not ok(value):
            label = spec.name if isinstance(spec.name, str) and spec.name else \
                getattr(spec.impl, "__name__", "?")
            raise TypeError(f"OpSpec {label!r}: {name} must be {want}, got {value!r}"[:400])
    spec.grad_inputs, spec.dtypes = tuple(spec.grad_inputs), tuple(spec.dtypes)


# ---------------------------------------------------------------------------------------
# Inputs: helpers every make_inputs uses, so layouts and seeds mean the same for all ops.
# ---------------------------------------------------------------------------------------

def generator(case: Case, salt: int = 0) -> torch.Generator:
    """A CPU generator seeded from the case seed and its id, so inputs are reproducible."""
    g = torch.Generator(device="cpu")
    g.manual_seed((case.seed * 1_000_003 + _stable_hash(case.id) + salt) % (2 ** 63))
    return g


def _stable_hash(text: str) -> int:
    h = 1469598103934665603
    for ch in text.encode():
        h = ((h ^ ch) * 1099511628211) % (2 ** 64)
    return h


def rand_tensor(shape: Sequence[int], case: Case, device: torch.device | str, *,
                dtype: torch.dtype | None = None, layout: str | None = None,
                scale: float = 1.0, shift: float = 0.0, salt: int = 0,
                dist: str = "normal") -> torch.Tensor:
    """Random tensor of `shape` laid out as the case asks.

    strided:    a view into a wider buffer, so the last dim's parent stride exceeds it
                (row stride = row length + padding; the padding holds NaN so a kernel that
                reads past the row end is caught).
    transposed: the last dim is not the innermost one in memory (a transpose of a
                contiguous buffer of the swapped shape).
    """
    dtype = dtype or case.dtype
    layout = layout or case.layout
    g = generator(case, salt)
    shape = tuple(int(s) for s in shape)

    def draw(sh):
        if dist == "normal":
            t = torch.randn(sh, generator=g, dtype=torch.float64)
        elif dist == "uniform":
            t = torch.rand(sh, generator=g, dtype=torch.float64)
        else:
            raise ValueError(f"dist must be 'normal' or 'uniform', got {dist!r}")
        return (t * scale + shift).to(dtype)

    if layout == "contiguous" or len(shape) == 0:
        return draw(shape).to(device)
    if layout == "strided":
        pad = 3 if shape[-1] > 1 else 1
        wide = draw(shape[:-1] + (shape[-1] + pad,))
        if dtype.is_floating_point:
            wide[..., shape[-1]:] = float("nan")
        return wide.to(device)[..., : shape[-1]]
    if layout == "transposed":
        if len(shape) < 2:
            raise ValueError("transposed layout needs at least 2 dims")
        swapped = shape[:-2] + (shape[-1], shape[-2])
        return draw(swapped).to(device).transpose(-1, -2)
    raise ValueError(f"unknown layout {layout!r}")


def inject_nonfinite(t: torch.Tensor, case: Case, count: int = 3) -> torch.Tensor:
    """Put NaN, +Inf and -Inf at a few seeded positions of `t` (in place; returns t). A
    meta tensor (a launch recorded at its shape, nothing run) has no values to set."""
    if t.numel() == 0 or t.device.type == "meta":
        return t
    g = generator(case, salt=7919)
    flat_index = torch.randint(0, t.numel(), (count,), generator=g)
    values = [float("nan"), float("inf"), float("-inf")]
    for i, idx in enumerate(flat_index.tolist()):
        pos = torch.unravel_index(torch.tensor(idx), t.shape)
        t[tuple(int(p) for p in pos)] = values[i % len(values)]
    return t


def as_outputs(out) -> tuple:
    """An impl's or a reference's result as a tuple of its outputs (one tensor: a 1-tuple)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def grad_leaves(inputs: Inputs, names: Sequence[str]) -> tuple[Inputs, list[str]]:
    """A copy of inputs whose floating tensors named in `names` are fresh leaves that
    require grad (same strides), and the names that were."""
    out, used = dict(inputs), []
    for n in names:
        v = inputs.get(n)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out[n] = v.detach().requires_grad_(True)
            used.append(n)
    return out, used
