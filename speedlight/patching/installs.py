"""Another candidate than speedlight's kernel for a kind (a plan's choice, or
patch(model, rms_norm="liger")), put into the model by the mechanism the kind's own patch
uses, so unpatch restores it the same way:

  rms_norm, mlp (dense)   the module's forward (forwards.py), calling the candidate's
                          function from speedlight/candidates with the op's inputs by name;
                          torch-compile: the class's own forward under torch.compile
  mlp (experts)           transformers' experts registry: torch-grouped-mm is its own
                          "grouped_mm", liger's fused MoE a forward registered as
                          speedlight's is (experts.py); torch-compile the module's forward
  rope                    the attention class's forward recompiled with
                          apply_rotary_pos_emb bound to the candidate's (rotary.py)
  cross_entropy           the model's loss_function (causal_lm.causal_lm_loss_with)
  linear_cross_entropy    the causal LM's forward, the fused loss by the candidate
  attention               transformers' attention registry: SDPA with one backend forced
                          (registered as "speedlight-<name>", SDPA's own function and mask
                          under candidates.attention.forced_sdpa), flex_attention,
                          flash_attention_2/3 (its own)
A candidate that has no form of the model's variant (Liger's RoPE and GLM's interleaved
pairs, SDPA and a softcap, F.linear_cross_entropy and a final soft-cap, a backend this
device lacks...) is not installed: the report names the module and the reason, and the
module keeps its own forward.
"""

from __future__ import annotations

import inspect

import torch

from speedlight import candidates
from speedlight.candidates import COMPILE, FLASH_ATTN, FLEX, GROUPED_MM, MODEL, SDPA, Unsupported
from speedlight.patching import experts, forwards

# the op each kind's candidates compute (mlp: the family's gated unit, or moe_experts)
KIND_OPS = {"rms_norm": ("rms_norm",), "mlp": ("swiglu", "geglu", "moe_experts"),
            "rope": ("rope",), "cross_entropy": ("cross_entropy",),
            "linear_cross_entropy": ("linear_cross_entropy",), "attention": ("attention",),
            "decoder_layer": ()}  # only speedlight's default fuses the layer's add and norm
_COMPILED: dict = {}  # (a class's forward or a function, options) -> its torch.compile
# torch.compile's options for the torch-compile candidate (inductor, torch's default mode)
COMPILE_OPTIONS: dict = {}


def names_for(kind: str) -> tuple[str, ...]:
    """Every name `kind`'s keyword of patch takes: the candidates that may serve it and
    speedlight's other implementations of its ops (speedlight-cuda...)."""
    from speedlight import registry

    labels = []
    for op in KIND_OPS[kind]:
        if op in registry.BUILTIN_OPS:
            spec = registry.builtin_spec(op)
            labels += [spec.label(i) for i in spec.implementations]
    return tuple(dict.fromkeys((*candidates.for_kind(kind), *labels)))


def chosen(kind: str, value) -> str | None:
    """The candidate a kind's keyword of patch names: True speedlight's (mlp="fused":
    speedlight's fused MLP), False, None or "model" none (the model's own stays), a name
    one of names_for(kind); ValueError otherwise."""
    if value is True or (kind == "mlp" and value == "fused"):
        return candidates.SPEEDLIGHT
    if value is False or value is None or value == MODEL:
        return None
    if isinstance(value, str) and value in names_for(kind):
        return value
    extra = ", 'fused'" if kind == "mlp" else ""
    raise ValueError(f"{kind} must be True, False{extra} or a candidate's name "
                     f"({', '.join(names_for(kind))}); got {value!r}")


def _device(job) -> torch.device:
    first = next(job.model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _adapt(job, name: str, op: str, template: dict):
    """candidates.adapt for the model's device, the case named by the op alone."""
    from speedlight import registry
    from speedlight.spec import Case

    fn, _ = candidates.adapt(name, registry.builtin_spec(op), Case(op), template, _device(job))
    return fn


def compiled(function):
    """torch.compile of a class's forward or a function (COMPILE_OPTIONS), made once per
    process."""
    key = (function, tuple(sorted(COMPILE_OPTIONS.items())))
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(function, **COMPILE_OPTIONS)
    return _COMPILED[key]


def _compiled_forward(cls: type):
    compiled_forward = compiled(cls.forward)

    def forward(self, *args, **kwargs):
        return compiled_forward(self, *args, **kwargs)
    return forward


def _rms_norm(job, name: str) -> None:
    family = job.family
    for path, module in job.modules(family.norm_class):
        in_place = job.norm_in_place and path.rsplit(".", 1)[-1] in family.in_place_norms
        if name == COMPILE:
            forward = _compiled_forward(type(module))
        else:
            eps_attr = "variance_epsilon" if hasattr(module, "variance_epsilon") else "eps"
            template = {"x": None, "weight": module.weight, "eps": getattr(module, eps_attr),
                        "offset": family.norm_offset, "in_place": in_place}
            try:
                fn = _adapt(job, name, "rms_norm", template)
            except Unsupported as e:
                job.refuse(f"rms_norm {path} ({name})", str(e))
                continue
            forward = forwards.norm_forward(family.norm_offset, family.norm_out, eps_attr,
                                            in_place, fn)
        job.set_forward(module, forward)
        job.add("rms_norm", f"{path} ({name})")
    job.none_found("rms_norm")


def _dense_mlp(job, name: str, path: str, module) -> None:
    if name == COMPILE:
        job.set_forward(module, _compiled_forward(type(module)))
        job.add("mlp", f"{path} ({name})")
        return
    act = forwards.activation_of(module)
    if act is None:
        job.refuse(f"mlp {path} ({name})", "its activation has no gated unit speedlight knows")
        return
    op_name, op_kwargs = act
    template = {"gate": None, "up": None, **op_kwargs,
                "gate_multiplier": float(getattr(module, "gate_multiplier", 1.0)),
                "down_multiplier": float(getattr(module, "down_multiplier", 1.0))}
    try:
        fn = _adapt(job, name, op_name, template)
    except Unsupported as e:
        job.refuse(f"mlp {path} ({name})", str(e))
        return
    make = forwards.fused_mlp_forward if job.family.mlp == "fused" else forwards.split_mlp_forward
    job.set_forward(module, make(op_name, op_kwargs, fn))
    job.add("mlp", f"{path} ({name}: {op_name})")


def _experts(job, name: str, path: str, module) -> None:
    registry = experts.experts_registry()
    dispatched = registry is not None and experts._dispatched(module)
    if name == COMPILE:
        job.set_forward(module, _compiled_forward(type(module)))
        job.add("mlp", f"{path} ({name})")
    elif name == GROUPED_MM:
        if not dispatched or "grouped_mm" not in registry:
            job.refuse(f"mlp {path} ({name})", "its experts do not dispatch through "
                                               "transformers' experts registry, whose "
                                               "grouped_mm runs torch._grouped_mm")
            return
        config = module.config
        if all(c is not config for c, _ in job.record["experts"]):
            job.record["experts"].append((config, config._experts_implementation_internal))
            config._experts_implementation_internal = "grouped_mm"
        job.add("mlp", f"{path} ({name}: transformers' grouped_mm)")
    else:
        act = forwards.activation_of(module)
        activation = experts.moe_activation(*act) if act is not None else None
        problem = ("its gate unit is none moe_experts has" if job.family.experts != "standard"
                   or activation is None else experts.experts_layout_problem(module))
        if problem is not None:
            job.refuse(f"mlp {path} ({name})", problem)
            return
        index = torch.empty(0, 1, dtype=torch.long, device=module.gate_up_proj.device)
        template = {"hidden": None, "top_k_index": index, "top_k_weights": None,
                    "gate_up_proj": module.gate_up_proj, "down_proj": module.down_proj,
                    "activation": activation}
        try:
            fn = _adapt(job, name, "moe_experts", template)
        except Unsupported as e:
            job.refuse(f"mlp {path} ({name})", str(e))
            return

        def forward(self, hidden_states, top_k_index, top_k_weights):
            return fn(hidden=hidden_states, top_k_index=top_k_index,
                      top_k_weights=top_k_weights, gate_up_proj=self.gate_up_proj,
                      down_proj=self.down_proj, activation=activation)
        way = "registry" if experts.register(module, forward) else "module"
        if way == "module":
            job.set_forward(module, forward)
        job.add("mlp", f"{path} ({name}, {way})")


def _mlp(job, name: str) -> None:
    family = job.family
    for path, module in job.modules(family.mlp_class):
        _dense_mlp(job, name, path, module)
    for class_name in family.experts_classes:
        for path, module in job.modules(class_name):
            _experts(job, name, path, module)
    if family.experts_classes and name not in (COMPILE, GROUPED_MM):
        job.record["experts"] = experts.switch_configs(job.model, family.experts_classes)
    job.none_found("mlp")


def _rope(job, name: str) -> None:
    from speedlight.patching import rotary
    from speedlight.patching.recompile import SourceError

    family = job.family
    if name == COMPILE:
        def function(original):
            return compiled(original)
    else:
        meta = torch.empty(1, 1, 1, 2, device="meta")
        template = {"q": meta, "k": meta, "cos": meta[0], "sin": meta[0], "position_ids": None,
                    "unsqueeze_dim": 1, "interleaved": family.rope_interleaved}
        try:
            fn = _adapt(job, name, "rope", template)
        except Unsupported as e:
            return job.refuse(f"rope ({name})", str(e))
        if family.rope_half_table:
            return job.refuse(f"rope ({name})", "gpt-oss's cos/sin hold one angle per pair; "
                                                "only speedlight's RoPE is given that table")

        def function(original):
            return rotary.speedlight_rope(original, family.rope_interleaved, False, fn)
    for path, module in job.modules(family.attention_class):
        if rotary.NAME not in inspect.unwrap(type(module).forward).__code__.co_names:
            job.refuse(f"rope {path}", f"its forward does not call {rotary.NAME}")
            continue
        try:
            forward = rotary.forward_with_rope(type(module), family, function, label=name)
        except SourceError as e:
            job.refuse(f"rope {path}", str(e))
            continue
        job.set_forward(module, forward)
        job.add("rope", f"{path} ({name})")
    job.none_found("rope")


def _cross_entropy(job, name: str):
    from speedlight.patching import causal_lm

    if not hasattr(type(job.model), "loss_function"):
        return job.refuse("cross_entropy", f"{type(job.model).__name__} computes no loss (not "
                                           "a *ForCausalLM model)")
    if name == COMPILE:
        return compiled(job.model.loss_function)
    template = {"logits": None, "target": None, "ignore_index": -100, "reduction": "mean"}
    try:
        return causal_lm.causal_lm_loss_with(_adapt(job, name, "cross_entropy", template))
    except Unsupported as e:
        return job.refuse(f"cross_entropy ({name})", str(e))


def _fused_loss(job, name: str):
    """The fused loss function of candidate `name` over the model's lm_head, or None with
    the reason in the report."""
    lm_head = getattr(job.model, "lm_head", None)
    weight = getattr(lm_head, "weight", None)
    template = {"hidden": None, "weight": weight, "target": None,
                "bias": getattr(lm_head, "bias", None), "label_smoothing": 0.0,
                "softcap": getattr(job.model.config, "final_logit_softcapping", None)}
    try:
        return _adapt(job, name, "linear_cross_entropy", template)
    except Unsupported as e:
        return job.refuse(f"linear_cross_entropy ({name})", str(e))


def _flash_attention_implementation() -> str | None:
    """transformers' flash-attn implementation for the flash-attn installed (3, else 2, else
    the CuTe-DSL 4), or None."""
    import transformers.utils as tu

    for version in (3, 2, 4):
        available = getattr(tu, f"is_flash_attn_{version}_available", None)
        if available is not None and available():
            return f"flash_attention_{version}"
    return None


def attention_implementation(job, name: str) -> str | None:
    """transformers' attention implementation serving candidate `name` in this model
    (registered here for a forced SDPA backend), or None with the reason in the report."""
    from speedlight.candidates import attention as attention_candidates

    config = job.model.config
    device = _device(job)
    if name in SDPA:
        if getattr(config, "attn_logit_softcapping", None) is not None:
            return job.refuse(f"attention ({name})", "SDPA has no softcap; the model "
                                                     "soft-caps its attention scores")
        if device.type != "cuda" and name in ("sdpa-efficient", "sdpa-cudnn"):
            return job.refuse(f"attention ({name})", f"SDPA's {name[5:]} backend runs on "
                                                     "CUDA GPUs")
        return _register_forced_sdpa(name, attention_candidates.forced_sdpa)
    if name == FLEX:
        return "flex_attention"
    if name == FLASH_ATTN:
        if device.type != "cuda":
            return job.refuse(f"attention ({name})", "flash-attn runs on CUDA GPUs")
        found = _flash_attention_implementation()
        if found is None:
            return job.refuse(f"attention ({name})", "flash-attn is not installed (pip "
                                                     "install flash-attn)")
        return found
    return job.refuse(f"attention ({name})", f"{name} is no attention implementation")


def _register_forced_sdpa(name: str, forced) -> str:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    registered = f"speedlight-{name}"

    def attention_forward(*args, **kwargs):
        with forced(name):
            return sdpa_attention_forward(*args, **kwargs)
    AttentionInterface.register(registered, attention_forward)
    AttentionMaskInterface.register(registered, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return registered
