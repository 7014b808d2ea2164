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


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None) -> torch.Tensor:
    """torch.nn.functional.cross_entropy over the last dim of logits [..., vocab], plus
    z_loss * logsumexp^2 per non-ignored token and an optional softcap * tanh(x / softcap)
    on the logits first.

    As the Hugging Face losses compute it: half-precision logits are upcast to float32
    (`logits.float()`) before the loss, and the loss is returned in the logits' dtype.
    A mean over no non-ignored token is 0 (torch gives NaN), as speedlight defines it.
    """
    x = logits.to(_opmath(logits))
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    x = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1).long()
    losses = torch.nn.functional.cross_entropy(x, t, ignore_index=ignore_index,
                                               reduction="none",
                                               label_smoothing=label_smoothing)
    valid = t != ignore_index
    if z_loss:
        lse = torch.logsumexp(x, dim=-1)
        losses = losses + torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse))
    if reduction == "none":
        return losses.reshape(target.shape).to(logits.dtype)
    total = losses.sum()
    if reduction == "mean":
        total = total / valid.sum().clamp_min(1)
    return total.to(logits.dtype)
