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
             offset: float = 0.0, in_place: bool = False) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * (offset + w) over the last dim.

    As torch.nn.functional.rms_norm and the Hugging Face norms compute it: statistics in
    float32 for half inputs, one rounding to x's dtype at the end. in_place (where
    speedlight's backward writes dx) changes no value: the reference ignores it.
    """
    h = x.to(_opmath(x))
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(h.dtype) + offset)
    return y.to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along dim."""
    return torch.softmax(x, dim=dim)


def _rotate_pairs(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The partner of each element, negated for the pair's first member: Hugging Face's
    rotate_half (pairs (i, i + d/2)) or GPT-J's rotate_every_two (pairs (2i, 2i + 1))."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         position_ids: torch.Tensor | None = None, unsqueeze_dim: int = 1,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k: x * cos + rotate(x) * sin on the first rot_dim
    = cos.shape[-1] dims of each head, the rest passed through.

    As Hugging Face's apply_rotary_pos_emb computes it, in the inputs' dtype (HF builds cos
    and sin in q's dtype and does not upcast): cos/sin [batch, seq, rot_dim] broadcast over
    heads at unsqueeze_dim, or with position_ids a cache [max_pos, rot_dim] indexed by them.
    interleaved=True pairs dims (2i, 2i + 1) as GPT-J does, with cos/sin repeat-interleaved.
    Results have q's (k's) dtype.
    """
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rot_dim = cos.shape[-1]

    def apply(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
        y = x_rot * cos + _rotate_pairs(x_rot, interleaved) * sin
        return torch.cat((y.to(x.dtype), x_pass), dim=-1)

    return apply(q), apply(k)


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


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6, offset: float = 0.0,
                 in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual, as a Hugging Face decoder layer computes it:
    the residual add in the model's dtype, then the norm of that (rounded) h. in_place is
    ignored, as in rms_norm."""
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


def _glu(act, gate: torch.Tensor, up: torch.Tensor | None, gate_multiplier: float,
         down_multiplier: float) -> torch.Tensor:
    """up * act(gate * gate_multiplier), times down_multiplier: Falcon-H1's MLP computes
    `up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)`, then `down_proj(y) *
    down_multiplier`, which (no bias) is down_proj(y * down_multiplier). Each step rounds
    to the dtype; a multiplier of 1 is skipped, as the models without one compute."""
    gate, up = _glu_halves(gate, up)
    if gate_multiplier != 1.0:
        gate = gate * gate_multiplier
    y = act(gate) * up
    return y * down_multiplier if down_multiplier != 1.0 else y


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None, gate_multiplier: float = 1.0,
           down_multiplier: float = 1.0) -> torch.Tensor:
    """silu(gate) * up, as LlamaMLP computes act_fn(gate_proj(x)) * up_proj(x): the
    activation rounded to the dtype, then the product; with Falcon-H1's multipliers as
    `_glu` says."""
    return _glu(torch.nn.functional.silu, gate, up, gate_multiplier, down_multiplier)


def geglu(gate: torch.Tensor, up: torch.Tensor | None = None,
          approximate: str = "tanh", gate_multiplier: float = 1.0,
          down_multiplier: float = 1.0) -> torch.Tensor:
    """gelu(gate) * up (approximate="tanh" is GemmaMLP's gelu_pytorch_tanh, "none" the exact
    erf form), the activation rounded to the dtype, then the product; multipliers as swiglu's."""
    return _glu(lambda g: torch.nn.functional.gelu(g, approximate=approximate), gate, up,
                gate_multiplier, down_multiplier)
