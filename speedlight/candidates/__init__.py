"""Every implementation of an op, or of a kind speedlight.patch swaps, that this machine may
have: the one list `speedlight bench` times as baselines and `speedlight plan` chooses
among, so the two never disagree about what a peer is or how it runs.

Each candidate has one name everywhere (a bench row's `implementation`, a plan's choice)
and one way to call it on an op's inputs: `adapt(name, spec, case, inputs, device)`
returns (fn, mutates_inputs), fn taking the OpSpec's inputs as keyword arguments and
returning what its reference returns, or raises Unsupported with the reason it cannot
compute that case (not installed, no GPU, an option it has no form of: softcap, window,
interleaved pairs, class weights...). bench times fn on its cases; speedlight.patch calls
the same fn from a patched module's forward, with the inputs the module's call gives.

  speedlight        speedlight's kernel: each of the OpSpec's implementations, labelled
                    as bench labels them (speedlight, speedlight-cuda, ...)
  model             the model's own module or function, as it was built (plan only: bench
                    has no model; its yardstick is torch-eager)
  torch-eager       the OpSpec's reference in eager PyTorch, in the case's dtype (bench)
  torch-compile     torch.compile of what would otherwise run: the reference (bench), the
                    model's own module or function for the kind (plan)
  liger             Liger-Kernel's function for the op (candidates/liger.py)
  torch-fused       torch's own fused function: F.rms_norm, F.linear_cross_entropy
                    (candidates/torch_ops.py)
  sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn, flex-attention, flash-attn
                    attention (candidates/attention.py): SDPA with one backend forced,
                    FlexAttention, flash-attn 2/3 when installed
  torch-grouped-mm  torch._grouped_mm: grouped_matmul and moe_experts
                    (candidates/grouped_mm.py)
(bench's fp8 GEMM baselines, torch-scaled-mm and cublas-bf16, are no kind's candidates:
they stay in bench/gemm_baselines.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

from speedlight.candidates.names import (COMPILE, EAGER, FLASH_ATTN, FLEX, GROUPED_MM, LIGER,
                                         MODEL, SDPA, SPEEDLIGHT, TORCH_FUSED, Unsupported)
from speedlight.plans import KINDS

__all__ = ["BY_NAME", "CANDIDATES", "COMPILE", "EAGER", "FLASH_ATTN", "FLEX", "GROUPED_MM",
           "LIGER", "MODEL", "SDPA", "SPEEDLIGHT", "TORCH_FUSED", "Candidate", "Unsupported",
           "adapt", "for_kind"]


@dataclass(frozen=True)
class Candidate:
    """One implementation: its name, what it is, the kinds of patch it can serve (empty:
    bench only), and whether bench times it unless baselines are named."""

    name: str
    summary: str
    kinds: tuple[str, ...] = ()
    bench_default: bool = True


_LAYERS = ("rms_norm", "mlp", "rope", "cross_entropy")
CANDIDATES = (
    # every kind of patch (plans.KINDS: the built-in OpSpecs' `patches`)
    Candidate(SPEEDLIGHT, "speedlight's kernel", KINDS, False),
    Candidate(MODEL, "the model's own module or function", KINDS, False),
    Candidate(EAGER, "the op's reference in eager PyTorch"),
    Candidate(COMPILE, "torch.compile of what would otherwise run", _LAYERS),
    Candidate(LIGER, "Liger-Kernel's function", (*_LAYERS, "linear_cross_entropy")),
    Candidate(TORCH_FUSED, "torch's own fused function", ("rms_norm", "linear_cross_entropy")),
    Candidate("sdpa-math", "SDPA, math backend forced", ("attention",), False),
    Candidate("sdpa-flash", "SDPA, FlashAttention-2 backend forced", ("attention",)),
    Candidate("sdpa-efficient", "SDPA, memory-efficient backend forced", ("attention",)),
    Candidate("sdpa-cudnn", "SDPA, cuDNN backend forced", ("attention",)),
    Candidate(FLEX, "FlexAttention (compiled)", ("attention",)),
    Candidate(FLASH_ATTN, "flash-attn (FlashAttention-3, else -2)", ("attention",)),
    Candidate(GROUPED_MM, "torch._grouped_mm, PyTorch's grouped GEMM", ("mlp",)),
)
BY_NAME = {c.name: c for c in CANDIDATES}


def for_kind(kind: str) -> tuple[str, ...]:
    """The candidates' names that may serve a kind of patch, in CANDIDATES' order."""
    return tuple(c.name for c in CANDIDATES if kind in c.kinds)


def adapt(name: str, spec, case, inputs: dict, device) -> tuple:
    """(fn, mutates_inputs): candidate `name` for one case of `spec` (fn takes the OpSpec's
    inputs as keyword arguments), or Unsupported with the reason. speedlight's
    implementations are named as bench labels them (spec.label); torch-eager is the
    reference; torch-compile and model are built by their callers (bench compiles the
    reference, patch the model's own)."""
    import torch

    device = torch.device(device)
    for impl, implementation in spec.implementations.items():
        if spec.label(impl) == name:
            reason = implementation.unavailable(device)
            if reason:
                raise Unsupported(reason)
            return implementation.fn, False
    if name == EAGER:
        return spec.reference, False
    if name == LIGER:
        from speedlight.candidates import liger
        return liger.adapt(spec, inputs, case)
    if name == TORCH_FUSED:
        from speedlight.candidates import torch_ops
        return torch_ops.adapt(spec, inputs), False
    if name in SDPA or name in (FLEX, FLASH_ATTN):
        from speedlight.candidates import attention
        if spec.name != "attention":
            raise Unsupported(f"{name} is an attention implementation; {spec.name} is not "
                              "attention")
        return attention.adapt(name, inputs, case, device), False
    if name == GROUPED_MM:
        from speedlight.candidates import grouped_mm
        if not grouped_mm.applies(spec, case):
            raise Unsupported(f"{name} is a grouped GEMM; {spec.name} is none")
        return grouped_mm.adapt(name, spec, case, inputs, device), False
    if name in (COMPILE, MODEL):
        raise Unsupported(f"{name} is built by its caller (bench compiles the reference, "
                          "patch the model's own)")
    raise ValueError(f"unknown candidate {name!r}; known: {', '.join(BY_NAME)}")
