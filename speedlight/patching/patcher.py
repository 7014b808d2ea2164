"""Swap speedlight ops into an already-built Hugging Face model, and back.

What is swapped, per module instance (the class, parameters and state-dict stay as they
are, so weights load unchanged and optimizers keep their references), kind by kind (KINDS,
the one table apply_kinds() walks):
  rms_norm       every <Family>RMSNorm's forward -> speedlight.rms_norm (offset 1 for Gemma);
                 in_place=True for the norms whose output feeds linear layers alone
                 (Family.in_place_norms: pre-norms and the final norm, never a post-norm
                 whose output joins the residual stream), so their backward allocates
                 nothing of the activations' size
  mlp            every <Family>MLP's forward -> down_proj(swiglu/geglu(gate, up)), with
                 Falcon-H1's mlp multipliers folded into the gated unit; every
                 <Family>Experts (Mixtral, Qwen2/3-MoE, GraniteMoE, gpt-oss, DeepSeek-V3's
                 routed experts) -> the given routing through one
                 speedlight.moe_experts call, by transformers' experts
                 registry where it has one, else the instance's forward (experts.py);
                 with mlp="fused" -> down_proj(gated_matmul(x, gate and up weights)): both
                 projections and the gated product in one GEMM kernel (off by default
                 until measured on a GPU; a projection that is an adapter or quantized
                 layer keeps the gated unit alone, with the reason in the report)
  rope           every <Family>Attention's forward: the class's own, recompiled with
                 apply_rotary_pos_emb bound to speedlight.rope (rotary.py); the family's
                 module-level function is never replaced
  decoder_layer  every decoder layer's forward: its residual add and the norm after it
                 (post_attention_layernorm; Gemma 2's pre_feedforward_layernorm) as one
                 speedlight.add_rms_norm (decoder_layer.py: the installed class's forward
                 with those statements rewritten, after checking it has the family's
                 Family.layer_form; a layer that differs, or a family without a form, is
                 kept and reported)
  cross_entropy  the model's loss_function -> the causal-LM loss on speedlight.cross_entropy
  attention      the model's config._attn_implementation -> "speedlight" (transformers'
                 attention-function and mask registries, see hf_attention.py): every
                 attention layer calls speedlight.attention with its scaling, sliding
                 window and softcap; padding masks and packed sequences run as variable
                 length
  linear_cross_entropy
                 the causal LM's forward, when it trains with labels: the lm_head and the
                 loss by speedlight.linear_cross_entropy, so the [tokens, vocab] logits are
                 never made, and the output's logits are None (causal_lm.py; say
                 skip_logits=False to get them; eval mode, no labels or logits_to_keep keep
                 the normal path, whose loss is the cross_entropy patch's).
Every forward keeps the signature of the one it replaces (the causal LM's gains
skip_logits), so Trainer keeps a dataset's columns and generate passes logits_to_keep.
A model wrapped by PEFT (get_peft_model) is patched through to its base model.
unpatch restores every instance's forward, the model's loss and its attention
implementation exactly as they were.
"""

from __future__ import annotations

import inspect
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from speedlight.candidates import SPEEDLIGHT
from speedlight.patching import experts, forwards, installs, planned
from speedlight.patching.families import FAMILIES, Family

_RECORD = "_speedlight_patch"


class PatchWarning(UserWarning):
    """Something asked for was not patched; the message lists what was and was not."""


@dataclass
class PatchReport:
    model_type: str
    patched: dict[str, list[str]] = field(default_factory=dict)  # kind -> module paths
    in_place: list[str] = field(default_factory=list)  # norms whose backward writes over dy
    not_patched: list[tuple[str, str]] = field(default_factory=list)  # (what, why)
    plan_note: str = ""  # which measured plan decided the kinds (planned.resolve_plan)
    plan: dict[str, str] = field(default_factory=dict)  # kind -> kept / dropped / unmeasured
    # kind -> the plan's candidates (plans.CANDIDATE_FIELDS), where the plan recorded them
    candidates: dict[str, list] = field(default_factory=dict)

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
        if self.plan_note:
            lines.append(f"  plan: {self.plan_note}")
        lines += [f"    {kind}: {status}" for kind, status in self.plan.items()]
        return "\n".join(lines)


def kinds() -> tuple[str, ...]:
    """What patch swaps, in the registry's order: the `patches` of the built-in OpSpecs
    (mlp covers swiglu and geglu)."""
    from speedlight import registry
    return tuple(dict.fromkeys(s.patches for s in registry.builtin_specs() if s.patches))


def _available(op: str) -> bool:
    """Whether op is a built-in op of this install."""
    from speedlight import registry
    return op in registry.BUILTIN_OPS


_WRAPPED = "its forward is already wrapped (e.g. by accelerate hooks); speedlight leaves it alone"


@dataclass
class _Patching:
    """One apply_kinds() call: the model, its family and options, the report, and what unpatch
    restores (record)."""

    model: torch.nn.Module
    family: Family
    report: PatchReport
    mlp: bool | str
    norm_in_place: bool
    record: dict = field(default_factory=lambda: {"forwards": [], "loss": None,
                                                  "attention": None, "experts": []})
    choice: dict[str, str] = field(default_factory=dict)  # kind -> candidate (installs.py)

    def add(self, kind: str, what: str) -> None:
        self.report.patched.setdefault(kind, []).append(what)

    def refuse(self, what: str, why: str) -> None:
        self.report.not_patched.append((what, why))

    def modules(self, class_name: str | None) -> list[tuple[str, torch.nn.Module]]:
        """The model's modules of that class whose forward speedlight may replace; those
        already wrapped are reported and left alone."""
        found = []
        for path, module in self.model.named_modules():
            if class_name is None or type(module).__name__ != class_name:
                continue
            if "forward" in module.__dict__:
                self.refuse(path, _WRAPPED)
            else:
                found.append((path, module))
        return found

    def set_forward(self, module: torch.nn.Module, fn) -> None:
        """Bind fn as the instance's forward, with the signature of the one it replaces
        (unless fn declares its own)."""
        had = module.__dict__.get("forward")
        if "__signature__" not in getattr(fn, "__dict__", {}):
            fn.__signature__ = inspect.signature(type(module).forward)
        self.record["forwards"].append((module, had))
        module.forward = types.MethodType(fn, module)

    def note_once(self, what: str, then: str = "") -> Callable[[torch.nn.Module, str], None]:
        """A function recording (what, reason + then) in the report once, for a fallback
        that a forward takes at call time (then: what runs instead)."""
        def note(_module, reason: str) -> None:
            if (what, reason + then) not in self.report.not_patched:
                self.report.not_patched.append((what, reason + then))
        return note

    def none_found(self, kind: str) -> None:
        if kind not in self.report.patched and not any(
                w.startswith(kind) or w == kind for w, _ in self.report.not_patched):
            self.refuse(kind, f"no {kind} module of the {self.family.model_type} family found")


# --- the kinds -----------------------------------------------------------------------------

def _patch_norms(job: _Patching) -> None:
    family = job.family
    for path, module in job.modules(family.norm_class):
        eps_attr = "variance_epsilon" if hasattr(module, "variance_epsilon") else "eps"
        in_place = job.norm_in_place and path.rsplit(".", 1)[-1] in family.in_place_norms
        job.set_forward(module, forwards.norm_forward(family.norm_offset, family.norm_out,
                                                      eps_attr, in_place))
        job.add("rms_norm", path)
        if in_place:
            job.report.in_place.append(path)
    job.none_found("rms_norm")


def _gated_unit(job: _Patching, path: str, module) -> tuple[str, dict] | None:
    """The speedlight op (and its arguments) for an MLP's or experts' activation, or None
    with the reason in the report: no kernel for the activation, or none in this install."""
    act = forwards.activation_of(module)
    if act is None:
        job.refuse(f"mlp {path}", f"activation {type(getattr(module, 'act_fn', None)).__name__} "
                                  "has no speedlight kernel")
        return None
    if not _available(act[0]):
        job.refuse(f"mlp {path}", f"this install has no speedlight.{act[0]}")
        return None
    return act


def _fused_problem(module) -> str | None:
    """Why an MLP cannot run as one gated_matmul, or None."""
    if forwards.has_bias(module):
        return "its projections have biases, which gated_matmul does not add"
    if forwards.has_multipliers(module):
        return "it has mlp multipliers (Falcon-H1), which gated_matmul does not apply"
    for name in ("gate_up_proj", "gate_proj", "up_proj"):
        projection = getattr(module, name, None)
        problem = None if projection is None else forwards.direct_weight_problem(projection)
        if problem is not None:
            return f"{name}: {problem}"
    if not _available("gated_matmul"):
        return "this install has no speedlight.gated_matmul"
    return None


def _patch_mlps(job: _Patching) -> None:
    family = job.family
    for path, module in job.modules(family.mlp_class):
        act = _gated_unit(job, path, module)
        if act is None:
            continue
        unit = (forwards.fused_mlp_forward if family.mlp == "fused"
                else forwards.split_mlp_forward)(*act)
        problem = _fused_problem(module) if job.mlp == "fused" else None
        if job.mlp == "fused" and problem is None:
            job.set_forward(module, forwards.gated_matmul_forward(
                *act, fallback=unit, note_fallback=job.note_once(f"mlp {path} (fused)",
                                                                 "; the gated unit alone runs")))
            job.add("mlp", f"{path} (gated_matmul)")
            continue
        if problem is not None:
            job.refuse(f"mlp {path} (fused)", f"{problem}; the gated unit alone is patched")
        job.set_forward(module, unit)
        job.add("mlp", f"{path} ({act[0]})")
    for name in family.experts_classes:
        for path, module in job.modules(name):
            _patch_experts(job, path, module)
    if family.experts_classes:
        job.record["experts"] = experts.switch_configs(job.model, family.experts_classes)
    job.none_found("mlp")


def _patch_experts(job: _Patching, path: str, module) -> None:
    """A mixture of experts' <Prefix>Experts: every expert through one moe_experts call,
    in the family's layout (experts.py)."""
    layout, activation, unit = job.family.experts, "clamped_swiglu", "clamped_swiglu"
    if layout == "standard":
        act = _gated_unit(job, path, module)
        if act is None:
            return
        activation, unit = experts.moe_activation(*act), act[0]
    problem = None
    if not _available("moe_experts"):
        problem = "this install has no speedlight.moe_experts"
    elif activation is None:
        problem = f"speedlight.moe_experts has no gate unit for {act[0]} {act[1]}"
    if problem is None:
        problem = experts.experts_layout_problem(module, layout)
    if problem is not None:
        job.refuse(f"mlp {path}", problem)
        return
    if job.mlp == "fused":
        job.refuse(f"mlp {path} (fused)", "gated_matmul reads one weight pair, not 3-D expert "
                                          "weights; the gated unit alone is patched")
    forward = experts.forward_for(module, layout, activation)
    way = "registry" if experts.register(module, forward) else "module"
    if way == "module":
        job.set_forward(module, forward)
    job.add("mlp", f"{path} ({unit} by moe_experts, {way}: {module.gate_up_proj.shape[0]} "
                   "experts)")


def _patch_rope(job: _Patching) -> None:
    from speedlight.patching import rotary
    from speedlight.patching.recompile import SourceError

    if not _available("rope"):
        job.refuse("rope", "this install has no speedlight.rope")
        return
    for path, module in job.modules(job.family.attention_class):
        if rotary.NAME not in inspect.unwrap(type(module).forward).__code__.co_names:
            job.refuse(f"rope {path}", f"its forward does not call {rotary.NAME}")
            continue
        try:
            forward = rotary.forward_with_rope(type(module), job.family)
        except SourceError as e:
            job.refuse(f"rope {path}", str(e))
            continue
        job.set_forward(module, forward)
        job.add("rope", path)
    job.none_found("rope")


def _patch_decoder_layers(job: _Patching) -> None:
    """Each decoder layer's residual add and the following norm as one add_rms_norm (see
    decoder_layer.py); a layer whose forward differs from the family's form is kept, with
    the reason."""
    from speedlight.patching import decoder_layer as dl

    kind, family = "decoder_layer", job.family
    if not _available("add_rms_norm"):
        return job.refuse(kind, "this install has no speedlight.add_rms_norm")
    if family.layer_form is None:
        return job.refuse(kind, f"{family.model_type}: {family.layer_note}")
    layers = dl.layer_modules(job.model, family)
    if not layers:
        return job.refuse(kind, f"no decoder layer of the {family.model_type} family found")
    ours = {id(m) for m, _ in job.record["forwards"]}
    for path, layer in layers:
        if "forward" in layer.__dict__:
            job.refuse(f"{kind} {path}", _WRAPPED)
            continue
        try:
            forward, attr, add_norm = dl.fused_forward(layer, family, in_place=job.norm_in_place)
        except dl.LayerFormError as e:
            job.refuse(f"{kind} {path}", f"{type(layer).__name__} of the installed transformers "
                                         f"is not of the {family.layer_form} form: {e}; the "
                                         "layer is kept as it is")
            continue
        norm = getattr(layer, attr)
        if "forward" in norm.__dict__ and id(norm) not in ours:
            job.refuse(f"{kind} {path}", f"self.{attr}'s forward is already wrapped (e.g. by "
                                         "accelerate hooks); fusing would skip it")
            continue
        job.set_forward(layer, forward)
        job.add(kind, f"{path} ({family.layer_form}: residual add + {attr})")
        norm_path = f"{path}.{attr}"
        if add_norm.in_place and norm_path not in job.report.in_place:
            job.report.in_place.append(norm_path)


def _patch_loss_function(job: _Patching, loss=None, label: str = "") -> None:
    """The model's loss_function -> causal_lm_loss (speedlight.cross_entropy), or `loss`
    (another candidate's, installs.py) labelled in the report."""
    from speedlight.patching.causal_lm import causal_lm_loss

    model = job.model
    if loss is None and not _available("cross_entropy"):
        return job.refuse("cross_entropy", "this install has no speedlight.cross_entropy")
    if not hasattr(type(model), "loss_function"):
        return job.refuse("cross_entropy", f"{type(model).__name__} computes no loss (not a "
                                           "*ForCausalLM model)")
    if loss is None:
        forwards.op("cross_entropy")  # imported now, not inside a traced call
    # transformers' loss_function setter keeps an instance's own function in _loss_function
    had = model.__dict__.get("_loss_function")
    job.record["loss"] = ("had", had) if "_loss_function" in model.__dict__ else ("none", None)
    model.loss_function = loss or causal_lm_loss
    job.add("cross_entropy", f"loss_function ({label})" if label else "loss_function")


def _patch_attention(job: _Patching, implementation: str | None = None) -> None:
    """Point the model's config at the "speedlight" attention implementation, and let every
    attention layer find the report its fallbacks are written to; or at `implementation`,
    another candidate's (installs.attention_implementation)."""
    from speedlight.patching import hf_attention

    kind, model = "attention", job.model
    if implementation is None and not _available(kind):
        return job.refuse(kind, "this install has no speedlight.attention")
    if not hasattr(model.config, "_attn_implementation_internal"):
        return job.refuse(kind, "this transformers version has no attention-function registry "
                                "(config._attn_implementation)")
    layers = [(path, m) for path, m in model.named_modules()
              if type(m).__name__ == job.family.attention_class]
    if not layers:
        return job.refuse(kind, f"no attention module of the {job.family.model_type} family "
                                "found")
    if implementation is None:
        hf_attention.register_attention()
    # the configs the attention layers (and their model's mask builder) read: the model's
    # own, or a sub-config (Qwen2-VL's text_config); set there alone, so that a vision
    # tower's attention, which reads another sub-config, keeps its implementation
    configs = {id(c): c for c in (getattr(m, "config", None) or model.config for _, m in layers)}
    job.record["attention"] = ([(c, c._attn_implementation_internal) for c in configs.values()],
                               [m for _, m in layers])
    for c in configs.values():
        c._attn_implementation_internal = implementation or hf_attention.NAME
    if implementation is None:
        for _, m in layers:
            setattr(m, hf_attention.REPORT_ATTR, job.report)
    job.report.patched[kind] = [path if implementation is None else f"{path} ({implementation})"
                                for path, _ in layers]


def _patch_causal_lm_forward(job: _Patching, fn=None, label: str = "") -> None:
    """The causal LM's forward training without logits on speedlight.linear_cross_entropy,
    or on `fn` (another candidate's fused loss, installs.py) labelled in the report."""
    from speedlight.patching import causal_lm

    kind, model = "linear_cross_entropy", job.model
    lm_head = getattr(model, "lm_head", None)
    if not (hasattr(type(model), "loss_function") and isinstance(lm_head, torch.nn.Module)
            and isinstance(getattr(model, "model", None), torch.nn.Module)):
        return job.refuse(kind, f"{type(model).__name__} is not a causal LM with an lm_head "
                                "over its base model")
    if fn is None and not _available(kind):
        return job.refuse(kind, "this install has no speedlight.linear_cross_entropy")
    problem = forwards.direct_weight_problem(lm_head)
    if problem is not None:
        return job.refuse(kind, f"lm_head: {problem}; the loss is computed from the logits")
    previous = model.__dict__.get("forward") or model.forward
    try:
        forward = causal_lm.causal_lm_forward(model, previous, job.note_once(kind))
    except ValueError as e:
        return job.refuse(kind, str(e))
    job.set_forward(model, forward)
    job.set_forward(lm_head, causal_lm.lm_head_forward(lm_head.__dict__.get("forward")
                                                       or lm_head.forward, fn))
    job.report.patched[kind] = [f"forward{f' ({label})' if label else ''} (training with "
                                "labels: the loss without logits; the output's logits are "
                                "None)"]


def _install(job: _Patching, kind: str, name: str) -> None:
    """Candidate `name` (not speedlight's default kernel) for `kind`, by the kind's own
    mechanism (installs.py)."""
    if kind == "rms_norm":
        installs._rms_norm(job, name)
    elif kind == "mlp":
        installs._mlp(job, name)
    elif kind == "rope":
        installs._rope(job, name)
    elif kind == "cross_entropy":
        loss = installs._cross_entropy(job, name)
        if loss is not None:
            _patch_loss_function(job, loss, name)
    elif kind == "linear_cross_entropy":
        fn = installs._fused_loss(job, name)
        if fn is not None:
            _patch_causal_lm_forward(job, fn, name)
    elif kind == "attention":
        implementation = installs.attention_implementation(job, name)
        if implementation is not None:
            _patch_attention(job, implementation)
    else:
        job.refuse(f"{kind} ({name})", "only speedlight fuses the residual add into the norm "
                                       "(speedlight.add_rms_norm)")


@dataclass(frozen=True)
class Kind:
    """One kind of swap: apply_kinds()'s keyword of that name turns it on; apply patches every
    module of the kind in the model, writing what it did and did not to the report."""

    name: str
    apply: Callable[[_Patching], None]


# In the order they are applied: the decoder-layer fusion reads the norms' patched forwards;
# the fused loss's forward wraps the model's forward after the loss function is set.
KINDS = (Kind("rms_norm", _patch_norms), Kind("mlp", _patch_mlps), Kind("rope", _patch_rope),
         Kind("decoder_layer", _patch_decoder_layers),
         Kind("cross_entropy", _patch_loss_function), Kind("attention", _patch_attention),
         Kind("linear_cross_entropy", _patch_causal_lm_forward))


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model speedlight patches: a PEFT wrapper's base model (its adapters stay in
    their layers, which the patch calls as they are), else the model itself."""
    if type(model).__module__.startswith("peft.") and callable(getattr(model, "get_base_model",
                                                                      None)):
        return model.get_base_model()
    return model


def apply_kinds(model: torch.nn.Module, *, rms_norm: bool = True, mlp: bool | str = True,
          rope: bool = True, cross_entropy: bool = True, attention: bool = True,
          norm_in_place: bool = True, linear_cross_entropy: bool = True,
          decoder_layer: bool = True, plan="auto") -> PatchReport:
    """Swap speedlight ops into `model` (a family of speedlight.patching.families.FAMILIES:
    Llama, Mistral, Ministral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, Phi-3, Falcon-H1,
    Granite, OLMo 2, GLM-4, SmolLM3, Qwen2-VL's text decoder, Mixtral, Qwen2-MoE,
    Qwen3-MoE, GraniteMoE, gpt-oss, DeepSeek-V3), or into the base model of a PEFT wrapper
    of one. A family may keep a kind as the model has it (Family.kept: gpt-oss's attention
    with sinks, DeepSeek-V3's latent attention and RoPE), reported by name.

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
    then the module's own down_proj (MLPs with biases, multipliers, or adapter or
    quantized projections keep the unfused path, reported); False leaves the MLPs alone.

    Each kind's keyword also takes a candidate's name (speedlight.candidates: "liger",
    "torch-fused", "torch-compile", "sdpa-cudnn", "flex-attention", "torch-grouped-mm",
    "speedlight-cuda"..., or "model" for none): that implementation is put in by the same
    mechanism (installs.py), where it can express the model's variant, else the module keeps
    its own and the report says why.

    plan: "auto", a plan file's path, a plan, or None: which kinds a measurement lets apply
    (see planned.py; the report says per kind: kept, dropped, or applied unmeasured).

    Returns a PatchReport listing what was patched; anything asked for that could not be
    patched (an unknown architecture, an unsupported activation) is also warned about
    with a PatchWarning, never skipped silently. `unpatch(model)` undoes it exactly.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    keywords = locals()
    asked = {kind.name: keywords[kind.name] for kind in KINDS}  # each kind's keyword
    for kind, value in asked.items():
        installs.chosen(kind, value)  # ValueError naming the kind before anything is done
    model = base_model(model)
    if hasattr(model, _RECORD):
        raise ValueError("model is already patched by speedlight; call speedlight.unpatch(model) first")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None) or type(model).__name__
    family: Family | None = FAMILIES.get(model_type)
    chosen, note = planned.resolve_plan(model, plan)
    report = PatchReport(model_type, plan_note=note, plan=planned.statuses(asked, chosen),
                         candidates={k: d.candidates for k, d in chosen.decisions.items()
                                     if d.candidates} if chosen is not None else {})
    wanted = planned.wanted(asked, chosen)
    if note.startswith(planned.plans.HINT):
        warnings.warn(note, planned.plans.PlanHint, stacklevel=2)
    job = _Patching(model, family, report, mlp if mlp in (True, "fused") else True, norm_in_place)
    for kind in KINDS:
        choice = installs.chosen(kind.name, wanted[kind.name])
        if choice is None:
            continue
        job.choice[kind.name] = choice
        if family is None:
            job.refuse(kind.name, f"unknown architecture {model_type!r}; speedlight patches "
                                  f"{', '.join(sorted(FAMILIES))}")
        elif kind.name in dict(family.kept):
            job.refuse(kind.name, f"kept for {model_type}: {dict(family.kept)[kind.name]}")
        elif choice == SPEEDLIGHT:
            kind.apply(job)
        else:
            _install(job, kind.name, choice)
    setattr(model, _RECORD, job.record)
    if report.not_patched:
        warnings.warn(str(report), PatchWarning, stacklevel=2)
    return report


def unpatch(model: torch.nn.Module) -> None:
    """Restore every module and the loss exactly as they were before speedlight.patch."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    model = base_model(model)
    record = model.__dict__.get(_RECORD)
    if record is None:
        raise ValueError("model is not patched by speedlight")
    for module, had in reversed(record["forwards"]):
        if had is None:
            module.__dict__.pop("forward", None)
        else:
            module.forward = had
    experts.restore_configs(model, record["experts"])
    if record["attention"] is not None:
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
