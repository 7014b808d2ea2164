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
                  softcap: float | None = None, *, weight: torch.Tensor | None = None,
                  return_z_loss: bool = False, return_token_accuracy: bool = False,
                  return_predicted_tokens: bool = False):
    """torch.nn.functional.cross_entropy over the last dim of logits [..., vocab] (with its
    per-class weight and label smoothing), plus z_loss * logsumexp^2 per non-ignored token
    (times the target's class weight) and an optional softcap * tanh(x / softcap) on the
    logits first.

    As the Hugging Face losses compute it: half-precision logits are upcast to float32
    (`logits.float()`) before the loss, and the loss is returned in the logits' dtype.
    A mean divides by the number of non-ignored tokens, or with weights by the sum of their
    targets' weights, as torch does; a mean over nothing counted (a divisor of 0) is 0
    (torch gives NaN), as speedlight defines it. With any return_* flag: the tuple (loss,
    z_loss, token_accuracy, predicted_tokens) of speedlight.cross_entropy, None where not
    asked; z_loss is detached (a logged value).
    """
    x = logits.to(_opmath(logits))
    w = weight.to(x.dtype) if weight is not None else None
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    x = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1).long()
    losses = torch.nn.functional.cross_entropy(x, t, weight=w, ignore_index=ignore_index,
                                               reduction="none",
                                               label_smoothing=label_smoothing)
    valid = t != ignore_index
    w_t = (w[torch.where(valid, t, 0)] if w is not None else torch.ones_like(losses))
    w_t = torch.where(valid, w_t, 0.0)
    z_rows = torch.zeros_like(losses)
    if z_loss:
        lse = torch.logsumexp(x, dim=-1)
        z_rows = w_t * z_loss * lse * lse
        losses = losses + z_rows
    divisor = w_t.sum() if w is not None else valid.sum()

    def reduce(rows: torch.Tensor) -> torch.Tensor:
        if reduction == "none":
            return rows.reshape(target.shape).to(logits.dtype)
        total = rows.sum()
        if reduction == "mean":
            total = torch.where(divisor != 0, total / divisor, 0.0)
        return total.to(logits.dtype)

    loss = reduce(losses)
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return loss
    pred = logits.reshape(-1, logits.shape[-1]).argmax(-1)
    correct = (valid & (pred == t)).to(torch.float32)
    if reduction == "none":
        acc = correct.reshape(target.shape)
    else:
        n = valid.sum()
        acc = torch.where(n != 0, correct.sum() / n, 0.0)
    return (loss, reduce(z_rows.detach()) if return_z_loss else None,
            acc if return_token_accuracy else None,
            pred.reshape(target.shape) if return_predicted_tokens else None)


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


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None) -> torch.Tensor:
    """cross_entropy(F.linear(hidden, weight, bias), target, ...): the logits in hidden's
    dtype, as an lm_head computes them, then the loss as cross_entropy computes it."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return cross_entropy(logits, target, ignore_index, reduction, label_smoothing, z_loss,
                         softcap)
