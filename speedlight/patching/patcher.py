"""Swap speedlight ops into an already-built Hugging Face model, and back.

What is swapped, per module instance (the class, parameters and state-dict stay as they
are, so weights load unchanged and optimizers keep their references):
  rms_norm       every <Family>RMSNorm's forward -> speedlight.rms_norm (offset 1 for Gemma);
                 in_place=True for the norms whose output feeds linear layers alone
                 (Family.in_place_norms: pre-norms and the final norm, never a post-norm
                 whose output joins the residual stream), so their backward allocates
                 nothing of the activations' size
  mlp            every <Family>MLP's forward -> down_proj(swiglu/geglu(gate, up)), with
                 Falcon-H1's mlp multipliers folded into the gated unit; every
                 <Family>Experts' forward (Mixtral, Qwen2/3-MoE, GraniteMoE) -> the given
                 routing, each expert's own projections, and one gated-unit launch over
                 all routed tokens (experts.py);
                 with mlp="fused" -> down_proj(gated_matmul(x, gate and up weights)): both
                 projections and the gated product in one GEMM kernel (off by default
                 until measured on a GPU)
  rope           every <Family>Attention's forward runs with speedlight.rope in place of
                 the family's apply_rotary_pos_emb (the module-level function is replaced
                 by a dispatcher that calls speedlight only inside a patched attention
                 layer, so unpatched models of the same family keep the original)
  cross_entropy  the model's loss_function -> the causal-LM loss on speedlight.cross_entropy
  attention      the model's config._attn_implementation -> "speedlight" (transformers'
                 attention-function and mask registries, see hf_attention.py): every
                 attention layer calls speedlight.attention with its scaling, sliding
                 window and softcap; padding masks arrive 2-D and run as variable length
  decoder_layer  every decoder layer's forward: its residual add and the norm after it
                 (post_attention_layernorm; Gemma 2's pre_feedforward_layernorm) as one
                 speedlight.add_rms_norm (decoder_layer.py: the installed class's forward
                 with those statements rewritten, after checking it has the family's
                 Family.layer_form; a layer that differs, or a family without a form, is
                 kept and reported)
  linear_cross_entropy
                 the causal LM's forward, when it trains with labels: the lm_head and the
                 loss by speedlight.linear_cross_entropy, so the [tokens, vocab] logits are
                 never made, and the output's logits are None (say skip_logits=False to get
                 them; eval mode, no labels or logits_to_keep keep the normal path, whose
                 loss is the cross_entropy patch's). Granite's logits_scaling and Falcon-H1's
                 lm_head_multiplier scale the hidden states first; Gemma 2/3's
                 final_logit_softcapping is the op's softcap; a mixture of experts' load-
                 balancing loss is added when router logits are asked for; the output is
                 the class the family's own forward returns.
unpatch restores every instance's forward, the model's loss and its attention
implementation exactly as they were.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import inspect
import types
import warnings
import weakref
from dataclasses import dataclass, field

import torch

from speedlight.patching.experts import experts_forward, experts_layout_problem
from speedlight.patching.families import ACTIVATIONS, FAMILIES, Family

_RECORD = "_speedlight_patch"


class PatchWarning(UserWarning):
    """Something asked for was not patched; the message lists what was and was not."""


@dataclass
class PatchReport:
    model_type: str
    patched: dict[str, list[str]] = field(default_factory=dict)  # kind -> module paths
    in_place: list[str] = field(default_factory=list)  # norms whose backward writes over dy
    not_patched: list[tuple[str, str]] = field(default_factory=list)  # (what, why)

    def count(self, kind: str) -> int:
        return len(self.patched.get(kind, []))

    def __str__(self) -> str:
        lines = [f"speedlight.patch on a {self.model_type!r} model:"]
        for kind in kinds():
            if kind in self.patched:
                lines.append(f"  patched {kind}: {len(self.patched[kind])} "
                             f"({', '.join(self.patched[kind][:3])}{', ...' if len(self.patched[kind]) > 3 else ''})")
        if self.in_place:
            lines.append(f"  rms_norm backward in place: {len(self.in_place)} (the norms "
                         f"whose output feeds linear layers alone)")
        for what, why in self.not_patched:
            lines.append(f"  NOT patched {what}: {why}")
        return "\n".join(lines)


# --- RoPE: the family's module-level function becomes a dispatcher ----------------------

_ROPE_ACTIVE = contextvars.ContextVar("speedlight_rope_active", default=False)
_ROPE_ORIGINALS: dict[str, object] = {}  # modeling module name -> original function
_ROPE_USERS: dict[str, int] = {}  # modeling module name -> patched attention layers


def _rope_dispatcher(original, interleaved: bool = False):
    """interleaved: GLM's form, pairs (2i, 2i + 1) rotated by the first half of cos/sin
    (cat(freqs, freqs) over the rotary dims) repeat-interleaved, as its function does."""
    signature = inspect.signature(original)

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if not _ROPE_ACTIVE.get():
            return original(q, k, cos, sin, *args, **kwargs)
        from speedlight.ops.rope import rope
        bound = signature.bind(q, k, cos, sin, *args, **kwargs)
        bound.apply_defaults()
        if interleaved:
            half = cos.shape[-1] // 2
            cos = cos[..., :half].repeat_interleave(2, dim=-1)
            sin = sin[..., :half].repeat_interleave(2, dim=-1)
        return rope(q, k, cos, sin, unsqueeze_dim=bound.arguments.get("unsqueeze_dim", 1),
                    interleaved=interleaved)

    apply_rotary_pos_emb.__wrapped__ = original
    return apply_rotary_pos_emb


def _acquire_rope(module_name: str, interleaved: bool = False) -> None:
    mod = importlib.import_module(module_name)
    if module_name not in _ROPE_ORIGINALS:
        _ROPE_ORIGINALS[module_name] = mod.apply_rotary_pos_emb
        mod.apply_rotary_pos_emb = _rope_dispatcher(mod.apply_rotary_pos_emb, interleaved)
    _ROPE_USERS[module_name] = _ROPE_USERS.get(module_name, 0) + 1


def _release_rope(module_name: str) -> None:
    _ROPE_USERS[module_name] -= 1
    if _ROPE_USERS[module_name] == 0:
        importlib.import_module(module_name).apply_rotary_pos_emb = _ROPE_ORIGINALS.pop(module_name)
        del _ROPE_USERS[module_name]


def _attention_forward(previous):
    """The attention layer's own forward (or whatever wrapped it before), run with
    speedlight's RoPE switched on for this call."""
    def forward(self, *args, **kwargs):
        token = _ROPE_ACTIVE.set(True)
        try:
            return previous(*args, **kwargs)
        finally:
            _ROPE_ACTIVE.reset(token)
    return forward


# --- the replacement forwards --------------------------------------------------------------

def _norm_forward(offset: float, out: str, eps_attr: str, in_place: bool = False):
    def forward(self, x):
        from speedlight.ops.rms_norm import rms_norm
        y = rms_norm(x, self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype),
                     float(getattr(self, eps_attr)), offset, in_place=in_place)
        if out == "promote":  # Llama: weight * x.to(input dtype) promotes to weight's dtype
            return y.to(torch.promote_types(x.dtype, self.weight.dtype))
        return y
    return forward


def _split_mlp_forward(op_name: str, op_kwargs: dict):
    """down_proj(act(gate_proj(x)) * up_proj(x)), with Falcon-H1's gate_multiplier and
    down_multiplier (attributes of its MLP) folded into the gated unit; down_multiplier
    scales down_proj's output instead when down_proj has a bias."""
    def forward(self, x):
        op = getattr(importlib.import_module(f"speedlight.ops.{op_name}"), op_name)
        gate_multiplier = float(getattr(self, "gate_multiplier", 1.0))
        down_multiplier = float(getattr(self, "down_multiplier", 1.0))
        folded = self.down_proj.bias is None
        y = self.down_proj(op(self.gate_proj(x), self.up_proj(x), **op_kwargs,
                              gate_multiplier=gate_multiplier,
                              down_multiplier=down_multiplier if folded else 1.0))
        return y if folded or down_multiplier == 1.0 else y * down_multiplier
    return forward


def _fused_mlp_forward(op_name: str, op_kwargs: dict):
    def forward(self, x):
        op = getattr(importlib.import_module(f"speedlight.ops.{op_name}"), op_name)
        return self.down_proj(op(self.gate_up_proj(x), None, **op_kwargs))
    return forward


_GATED_ACTIVATION = {("swiglu", ""): "silu", ("geglu", "tanh"): "gelu_tanh",
                     ("geglu", "none"): "gelu"}


def _gated_matmul_forward(op_name: str, op_kwargs: dict):
    """down_proj(act(x W_gate^T) * (x W_up^T)) with the two projections in one kernel: the
    weights are the module's own parameters (gate_up_proj's [2I, H] for Phi-3)."""
    activation = _GATED_ACTIVATION[(op_name, op_kwargs.get("approximate", ""))]

    def forward(self, x):
        from speedlight.ops.gated_matmul import gated_matmul
        if hasattr(self, "gate_up_proj"):
            h = gated_matmul(x, self.gate_up_proj.weight, None, activation)
        else:
            h = gated_matmul(x, self.gate_proj.weight, self.up_proj.weight, activation)
        return self.down_proj(h)
    return forward


def _has_multipliers(mlp) -> bool:
    """Whether the MLP scales its gate or its output (Falcon-H1's mlp_multipliers)."""
    return any(float(getattr(mlp, name, 1.0)) != 1.0
               for name in ("gate_multiplier", "down_multiplier"))


def _has_bias(mlp) -> bool:
    return any(getattr(getattr(mlp, name, None), "bias", None) is not None
               for name in ("gate_proj", "up_proj", "gate_up_proj"))


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels=None, **kwargs):
    """Hugging Face's ForCausalLMLoss on speedlight.cross_entropy: labels shifted by one,
    mean over non-ignored tokens (or sum / num_items_in_batch). The logits are not upcast
    to float32 first: the kernel accumulates in float32 whatever their dtype."""
    from speedlight.ops.cross_entropy import cross_entropy
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.reshape(-1, vocab_size)
    shift_labels = shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return cross_entropy(logits, shift_labels, ignore_index=ignore_index).float()
    loss = cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction="sum").float()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def fused_causal_lm_loss(hidden, lm_head, labels, *, shift_labels=None,
                         num_items_in_batch=None, ignore_index: int = -100,
                         logits_scale: float = 1.0, softcap: float | None = None):
    """Hugging Face's ForCausalLMLoss of lm_head(hidden) (times logits_scale, soft-capped),
    by speedlight.linear_cross_entropy: the logits are never made. Labels shifted by one;
    a mean over non-ignored tokens, or sum / num_items_in_batch (gradient accumulation);
    fp32, as Hugging Face's loss. A logits_scale other than 1 needs a bias-free lm_head."""
    from speedlight.ops.linear_cross_entropy import linear_cross_entropy
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    if logits_scale != 1:
        hidden = hidden * logits_scale  # s * lm_head(h) = lm_head(s * h) without a bias
    target = shift_labels.to(hidden.device)
    kwargs = dict(ignore_index=ignore_index, softcap=softcap)
    if num_items_in_batch is None:
        return linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias,
                                    **kwargs).float()
    loss = linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias, reduction="sum",
                                **kwargs).float()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


_LOSS_KWARG = "speedlight_fused_loss"


def _lm_head_forward(previous):
    """The lm_head's own forward, which computes fused_causal_lm_loss instead when the
    patched causal-LM forward passes the loss's arguments: the loss then runs inside the
    lm_head's call, after the hooks that gather its weight (FSDP2 unshards a fully_shard
    lm_head, ZeRO-3 gathers its parameters, in the module's pre-forward hooks), and its
    backward passes the module's post-backward hooks (gradient reduce-scatter)."""
    def forward(self, hidden, *args, **kwargs):
        loss_args = kwargs.pop(_LOSS_KWARG, None)
        if loss_args is None:
            return previous(hidden, *args, **kwargs)
        return fused_causal_lm_loss(hidden, self, **loss_args)
    return forward


def _logits_scale(model) -> float:
    """What a family multiplies its lm_head's output by before the loss: Granite divides by
    config.logits_scaling, Falcon-H1 multiplies by model.lm_head_multiplier; 1 elsewhere."""
    scale = 1.0
    divisor = getattr(model.config, "logits_scaling", None)
    if divisor:
        scale /= float(divisor)
    multiplier = getattr(model.model, "lm_head_multiplier", None)
    if multiplier is not None:
        scale *= float(multiplier)
    return scale


def _causal_lm_forward(previous, signature: inspect.Signature):
    """The causal LM's forward: with labels in training (or skip_logits=True), the base
    model, then fused_causal_lm_loss on its last hidden state; otherwise `previous`."""
    var_kw = next((n for n, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None)

    def forward(self, *args, skip_logits: bool | None = None, **kwargs):
        bound = signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        extra = dict(arguments.pop(var_kw, {}) if var_kw else {})
        labels = arguments.pop("labels", None)
        keep = arguments.pop("logits_to_keep", 0)
        fused = labels is not None and (self.training if skip_logits is None else skip_logits)
        scale = _logits_scale(self)
        if (not fused or not isinstance(keep, int) or keep != 0
                or (scale != 1 and self.lm_head.bias is not None)):
            return previous(*args, **kwargs)
        loss_kwargs = {k: extra.pop(k) for k in ("num_items_in_batch", "shift_labels",
                                                 "ignore_index") if k in extra}
        moe = hasattr(self, "router_aux_loss_coef")
        if moe and arguments.get("output_router_logits") is None:
            arguments["output_router_logits"] = bool(getattr(self.config, "output_router_logits",
                                                             False))
        outputs = self.model(**arguments, **extra)
        config = self.config
        # through the lm_head's call, so that hooks gathering a sharded weight run first
        # (FSDP2's fully_shard of the lm_head, DeepSpeed ZeRO-3): see _lm_head_forward
        loss = self.lm_head(outputs[0], **{_LOSS_KWARG: dict(
            labels=labels, **loss_kwargs, logits_scale=scale,
            softcap=getattr(config, "final_logit_softcapping", None))})
        fields = {k: v for k, v in outputs.items() if k != "last_hidden_state"}
        if moe and arguments["output_router_logits"]:
            # the load-balancing loss of the family's own function, added as its forward does
            balance = importlib.import_module(type(self).__module__).load_balancing_loss_func
            aux = balance(outputs.router_logits, self.num_experts, self.num_experts_per_tok,
                          arguments.get("attention_mask"))
            loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
            fields["aux_loss"] = aux
        output = _causal_lm_output(self, outputs)
        known = {f.name for f in dataclasses.fields(output)}
        return output(loss=loss, logits=None, **{k: v for k, v in fields.items() if k in known})
    return forward


def _causal_lm_output(model, outputs) -> type:
    """The output class the causal LM's own forward returns for its base model's `outputs`:
    <X>CausalLMOutputWithPast for <X>BaseModelOutputWithPast or <X>ModelOutputWithPast
    (Moe..., Multimodal...), from the model's modeling module or
    transformers.modeling_outputs; CausalLMOutputWithPast otherwise."""
    from transformers import modeling_outputs
    name = type(outputs).__name__
    for suffix in ("BaseModelOutputWithPast", "ModelOutputWithPast"):
        if name.endswith(suffix):
            name = name[:-len(suffix)] + "CausalLMOutputWithPast"
            break
    for where in (importlib.import_module(type(model).__module__), modeling_outputs):
        if isinstance(getattr(where, name, None), type):
            return getattr(where, name)
    return modeling_outputs.CausalLMOutputWithPast


# --- patch / unpatch -------------------------------------------------------------------------

def kinds() -> tuple[str, ...]:
    """What patch swaps, in the registry's order: the `patches` of the built-in OpSpecs
    (mlp covers swiglu and geglu)."""
    from speedlight import registry
    return tuple(dict.fromkeys(s.patches for s in registry.builtin_specs() if s.patches))


def _available(op: str) -> bool:
    """Whether op is a built-in op of this install."""
    from speedlight import registry
    return op in registry.BUILTIN_OPS


def _activation_of(mlp) -> tuple[str, dict] | None:
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    if act is None:
        return None
    name = type(act).__name__
    if name == "GELU" and getattr(act, "approximate", "none") == "tanh":
        return "geglu", {"approximate": "tanh"}
    return ACTIVATIONS.get(name)


def _gated_unit(path: str, mlp, report: PatchReport) -> tuple[str, dict] | None:
    """The speedlight op (and its arguments) for an MLP's or experts' activation, or None
    with the reason in the report: no kernel for the activation, or none in this install."""
    act = _activation_of(mlp)
    if act is None:
        report.not_patched.append((f"mlp {path}", "activation "
                                   f"{type(getattr(mlp, 'act_fn', None)).__name__} "
                                   "has no speedlight kernel"))
        return None
    if not _available(act[0]):
        report.not_patched.append((f"mlp {path}", f"this install has no speedlight.{act[0]}"))
        return None
    return act


def patch(model: torch.nn.Module, *, rms_norm: bool = True, mlp: bool | str = True,
          rope: bool = True, cross_entropy: bool = True, attention: bool = True,
          norm_in_place: bool = True, linear_cross_entropy: bool = True,
          decoder_layer: bool = True) -> PatchReport:
    """Swap speedlight ops into `model` (a family of speedlight.patching.families.FAMILIES:
    Llama, Mistral, Ministral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, Phi-3, Falcon-H1,
    Granite, OLMo 2, GLM-4, SmolLM3, Qwen2-VL's text decoder, Mixtral, Qwen2-MoE,
    Qwen3-MoE, GraniteMoE).

    decoder_layer: within each decoder layer, the residual add and the norm after it run
    as one speedlight.add_rms_norm (the family's Family.layer_form; Granite, GraniteMoE and
    OLMo 2 keep their layers, see their layer_note).

    linear_cross_entropy: the training loss of a causal LM with labels is computed without
    its logits, which the output then does not hold (see the module docstring).

    norm_in_place: the norms whose output feeds linear layers alone (the family's
    in_place_norms) run their backward in place (speedlight.rms_norm's in_place); False
    keeps every norm's backward out of place.

    mlp: True swaps the gated unit between the projections (swiglu / geglu); "fused" runs
    both input projections and the gated product as one speedlight.gated_matmul kernel,
    then the module's own down_proj (MLPs with biases keep the unfused path, reported);
    False leaves the MLPs alone.

    Returns a PatchReport listing what was patched; anything asked for that could not be
    patched (an unknown architecture, an unsupported activation) is also warned about
    with a PatchWarning, never skipped silently. `unpatch(model)` undoes it exactly.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if mlp not in (True, False, "fused"):
        raise ValueError(f"mlp must be True, False or 'fused', got {mlp!r}")
    if hasattr(model, _RECORD):
        raise ValueError("model is already patched by speedlight; call speedlight.unpatch(model) first")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None) or type(model).__name__
    family: Family | None = FAMILIES.get(model_type)
    wanted = {"rms_norm": rms_norm, "mlp": mlp, "rope": rope, "cross_entropy": cross_entropy,
              "attention": attention, "decoder_layer": decoder_layer,
              "linear_cross_entropy": linear_cross_entropy}
    report = PatchReport(model_type)
    record: dict = {"forwards": [], "rope_modules": [], "loss": None, "attention": None}

    if family is None:
        for kind, on in wanted.items():
            if on:
                report.not_patched.append(
                    (kind, f"unknown architecture {model_type!r}; speedlight patches "
                           f"{', '.join(sorted(FAMILIES))}"))
    else:
        for path, module in model.named_modules():
            cls = type(module).__name__
            if cls in (family.norm_class, family.mlp_class, family.experts_class) and \
                    "forward" in module.__dict__:
                report.not_patched.append((path, "its forward is already wrapped (e.g. by "
                                           "accelerate hooks); speedlight leaves it alone"))
                continue
            if wanted["rms_norm"] and cls == family.norm_class:
                eps_attr = "variance_epsilon" if hasattr(module, "variance_epsilon") else "eps"
                in_place = norm_in_place and path.rsplit(".", 1)[-1] in family.in_place_norms
                _set_forward(module, _norm_forward(family.norm_offset, family.norm_out, eps_attr,
                                                   in_place), record)
                report.patched.setdefault("rms_norm", []).append(path)
                if in_place:
                    report.in_place.append(path)
            elif wanted["mlp"] and cls == family.mlp_class:
                act = _gated_unit(path, module, report)
                if act is None:
                    continue
                if mlp == "fused" and _has_bias(module):
                    report.not_patched.append((f"mlp {path} (fused)", "its projections have "
                                               "biases, which gated_matmul does not add; the "
                                               "gated unit alone is patched"))
                elif mlp == "fused" and _has_multipliers(module):
                    report.not_patched.append((f"mlp {path} (fused)", "it has mlp multipliers "
                                               "(Falcon-H1), which gated_matmul does not "
                                               "apply; the gated unit alone is patched"))
                elif mlp == "fused" and _available("gated_matmul"):
                    _set_forward(module, _gated_matmul_forward(*act), record)
                    report.patched.setdefault("mlp", []).append(f"{path} (gated_matmul)")
                    continue
                make = _fused_mlp_forward if family.mlp == "fused" else _split_mlp_forward
                _set_forward(module, make(*act), record)
                report.patched.setdefault("mlp", []).append(f"{path} ({act[0]})")
            elif wanted["mlp"] and cls == family.experts_class:
                _patch_experts(path, module, mlp, report, record)
            elif wanted["rope"] and cls == family.attention_class:
                previous = module.__dict__.get("forward") or module.forward
                _set_forward(module, _attention_forward(previous), record)
                _acquire_rope(family.module, family.rope_interleaved)
                # released by unpatch, or when the model is garbage-collected unpatched
                record["rope_modules"].append(weakref.finalize(model, _release_rope, family.module))
                report.patched.setdefault("rope", []).append(path)
        for kind in ("rms_norm", "mlp", "rope"):
            if wanted[kind] and kind not in report.patched and not any(
                    w.startswith(kind) for w, _ in report.not_patched):
                report.not_patched.append((kind, f"no {kind} module of the {model_type} family found"))
        if wanted["decoder_layer"]:
            _patch_decoder_layers(model, family, report, record, norm_in_place)
        if wanted["cross_entropy"]:
            if not _available("cross_entropy"):
                report.not_patched.append(("cross_entropy", "this install has no speedlight.cross_entropy"))
            elif hasattr(type(model), "loss_function"):
                record["loss"] = ("had", model.__dict__["_loss_function"]) if "_loss_function" in model.__dict__ else ("none", None)
                model.loss_function = causal_lm_loss
                report.patched["cross_entropy"] = ["loss_function"]
            else:
                report.not_patched.append(("cross_entropy", f"{type(model).__name__} computes no loss "
                                           "(not a *ForCausalLM model)"))
        if wanted["attention"]:
            _patch_attention(model, family, report, record)
        if wanted["linear_cross_entropy"]:
            _patch_causal_lm_forward(model, report, record)
    setattr(model, _RECORD, record)
    if report.not_patched:
        warnings.warn(str(report), PatchWarning, stacklevel=2)
    return report


def _patch_decoder_layers(model, family: Family, report: PatchReport, record: dict,
                          norm_in_place: bool) -> None:
    """Each decoder layer's residual add and the following norm as one add_rms_norm (see
    decoder_layer.py); a layer whose forward differs from the family's form is kept, with
    the reason."""
    from speedlight.patching import decoder_layer as dl

    kind = "decoder_layer"
    if not _available("add_rms_norm"):
        report.not_patched.append((kind, "this install has no speedlight.add_rms_norm"))
        return
    if family.layer_form is None:
        report.not_patched.append((kind, f"{family.model_type}: {family.layer_note}"))
        return
    layers = dl.layer_modules(model, family)
    if not layers:
        report.not_patched.append((kind, f"no decoder layer of the {family.model_type} family "
                                   "found"))
        return
    ours = {id(m) for m, _ in record["forwards"]}
    for path, layer in layers:
        if "forward" in layer.__dict__:
            report.not_patched.append((f"{kind} {path}", "its forward is already wrapped (e.g. "
                                       "by accelerate hooks); speedlight leaves it alone"))
            continue
        try:
            forward, attr, add_norm = dl.fused_forward(layer, family, in_place=norm_in_place)
        except dl.LayerFormError as e:
            report.not_patched.append((f"{kind} {path}", f"{type(layer).__name__} of the "
                                       f"installed transformers is not of the {family.layer_form} "
                                       f"form: {e}; the layer is kept as it is"))
            continue
        norm = getattr(layer, attr)
        if "forward" in norm.__dict__ and id(norm) not in ours:
            report.not_patched.append((f"{kind} {path}", f"self.{attr}'s forward is already "
                                       "wrapped (e.g. by accelerate hooks); fusing would skip it"))
            continue
        _set_forward(layer, forward, record)
        report.patched.setdefault(kind, []).append(
            f"{path} ({family.layer_form}: residual add + {attr})")
        norm_path = f"{path}.{attr}"
        if add_norm.in_place and norm_path not in report.in_place:
            report.in_place.append(norm_path)


def _patch_experts(path: str, module, mlp: bool | str, report: PatchReport, record: dict) -> None:
    """A mixture of experts' <Prefix>Experts: every expert's gated unit through speedlight."""
    act = _gated_unit(path, module, report)
    if act is None:
        return
    problem = experts_layout_problem(module)
    if problem is not None:
        report.not_patched.append((f"mlp {path}", problem))
        return
    if mlp == "fused":
        report.not_patched.append((f"mlp {path} (fused)", "gated_matmul reads one weight "
                                   "pair, not 3-D expert weights; the gated unit alone is "
                                   "patched"))
    _set_forward(module, experts_forward(*act), record)
    report.patched.setdefault("mlp", []).append(
        f"{path} ({act[0]}, {module.gate_up_proj.shape[0]} experts)")


def _patch_causal_lm_forward(model, report: PatchReport, record: dict) -> None:
    kind = "linear_cross_entropy"
    lm_head = getattr(model, "lm_head", None)
    if not (hasattr(type(model), "loss_function") and isinstance(lm_head, torch.nn.Linear)
            and isinstance(getattr(model, "model", None), torch.nn.Module)):
        report.not_patched.append((kind, f"{type(model).__name__} is not a causal LM with a "
                                   "linear lm_head over its base model"))
        return
    if not _available(kind):
        report.not_patched.append((kind, "this install has no speedlight.linear_cross_entropy"))
        return
    previous = model.__dict__.get("forward") or model.forward
    _set_forward(model, _causal_lm_forward(previous, inspect.signature(previous)), record)
    _set_forward(lm_head, _lm_head_forward(lm_head.__dict__.get("forward") or lm_head.forward),
                 record)
    report.patched[kind] = ["forward (training with labels: the loss without logits; "
                            "the output's logits are None)"]
def _patch_attention(model, family: Family, report: PatchReport, record: dict) -> None:
    """Point the model's config at the "speedlight" attention implementation, and let every
    attention layer find the report its fallbacks are written to."""
    from speedlight.patching import hf_attention

    config = model.config
    if not _available("attention"):
        report.not_patched.append(("attention", "this install has no speedlight.attention"))
        return
    if not hasattr(config, "_attn_implementation_internal"):
        report.not_patched.append(("attention", "this transformers version has no attention-"
                                   "function registry (config._attn_implementation)"))
        return
    layers = [(path, m) for path, m in model.named_modules()
              if type(m).__name__ == family.attention_class]
    if not layers:
        report.not_patched.append(("attention", f"no attention module of the {family.model_type} "
                                   "family found"))
        return
    hf_attention.register()
    # the configs the attention layers (and their model's mask builder) read: the model's
    # own, or a sub-config (Qwen2-VL's text_config); set there alone, so that a vision
    # tower's attention, which reads another sub-config, keeps its implementation
    configs = {id(c): c for c in (getattr(m, "config", None) or config for _, m in layers)}
    record["attention"] = ([(c, c._attn_implementation_internal) for c in configs.values()],
                           [m for _, m in layers])
    for c in configs.values():
        c._attn_implementation_internal = hf_attention.NAME
    for path, m in layers:
        setattr(m, hf_attention.REPORT_ATTR, report)
    report.patched["attention"] = [path for path, _ in layers]


def _set_forward(module: torch.nn.Module, fn, record: dict) -> None:
    had = module.__dict__.get("forward")
    record["forwards"].append((module, had))
    module.forward = types.MethodType(fn, module)


def unpatch(model: torch.nn.Module) -> None:
    """Restore every module and the loss exactly as they were before speedlight.patch."""
    record = model.__dict__.get(_RECORD)
    if record is None:
        raise ValueError("model is not patched by speedlight")
    for module, had in record["forwards"]:
        if had is None:
            del module.forward
        else:
            module.forward = had
    for release in record["rope_modules"]:
        release()  # a finalizer runs once: here, not again when the model is collected
    if record.get("attention") is not None:
        from speedlight.patching import hf_attention
        previous, layers = record["attention"]
        for c, implementation in previous:
            c._attn_implementation_internal = implementation
        for m in layers:
            m.__dict__.pop(hf_attention.REPORT_ATTR, None)
    if record["loss"] is not None:
        state, value = record["loss"]
        if state == "had":
            model._loss_function = value
        else:
            model.__dict__.pop("_loss_function", None)
    delattr(model, _RECORD)
