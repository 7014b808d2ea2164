"""Liger-Kernel as a candidate (a bench baseline, a plan's choice): speedlight op names
mapped to Liger's functional API.

Each adapter takes an op's inputs (the keyword arguments its OpSpec's make_inputs gives)
and returns a function of those same keyword arguments that calls Liger and returns what
the op's reference returns, in the same order, so the bench times, differentiates and
checks it exactly like speedlight's own implementation. An adapter raises Unsupported,
with the reason, for a case Liger cannot compute (no weight, interleaved rotary pairs,
softmax over another dim...); bench records that case's Liger row as unavailable.

Liger is found at run time (`pip install liger-kernel`); an op names the Liger function
it is compared with in its OpSpec (`peers["liger"]`), and the adapter of that function
maps the op's inputs onto it. Whatever the mapping, bench checks Liger's forward output
against the reference before timing it, so a mapping that computes something else is
reported as such, not timed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from speedlight.candidates.names import Unsupported
from speedlight.spec import Case, OpSpec


def _need(op: str, inputs: dict, *names: str) -> None:
    missing = [n for n in names if n not in inputs]
    if missing:
        raise Unsupported(f"the Liger mapping of {op} takes inputs ({', '.join(names)}); "
                          f"{op}'s make_inputs gives ({', '.join(inputs)})")


def _rms_norm(F, inputs: dict, case: Case):
    _need("rms_norm", inputs, "x", "weight")
    if inputs["weight"] is None:
        raise Unsupported("Liger's RMSNorm always scales by a weight; this case has none")
    offset = float(inputs.get("offset", 0.0) or 0.0)
    # Gemma (offset 1) computes everything in fp32, Llama only the inverse RMS: Liger's
    # casting modes of the same names. Liger's in_place (dY becomes dX) follows the case's
    # in_place, so both write dx where the other does; bench gives every backward sample a
    # fresh upstream gradient.
    mode = "gemma" if offset else "llama"
    return lambda x, weight, eps=1e-6, offset=0.0, in_place=False, **_: F.liger_rms_norm(
        x, weight, eps, offset=offset, casting_mode=mode, in_place=in_place), False


def _add_rms_norm(F, inputs: dict, case: Case):
    _need("add_rms_norm", inputs, "x", "residual", "weight")
    if inputs["weight"] is None:
        raise Unsupported("Liger's fused add + RMSNorm always scales by a weight; this case has none")
    offset = float(inputs.get("offset", 0.0) or 0.0)
    mode = "gemma" if offset else "llama"
    return (lambda x, residual, weight, eps=1e-6, offset=0.0, in_place=False, **_:
            F.liger_fused_add_rms_norm(x, residual, weight, eps, offset=offset,
                                       casting_mode=mode, in_place=in_place)), False


def _layer_norm(F, inputs: dict, case: Case):
    _need("layer_norm", inputs, "x", "weight", "bias")
    if inputs["weight"] is None or inputs["bias"] is None:
        raise Unsupported("Liger's LayerNorm needs both a weight and a bias; this case lacks one")
    return lambda x, weight, bias, eps=1e-5, **_: F.liger_layer_norm(x, weight, bias, eps), False


def _gated(name: str, liger_fn: str):
    def adapter(F, inputs: dict, case: Case):
        _need(name, inputs, "gate", "up")
        if any(inputs.get(k, 1.0) != 1.0 for k in ("gate_multiplier", "down_multiplier")):
            raise Unsupported(f"Liger's {liger_fn} has no gate or down multiplier "
                              f"(Falcon-H1's mlp_multipliers)")
        fn = getattr(F, liger_fn)
        return lambda gate, up, **_: fn(gate, up), False
    return adapter


def _rope(F, inputs: dict, case: Case):
    _need("rope", inputs, "q", "k", "cos", "sin")
    if inputs.get("interleaved") or case.flag("interleaved"):
        raise Unsupported("Liger's RoPE rotates halves (Llama/NeoX); it has no interleaved "
                          "(GPT-J) form")
    if inputs.get("position_ids") is not None:
        raise Unsupported("Liger's RoPE takes cos/sin per token; it cannot index a cos/sin "
                          "cache by position_ids")
    q = inputs["q"]
    if q.dim() != 4:
        raise Unsupported(f"Liger's RoPE takes 4-d q; got q of shape {tuple(q.shape)}")
    if inputs.get("unsqueeze_dim", 1) == 1:  # [batch, heads, seq, head_dim]: Liger's layout
        return lambda q, k, cos, sin, **_: F.liger_rope(q, k, cos, sin), False

    def fn(q, k, cos, sin, **_):  # [batch, seq, heads, head_dim]: Liger's view is a transpose
        qo, ko = F.liger_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return qo.transpose(1, 2), ko.transpose(1, 2)
    return fn, False


def _cross_entropy(F, inputs: dict, case: Case):
    import inspect

    _need("cross_entropy", inputs, "logits", "target")
    params = inspect.signature(F.liger_cross_entropy).parameters
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def takes(name: str) -> bool:
        return name in params or any_keyword

    if inputs.get("weight") is not None:
        if not takes("weight"):
            raise Unsupported("this Liger's cross entropy has no per-class weight")
        if inputs.get("z_loss"):
            raise Unsupported("Liger's z-loss ignores the class weights (its mean divides it "
                              "by the token count); speedlight weighs it like the target's term")
    extras = [k for k in ("return_z_loss", "return_token_accuracy", "return_predicted_tokens")
              if inputs.get(k)]
    if extras and not all(takes(k) for k in extras):
        raise Unsupported(f"this Liger's cross entropy has no {', '.join(extras)}")
    if extras and inputs.get("reduction") == "sum":
        raise Unsupported("Liger's token accuracy under reduction='sum' is a mean; "
                          "speedlight's too, but its z-loss is a sum")
    if ("return_predicted_tokens" in extras
            and bool((inputs["target"] == inputs.get("ignore_index", -100)).any())):
        raise Unsupported("Liger's predicted tokens are -1 at ignored targets; speedlight's "
                          "are every token's argmax")

    def fn(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0,
           z_loss=0.0, softcap=None, weight=None, **flags):
        more = {k: True for k in extras}
        if weight is not None:
            more["weight"] = weight
        out = F.liger_cross_entropy(logits, target, ignore_index=ignore_index,
                                    reduction=reduction, label_smoothing=label_smoothing,
                                    lse_square_scale=z_loss, softcap=softcap, **more)
        if not extras:
            return out
        # Liger's CrossEntropyOutput (loss, z_loss, token_accuracy, predicted_tokens)
        return tuple(getattr(out, k) for k in ("loss", "z_loss", "token_accuracy",
                                                  "predicted_tokens"))
    # Liger writes the gradient into the logits during the forward: bench restores the
    # inputs before every sample.
    return fn, True


def _linear_cross_entropy(F, inputs: dict, case: Case):
    _need("linear_cross_entropy", inputs, "hidden", "weight", "target")
    extras = [k for k in ("return_z_loss", "return_token_accuracy", "return_predicted_tokens")
              if inputs.get(k)]
    if extras:
        raise Unsupported(f"the Liger mapping of linear_cross_entropy has no {', '.join(extras)}")
    more = {}
    if inputs.get("class_weight") is not None:
        import inspect

        if "ce_weight" not in inspect.signature(F.liger_fused_linear_cross_entropy).parameters:
            raise Unsupported("this Liger's fused linear cross entropy has no class weights")
        if inputs.get("z_loss"):
            raise Unsupported("Liger's z-loss ignores the class weights (its mean divides it "
                              "by the token count); speedlight weighs it like the target's term")
        more["ce_weight"] = inputs["class_weight"]

    def fn(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
           label_smoothing=0.0, z_loss=0.0, softcap=None, **_):
        return F.liger_fused_linear_cross_entropy(
            hidden, weight, target, bias, ignore_index=ignore_index, lse_square_scale=z_loss,
            label_smoothing=label_smoothing, reduction=reduction, softcap=softcap, **more)
    return fn, False


def _softmax(F, inputs: dict, case: Case):
    _need("softmax", inputs, "x")
    x, dim = inputs["x"], inputs.get("dim", -1)
    if dim % x.dim() != x.dim() - 1:
        raise Unsupported(f"Liger's softmax is over the last dim only; this case uses dim {dim}")
    return lambda x, dim=-1, **_: F.liger_softmax(x), False


def _fused_moe(F, inputs: dict, case: Case):
    """Liger's fused MoE (liger_kernel.ops.fused_moe, beside the functional API): SwiGLU
    experts in transformers 5.x's layout, halves of gate_up_proj, no biases, every routing
    index an expert; the int32 cast of the index is Liger's own module's, timed with it."""
    _need("moe_experts", inputs, "hidden", "top_k_index", "top_k_weights", "gate_up_proj",
          "down_proj")
    activation = inputs.get("activation", "silu")
    if activation != "silu":
        raise Unsupported(f"Liger's fused MoE has SwiGLU only; this case's gate unit is "
                          f"{activation}")
    if inputs.get("interleaved"):
        raise Unsupported("Liger's fused MoE takes gate and up as the halves of "
                          "gate_up_proj, not interleaved rows")
    extras = [k for k in ("gate_up_bias", "down_bias", "gate_multiplier", "down_multiplier",
                          "swiglu_limit") if inputs.get(k) is not None]
    if extras:
        raise Unsupported(f"Liger's fused MoE has no {', '.join(extras)}")
    index, experts = inputs["top_k_index"], inputs["gate_up_proj"].shape[0]
    if index.numel() and bool(((index < 0) | (index >= experts)).any()):
        raise Unsupported("Liger's fused MoE takes every routing index in [0, E); this case "
                          "holds expert-parallel sentinels")
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
    except ImportError:
        raise Unsupported(f"this Liger-Kernel ({version()}) has no fused MoE "
                          f"(liger_kernel.ops.fused_moe)") from None

    def fn(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj, **_):
        return LigerFusedMoEFunction.apply(hidden, gate_up_proj, down_proj,
                                           top_k_index.to(torch.int32), top_k_weights)
    return fn, False


# Liger function -> adapter(F, inputs, case) -> (fn(**inputs), mutates_inputs)
ADAPTERS: dict[str, Callable[[Any, dict, Case], tuple[Callable, bool]]] = {
    "liger_rms_norm": _rms_norm,
    "liger_fused_add_rms_norm": _add_rms_norm,
    "liger_layer_norm": _layer_norm,
    "liger_swiglu": _gated("swiglu", "liger_swiglu"),
    "liger_geglu": _gated("geglu", "liger_geglu"),
    "liger_rope": _rope,
    "liger_cross_entropy": _cross_entropy,
    "liger_fused_linear_cross_entropy": _linear_cross_entropy,
    "liger_softmax": _softmax,
    "liger_fused_moe": _fused_moe,
}


def functional():
    """liger_kernel.transformers.functional, or an Unsupported naming the import problem."""
    try:
        import liger_kernel.transformers.functional as F
    except Exception as e:  # ImportError, or a dependency of Liger missing or broken
        raise Unsupported(f"Liger-Kernel is not importable ({type(e).__name__}: {e}); "
                          f"pip install liger-kernel") from None
    return F


def version() -> str | None:
    try:
        from importlib.metadata import version as _v
        return _v("liger-kernel")
    except Exception:
        return None


def adapt(spec: OpSpec, inputs: dict, case: Case) -> tuple[Callable, bool]:
    """(fn, mutates_inputs) calling the Liger function spec.peers names for this case, or
    Unsupported."""
    name = spec.peers.get("liger")
    if name is None:
        raise Unsupported(f"Liger-Kernel has no counterpart of {spec.name}")
    if name not in ADAPTERS:
        raise Unsupported(f"{spec.name} names Liger's {name}, which speedlight has no "
                          f"adapter for")
    return ADAPTERS[name](functional(), inputs, case)
