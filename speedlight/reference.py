"""Plain-PyTorch references of every speedlight op.

Each function is dtype-generic: run on float64 inputs it is the ground truth verify
compares against; run on the case's own dtype it is what a PyTorch user would otherwise
get, and its error sets how much error a speedlight kernel may have. Written the way
PyTorch and the Hugging Face models compute these ops: where they upcast half-precision
inputs to float32 internally, so does the reference.
"""

from __future__ import annotations

import torch


def _opmath(x: torch.Tensor) -> torch.dtype:
    """The dtype PyTorch computes reductions of x in: float32 for half types, else x's."""
    return torch.promote_types(x.dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             offset: float = 0.0) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * (offset + w) over the last dim.

    As torch.nn.functional.rms_norm and the Hugging Face norms compute it: statistics in
    float32 for half inputs, one rounding to x's dtype at the end.
    """
    h = x.to(_opmath(x))
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(h.dtype) + offset)
    return y.to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along dim."""
    return torch.softmax(x, dim=dim)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6, offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual, as a Hugging Face decoder layer computes it:
    the residual add in the model's dtype, then the norm of that (rounded) h."""
    h = x + residual
    return rms_norm(h, weight, eps, offset), h


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * w + b over the trailing dims (biased variance).

    torch.nn.functional.layer_norm computes half inputs in float32 and rounds once; so does
    this, on any device.
    """
    h = x.to(_opmath(x))
    w = weight.to(h.dtype) if weight is not None else None
    b = bias.to(h.dtype) if bias is not None else None
    return torch.nn.functional.layer_norm(h, tuple(normalized_shape), w, b, eps).to(x.dtype)


def _glu_halves(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up, split from one [..., 2 * I] tensor (gate first, as chunk(2, -1)) when
    up is None."""
    return gate.chunk(2, dim=-1) if up is None else (gate, up)


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up, as LlamaMLP computes act_fn(gate_proj(x)) * up_proj(x): the
    activation rounded to the dtype, then the product."""
    gate, up = _glu_halves(gate, up)
    return torch.nn.functional.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor | None = None,
          approximate: str = "tanh") -> torch.Tensor:
    """gelu(gate) * up (approximate="tanh" is GemmaMLP's gelu_pytorch_tanh, "none" the exact
    erf form), the activation rounded to the dtype, then the product."""
    gate, up = _glu_halves(gate, up)
    return torch.nn.functional.gelu(gate, approximate=approximate) * up
