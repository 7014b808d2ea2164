"""What an fp8 GEMM is timed against, beyond the eager reference (torch._scaled_mm and the
epilogue in eager) and torch.compile of it.

  torch-scaled-mm  torch._scaled_mm alone: cuBLASLt's fp8 GEMM with the same scales (per
                   tensor or per row) and the bias fused where the case has one; the
                   activation and residual, when the case has them, in eager after it.
                   Checked against the reference before timing.
  cublas-bf16      the same GEMM and epilogue in bf16 (torch.matmul: cuBLAS), on bf16
                   copies of the dequantized operands made once before timing: what the
                   layer costs without fp8. Not checked (bf16 operands are not the fp8
                   ones: its output differs by their rounding).

Both apply to fp8 cases of matmul only (other ops and dtypes get no row for them) and run on
CUDA GPUs only (on a CPU: unavailable, with the reason).
"""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.candidates import Unsupported
from speedlight.spec import Case, OpSpec

SCALED_MM = "torch-scaled-mm"
CUBLAS_BF16 = "cublas-bf16"
NAMES = (SCALED_MM, CUBLAS_BF16)
FP8 = (torch.float8_e4m3fn,)


def applies(spec: OpSpec, case: Case) -> bool:
    """Whether these baselines say anything about the case: matmul in fp8."""
    return spec.name == "matmul" and case.dtype in FP8


def adapt(name: str, spec: OpSpec, inputs: dict, device: torch.device) -> Callable:
    """A function of the OpSpec's inputs timed as baseline `name`, or Unsupported."""
    if device.type != "cuda":
        raise Unsupported(f"{name} times cuBLAS{'Lt fp8' if name == SCALED_MM else ' bf16'}: "
                          f"GPU only (on a CPU there is no cuBLAS speed to compare with)")
    if name == SCALED_MM:
        if not hasattr(torch, "_scaled_mm"):
            raise Unsupported(f"torch {torch.__version__} has no _scaled_mm")
        return _scaled_mm(spec)
    return _bf16(spec)


def _epilogue(y, activation, residual):
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    elif activation in ("gelu_tanh", "gelu"):
        y = torch.nn.functional.gelu(y, approximate="tanh" if activation == "gelu_tanh"
                                     else "none")
    if residual is not None:
        y = y + residual.to(y.dtype)
    return y


def _scaled_mm(spec: OpSpec) -> Callable:
    def fn(a, b, scale_a, scale_b, bias=None, activation=None, residual=None, scale=None,
           out_dtype=None, return_amax=False):
        if scale is not None:  # folded into b's scale: the same product, one multiply
            scale_b = scale_b * scale
        out = out_dtype or torch.bfloat16
        sa = scale_a.reshape(()) if scale_a.numel() == 1 else scale_a
        sb = scale_b.reshape(()) if scale_b.numel() == 1 else scale_b
        y = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out,
                             bias=bias.to(out) if bias is not None else None)
        y = _epilogue(y, activation, residual)
        return (y, y.abs().amax().float()) if return_amax else y
    return fn


def _bf16(spec: OpSpec) -> Callable:
    """spec.reference on bf16 copies of the dequantized operands (made on the first call
    with each operand, the warm-up; they take gradients when the operand does)."""
    cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def fn(a, b, scale_a, scale_b, **rest):
        key = (a.data_ptr(), b.data_ptr())
        if key not in cache:
            with torch.no_grad():
                a16 = (a.float() * scale_a).to(torch.bfloat16)
                b16 = (b.float() * scale_b).to(torch.bfloat16)  # b's layout kept (W^T)
            cache[key] = (a16.requires_grad_(a.requires_grad),
                          b16.requires_grad_(b.requires_grad))
        a16, b16 = cache[key]
        return spec.reference(a16, b16, **rest)
    return fn
