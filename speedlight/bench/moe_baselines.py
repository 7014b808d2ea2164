"""What a mixture of experts' matmuls are timed against, beyond the eager reference (the
per-expert loop a PyTorch user writes: one matmul per group, with a host sync to read the
group offsets) and torch.compile of it.

  torch-grouped-mm  torch._grouped_mm (F.grouped_mm where torch has it): PyTorch's own
                    grouped GEMM, what transformers' "grouped_mm" experts implementation
                    runs; w passed as its [G, K, N] transposed view (no copy), the bias and
                    activation in eager after it. Checked against the reference before
                    timing (it leaves rows past the last group unwritten: cases with such
                    rows are unsupported). Runs where torch's kernel does (bf16; CUDA
                    sm_80+, and on CPU in recent torch).

It applies to grouped_matmul only (other ops get no row for it). torch.compile of the
per-expert loop compiles with dynamic shapes (COMPILE_OPTIONS): a static compile would
compile once per distinct group size, a max-autotune one tune each.
"""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.bench.liger import Unsupported
from speedlight.spec import Case, OpSpec

GROUPED_MM = "torch-grouped-mm"
NAMES = (GROUPED_MM,)
OPS = ("grouped_matmul",)

# torch.compile options of the per-expert loop (the op's reference), by op: dynamic shapes,
# torch's default mode
COMPILE_OPTIONS = {"grouped_matmul": {"dynamic": True, "mode": None}}


def applies(spec: OpSpec, case: Case) -> bool:
    """Whether these baselines say anything about the case: the grouped GEMM."""
    return spec.name in OPS


def _grouped_mm() -> Callable | None:
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    return fn if fn is not None else getattr(torch, "_grouped_mm", None)


def adapt(name: str, spec: OpSpec, case: Case, inputs: dict,
          device: torch.device) -> Callable:
    """A function of the OpSpec's inputs timed as baseline `name`, or Unsupported."""
    grouped_mm = _grouped_mm()
    if grouped_mm is None:
        raise Unsupported(f"torch {torch.__version__} has neither F.grouped_mm nor "
                          f"torch._grouped_mm")
    if case.flag("tail"):
        raise Unsupported("torch._grouped_mm leaves rows past the last group unwritten; "
                          "speedlight writes them as zeros")
    if inputs["x"].dtype != torch.bfloat16:
        raise Unsupported(f"torch._grouped_mm takes bfloat16 operands, not "
                          f"{inputs['x'].dtype}")

    def fn(x, w, group_offsets, bias=None, activation=None, out_dtype=None):
        y = grouped_mm(x, w.transpose(1, 2), offs=group_offsets)
        if bias is not None:  # each row's group's bias, found on the device (no sync)
            rows = torch.arange(x.shape[0], device=x.device, dtype=group_offsets.dtype)
            group = torch.searchsorted(group_offsets, rows, right=True)
            y = y + bias[group.clamp(max=w.shape[0] - 1)]
        if activation == "silu":
            y = torch.nn.functional.silu(y)
        elif activation in ("gelu_tanh", "gelu"):
            y = torch.nn.functional.gelu(y, approximate="tanh" if activation == "gelu_tanh"
                                         else "none")
        return y.to(out_dtype) if out_dtype is not None else y
    return fn
