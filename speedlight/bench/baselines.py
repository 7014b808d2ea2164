"""What speedlight is timed against: the candidates of speedlight/candidates (the one list
`speedlight plan` chooses among, same names, same adapters), bar speedlight's own and the
model's, and the fp8 GEMM's own.

  torch-eager    the OpSpec's reference, run in the case's dtype: what a PyTorch user runs
  torch-compile  torch.compile of that reference (inductor by default; static shapes by
                 default, the best code torch.compile makes for one shape; compile time is
                 not timed, the first call happens in the warm-up). Compute-bound ops (the
                 GEMMs) on a GPU compile with mode="max-autotune" unless a mode is given:
                 the eager chain (cuBLAS matmul + epilogue) at the best Inductor can do,
                 its own Triton GEMM templates with the epilogue fused included
  liger          Liger-Kernel's function for the op, when Liger is installed (found at run
                 time) and has one (candidates/liger.py); on a GPU only
  torch-fused    torch's own fused function for the op (candidates/torch_ops.py), where
                 this torch has it: F.rms_norm, F.linear_cross_entropy with its chunked
                 options
  sdpa-flash, sdpa-efficient, sdpa-cudnn, flex-attention, flash-attn
                 attention only (candidates/attention.py): SDPA's backends, FlexAttention
                 and flash-attn when installed; on a GPU only. Other ops get no row for
                 them. sdpa-math (SDPA's math backend) only when named: a plan candidate,
                 too slow and large to time by default.
  torch-scaled-mm, cublas-bf16
                 fp8 matmul only (bench/gemm_baselines.py): torch._scaled_mm, and the same
                 GEMM in bf16 on cuBLAS; on a GPU only. Other ops and dtypes get no row.
  torch-grouped-mm
                 grouped_matmul and moe_experts only (candidates/grouped_mm.py):
                 torch._grouped_mm, PyTorch's grouped GEMM (alone, or in moe_experts' chain;
                 the reference is the per-expert loop; its torch.compile compiles with
                 dynamic shapes, grouped_mm.COMPILE_OPTIONS).

A baseline that cannot run a case (not installed, no counterpart, unsupported dtype or
layout, an error, or an output that differs from the reference) is kept as a row with
status "unavailable" and the reason, never dropped.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from speedlight import candidates
from speedlight.bench import gemm_baselines
from speedlight.candidates import COMPILE, EAGER, LIGER, SPEEDLIGHT, TORCH_FUSED, Unsupported
from speedlight.candidates import attention as attention_candidates
from speedlight.candidates import grouped_mm
from speedlight.spec import Case, OpSpec

# the candidates bench times unless baselines are named (speedlight's and the model's own are
# no baselines), then the fp8 GEMM's own; KNOWN adds those timed only when named (sdpa-math)
BASELINES = (*(c.name for c in candidates.CANDIDATES if c.bench_default), *gemm_baselines.NAMES)
KNOWN = (*BASELINES, *(c.name for c in candidates.CANDIDATES if not c.bench_default
                       and c.name not in (SPEEDLIGHT, candidates.MODEL)))
__all__ = ["BASELINES", "COMPILE", "EAGER", "KNOWN", "LIGER", "SPEEDLIGHT", "TORCH_FUSED",
           "Baselines", "CompileOptions", "Contender", "compile_limits", "is_speedlight"]


def is_speedlight(name: str) -> bool:
    """Whether a row's implementation is one of speedlight's ("speedlight" for an op's first
    implementation, "speedlight-cuda"... for the others), not a baseline."""
    return name == SPEEDLIGHT or name.startswith(SPEEDLIGHT + "-")


@dataclass
class Contender:
    """One implementation a bench case times: speedlight's (one per OpSpec implementation)
    or a baseline's, with the reason when it cannot run (spec.Implementation is an op's own
    implementation, which bench times as a Contender)."""
    name: str
    fn: Callable | None  # takes the OpSpec's inputs as keyword arguments
    reason: str = ""  # why it is unavailable, when fn is None
    mutates_inputs: bool = False  # writes into its inputs: restore them before every sample
    checked: bool = False  # its forward output must match the reference before timing
    impl: str = ""  # speedlight's: which of the OpSpec's implementations ("triton", "cuda")

    @property
    def available(self) -> bool:
        return self.fn is not None


@dataclass(frozen=True)
class CompileOptions:
    backend: str = "inductor"
    dynamic: bool | None = False  # False: static shapes; None: torch's automatic dynamic
    mode: str | None = None

    def describe(self) -> str:
        dyn = {False: "static", None: "auto", True: "dynamic"}[self.dynamic]
        return f"backend={self.backend}, shapes={dyn}" + (f", mode={self.mode}" if self.mode else "")


class Baselines:
    """Builds the implementations of each case: speedlight's and the chosen baselines."""

    def __init__(self, names: tuple[str, ...] = BASELINES, compile_options: CompileOptions = CompileOptions()):
        unknown = [n for n in names if n not in KNOWN]
        if unknown:
            raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; known: {', '.join(KNOWN)}")
        self.names = tuple(names)
        self.compile_options = compile_options
        self._compiled: dict[str, Callable] = {}

    def for_case(self, spec: OpSpec, case: Case, inputs: dict,
                 device: torch.device | str = "cuda", named: tuple[str, ...] = ()
                 ) -> list[Contender]:
        impls = self.speedlight(spec, torch.device(device), named)
        for name in self.names:
            if name in attention_candidates.NAMES and spec.name != "attention":
                continue  # an attention library has nothing to say about other ops
            if name in gemm_baselines.NAMES and not gemm_baselines.applies(spec, case):
                continue  # fp8 GEMM baselines: fp8 matmul cases only
            if name in grouped_mm.NAMES and not grouped_mm.applies(spec, case):
                continue  # grouped GEMM baselines: grouped_matmul and moe_experts only
            impls.append(self._build(name, spec, case, inputs, torch.device(device)))
        return impls

    @staticmethod
    def speedlight(spec: OpSpec, device: torch.device, named: tuple[str, ...] = ()
                   ) -> list[Contender]:
        """Each of the OpSpec's implementations a sweep runs (OpSpec.swept: one run only by
        name when `named` lists it), labelled as its rows are (OpSpec.label); one that
        cannot run on `device` is kept, unavailable, with the reason."""
        out = []
        for name, implementation in spec.swept(named).items():
            reason = implementation.unavailable(device) or ""
            out.append(Contender(spec.label(name), None if reason else implementation.fn,
                                 reason, impl=name))
        return out

    def _build(self, name: str, spec: OpSpec, case: Case, inputs: dict,
               device: torch.device) -> Contender:
        """Baseline `name` for one case: the candidates' own adapter (candidates.adapt, the
        one patch calls too), torch.compile of the reference, or an fp8 GEMM baseline."""
        if name == COMPILE:
            if spec.name not in self._compiled:
                o = self.compile_options
                own = grouped_mm.COMPILE_OPTIONS.get(spec.name, {})
                self._compiled[spec.name] = torch.compile(
                    spec.reference, backend=o.backend, dynamic=own.get("dynamic", o.dynamic),
                    mode=own["mode"] if "mode" in own else self.compile_mode(spec, device))
            return Contender(COMPILE, self._compiled[spec.name], checked=True)
        if name in gemm_baselines.NAMES:
            try:
                fn = gemm_baselines.adapt(name, spec, inputs, device)
            except Unsupported as e:
                return Contender(name, None, str(e))
            return Contender(name, fn, checked=name == gemm_baselines.SCALED_MM)
        if name == LIGER and device.type != "cuda":
            return Contender(LIGER, None, "Liger-Kernel runs on CUDA GPUs; it is not run "
                                          "on the CPU interpreter")
        try:
            fn, mutates = candidates.adapt(name, spec, case, inputs, device)
        except Unsupported as e:
            return Contender(name, None, str(e))
        return Contender(name, fn, mutates_inputs=mutates, checked=name != EAGER)

    def compile_mode(self, spec: OpSpec, device: torch.device) -> str | None:
        """The torch.compile mode of an op's baseline: the one asked for, else max-autotune
        for compute-bound ops on a GPU (autotuning a GEMM is what a user comparing against
        torch.compile would do), else torch's default."""
        if self.compile_options.mode is not None:
            return self.compile_options.mode
        if spec.family == "compute-bound" and torch.device(device).type == "cuda":
            return "max-autotune"
        return None


@contextlib.contextmanager
def compile_limits(recompiles: int = 4096):
    """Let torch.compile recompile for every shape a suite has, and fail loudly rather than
    fall back to eager in silence when it cannot."""
    import torch._dynamo.config as cfg

    saved = {}
    for key, value in (("recompile_limit", recompiles), ("accumulated_recompile_limit", recompiles),
                       ("fail_on_recompile_limit_hit", True)):
        try:
            saved[key] = getattr(cfg, key)
            setattr(cfg, key, value)
        except (AttributeError, KeyError):
            pass
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(cfg, key, value)
