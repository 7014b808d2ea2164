"""torch._grouped_mm as a candidate: what a mixture of experts' matmuls are timed against,
beyond the eager reference (the per-expert loop a PyTorch user writes: one matmul per
group, with a host sync to read the group offsets) and torch.compile of it.

  torch-grouped-mm  torch._grouped_mm (F.grouped_mm where torch has it): PyTorch's own
                    grouped GEMM, what transformers' "grouped_mm" experts implementation
                    runs; w passed as its [G, K, N] transposed view (no copy), the bias and
                    activation in eager after it. Checked against the reference before
                    timing (it leaves rows past the last group unwritten: cases with such
                    rows are unsupported). Runs where torch's kernel does (bf16; CUDA
                    sm_80+, and on CPU in recent torch).

                    For moe_experts, the same chain as speedlight's on it: the pairs
                    sorted by expert on the device, gathered, torch._grouped_mm for gate_up,
                    the gate unit in eager, torch._grouped_mm for down, the routing weights
                    and an index_add_ into the tokens (what transformers' "grouped_mm"
                    experts implementation runs).

It applies to grouped_matmul and moe_experts only (other ops get no row for it).
torch.compile of the per-expert loop compiles with dynamic shapes (COMPILE_OPTIONS): a
static compile would compile once per distinct group size, a max-autotune one tune each.
"""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.candidates.names import GROUPED_MM, Unsupported
from speedlight.spec import Case, OpSpec

NAMES = (GROUPED_MM,)
OPS = ("grouped_matmul", "moe_experts")

# torch.compile options of the per-expert loop (the op's reference), by op: dynamic shapes,
# torch's default mode
COMPILE_OPTIONS = {"grouped_matmul": {"dynamic": True, "mode": None},
                   "moe_experts": {"dynamic": True, "mode": None}}


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
    if spec.name == "moe_experts":
        return _moe_chain(grouped_mm, inputs)
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


def _moe_chain(grouped_mm: Callable, inputs: dict) -> Callable:
    """moe_experts' chain on torch._grouped_mm (bf16 operands only)."""
    if inputs["hidden"].dtype != torch.bfloat16:
        raise Unsupported(f"torch._grouped_mm takes bfloat16 operands, not "
                          f"{inputs['hidden'].dtype}")
    from speedlight.ops.moe_experts_launch import expert_order
    from speedlight.reference import moe_gate_unit

    def fn(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, activation="silu",
           gate_up_bias=None, down_bias=None, interleaved=False, gate_multiplier=1.0,
           down_multiplier=1.0, swiglu_alpha=1.702, swiglu_limit=7.0):
        n_experts, k = gate_up_proj.shape[0], top_k_index.shape[1]
        with torch.no_grad():
            order, offsets = expert_order(top_k_index, n_experts)
            token = order // k
            rows = torch.arange(order.numel(), device=order.device, dtype=offsets.dtype)
            expert = torch.searchsorted(offsets, rows, right=True)  # E past the last end
            routed = (expert < n_experts)[:, None]
            expert = expert.clamp(max=max(n_experts - 1, 0))
        z = grouped_mm(hidden[token], gate_up_proj.transpose(1, 2), offs=offsets)
        if gate_up_bias is not None:
            z = z + gate_up_bias[expert]
        h = moe_gate_unit(z, activation, interleaved, gate_multiplier, down_multiplier,
                           swiglu_alpha, swiglu_limit)
        y = grouped_mm(h, down_proj.transpose(1, 2), offs=offsets)
        if down_bias is not None:
            y = y + down_bias[expert]
        # rows past the last end are left unwritten by torch._grouped_mm: masked here
        y = torch.where(routed, y * top_k_weights.reshape(-1)[order, None], 0.0)
        return torch.zeros_like(hidden).index_add_(0, token, y.to(hidden.dtype))
    return fn
