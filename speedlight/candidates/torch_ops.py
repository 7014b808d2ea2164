"""torch's own fused functions as candidates ("torch-fused"): F.rms_norm for rms_norm,
F.linear_cross_entropy (torch >= 2.13, its chunked path) for linear_cross_entropy.

Each adapter takes the op's inputs and returns a function of the same keyword arguments
returning what the op's reference returns, or raises Unsupported naming what this torch
lacks or what the function has no form of.
"""

from __future__ import annotations

from typing import Callable

import torch

from speedlight.candidates.names import Unsupported


def _rms_norm(inputs: dict) -> Callable:
    """F.rms_norm over the last dim; with an offset (Gemma's 1 + w) the statistics and the
    scale in float32 and one rounding to x's dtype, as the reference computes them."""
    import torch.nn.functional as F

    if not hasattr(F, "rms_norm"):
        raise Unsupported(f"torch {torch.__version__} has no F.rms_norm")

    def fn(x, weight=None, eps=1e-6, offset=0.0, **_):
        if offset:
            w = None if weight is None else weight.float() + offset
            return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return fn


def _linear_cross_entropy(inputs: dict) -> Callable:
    """F.linear_cross_entropy (chunked) over linear_cross_entropy's inputs."""
    import torch.nn.functional as F

    if not hasattr(F, "linear_cross_entropy") or not hasattr(torch.nn, "LinearCrossEntropyOptions"):
        raise Unsupported(f"torch {torch.__version__} has no F.linear_cross_entropy")
    missing = [k for k in ("z_loss", "softcap", "return_z_loss", "return_token_accuracy",
                           "return_predicted_tokens") if inputs.get(k)]
    if missing:
        raise Unsupported(f"F.linear_cross_entropy has no {' or '.join(missing)}")
    if inputs.get("label_smoothing"):
        raise Unsupported("F.linear_cross_entropy's chunked path has no label smoothing (it "
                          "falls back to the full logits)")
    options = torch.nn.LinearCrossEntropyOptions()

    def fn(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
           label_smoothing=0.0, class_weight=None, **_):
        loss = F.linear_cross_entropy(hidden, weight, target, linear_bias=bias,
                                      weight=class_weight, reduction=reduction,
                                      ignore_index=ignore_index,
                                      label_smoothing=label_smoothing, options=options)
        counted = (target != ignore_index).sum()
        if reduction == "mean":  # speedlight (and the reference) define a mean over nothing as 0
            loss = torch.where(counted > 0, loss, torch.zeros_like(loss))
        return loss
    return fn


# op -> adapter(inputs) -> fn(**inputs), or Unsupported
ADAPTERS: dict[str, Callable[[dict], Callable]] = {
    "rms_norm": _rms_norm,
    "linear_cross_entropy": _linear_cross_entropy,
}


def adapt(spec, inputs: dict) -> Callable:
    """torch's fused function for spec's op (its peers["torch"], else the op's own name),
    or Unsupported."""
    name = spec.peers.get("torch", spec.name)
    if name not in ADAPTERS:
        raise Unsupported(f"torch has no fused function of {spec.name}")
    return ADAPTERS[name](inputs)
