"""nn.Module wrappers of speedlight ops, subclassing the torch module each replaces, so the
constructor, parameters and state-dict stay the same."""

from __future__ import annotations

import math

import torch

from speedlight.ops.cross_entropy import check_options, cross_entropy
from speedlight.ops.rms_norm import rms_norm
from speedlight.ops.rope import rope
from speedlight.ops.softmax import softmax


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by speedlight's kernel.

    Same constructor and state-dict as torch.nn.RMSNorm; eps=None means
    torch.finfo(x.dtype).eps, as in torch. A multi-dim normalized_shape normalizes over
    the flattened trailing dims.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        dims = len(self.normalized_shape)
        if tuple(x.shape[-dims:]) != tuple(self.normalized_shape):
            raise ValueError(f"x's trailing dims {tuple(x.shape[-dims:])} do not match "
                             f"normalized_shape {tuple(self.normalized_shape)}")
        if dims == 1:
            return rms_norm(x, self.weight, eps)
        lead = x.shape[:-dims]
        flat = x.reshape(*lead, math.prod(self.normalized_shape))
        weight = self.weight.reshape(-1) if self.weight is not None else None
        return rms_norm(flat, weight, eps).reshape(x.shape)


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax computed by speedlight's kernel (same constructor and state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim
        if dim is None:  # torch's legacy implicit-dim rule
            dim = 0 if x.dim() in (0, 1, 3) else 1
        return softmax(x, dim)


class ApplyRotary(torch.nn.Module):
    """Hugging Face's apply_rotary_pos_emb as a module, computed by speedlight.rope.

    No torch module computes RoPE, so this one subclasses torch.nn.Module; it holds no
    parameters or buffers (cos and sin come from the model's rotary embedding, as in HF).
    forward(q, k, cos, sin, position_ids=None, unsqueeze_dim=1) -> (q_rot, k_rot) takes
    the arguments of apply_rotary_pos_emb; interleaved=True selects GPT-J's pairs.
    """

    def __init__(self, interleaved: bool = False):
        super().__init__()
        self.interleaved = interleaved

    def forward(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                position_ids: torch.Tensor | None = None,
                unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        return rope(q, k, cos, sin, position_ids, unsqueeze_dim, self.interleaved)

    def extra_repr(self) -> str:
        return f"interleaved={self.interleaved}"


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss computed by speedlight's kernel.

    Same constructor as torch's (ignore_index, reduction, label_smoothing, the legacy
    size_average/reduce), plus keyword-only z_loss (adds z_loss * logsumexp^2 per
    non-ignored token), softcap (softcap * tanh(logits / softcap) before the loss) and
    inplace_backward (see speedlight.cross_entropy). Inputs follow torch: [N, C] or [C], or
    [N, C, d1, ...] with the classes at dim 1 (read in place, not copied); integer class
    targets only. Class weights are not supported. A mean over no non-ignored target is 0,
    not torch's NaN.
    """

    def __init__(self, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
                 reduction: str = "mean", label_smoothing: float = 0.0, *,
                 z_loss: float = 0.0, softcap: float | None = None,
                 inplace_backward: bool = False):
        if weight is not None:
            raise ValueError("speedlight.nn.CrossEntropyLoss does not support class weights; "
                             "use torch.nn.CrossEntropyLoss for a weighted loss")
        super().__init__(None, size_average, ignore_index, reduce, reduction, label_smoothing)
        check_options(ignore_index, self.reduction, label_smoothing, z_loss, softcap)
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if isinstance(input, torch.Tensor) and input.dim() > 2:
            input = input.movedim(1, -1)  # torch's [N, C, d1, ...]: classes at dim 1
        return cross_entropy(input, target, self.ignore_index, self.reduction,
                             self.label_smoothing, self.z_loss, self.softcap,
                             inplace_backward=self.inplace_backward)

    def extra_repr(self) -> str:
        extra = f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
        if self.label_smoothing:
            extra += f", label_smoothing={self.label_smoothing}"
        if self.z_loss:
            extra += f", z_loss={self.z_loss}"
        if self.softcap is not None:
            extra += f", softcap={self.softcap}"
        return extra
