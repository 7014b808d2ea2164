"""What speedlight knows about each Hugging Face model family it patches.

A family is found by `model.config.model_type`; each entry names the classes whose
instances speedlight swaps, and the modeling module whose `apply_rotary_pos_emb` the
attention layers call. The names are those of transformers >= 4.52 and 5.x; the
mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, GraniteMoE, gpt-oss,
DeepSeek-V3) need 5.x, whose `<Prefix>Experts` module holds every expert's weights as two
3-D parameters.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str  # class-name prefix: Llama, Mistral, Qwen2, ...
    module: str  # transformers.models.<...>.modeling_<...>
    norm_offset: float = 0.0  # Gemma scales by (1 + w)
    norm_out: str = "promote"  # "promote": weight * x.to(dtype) (Llama); "input": (x*w).type_as(x)
    mlp: str = "split"  # "split": gate_proj/up_proj/down_proj; "fused": gate_up_proj/down_proj
    # The norms (by attribute name) whose output feeds linear layers alone: the gradient
    # they receive is a fresh sum of those layers' input gradients, so their backward may
    # write over it (rms_norm's in_place). Not a post-norm, whose output joins the residual
    # stream (the add hands one gradient to both operands), nor q_norm/k_norm.
    in_place_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm", "norm")
    # the decoder layer's residual/norm form: "pre_norm" (Llama: h = x + attn(norm(x)); then
    # post_attention_layernorm(h)), "sandwich" (Gemma 2/3: post-norms on the branch output,
    # then pre_feedforward_layernorm), or None: kept as it is, for the reason in layer_note
    layer_form: str | None = None
    layer_note: str = ""
    # the MLP's class when it does not follow the prefix (Qwen2-VL's text MLP is Qwen2MLP)
    mlp_name: str | None = None
    # False: the family has no dense gated MLP (gpt-oss's <Prefix>MLP is its expert block)
    dense_mlp: bool = True
    # a mixture of experts: <Prefix>Experts holds every expert's weights, read by
    # speedlight.moe_experts in the layout named here (patching/experts.py): "standard"
    # (transformers 5.x: gate_up_proj [E, 2I, H], gate rows first, down_proj [E, H, I], the
    # module's act_fn) or "gpt_oss" ([E, H, 2I] / [E, I, H], gate and up interleaved,
    # biases, clamped SwiGLU with the module's alpha and limit); None: no experts
    experts: str | None = None
    # earlier names of the <Prefix>Experts class in transformers 5.x (DeepSeek-V3's
    # DeepseekV3NaiveMoe, the same module), patched alike
    experts_aliases: tuple[str, ...] = ()
    # kinds the family keeps as the model has them (kind, why), reported by name
    kept: tuple[tuple[str, str], ...] = ()
    # GLM: apply_rotary_pos_emb rotates pairs (2i, 2i + 1), taking cos/sin's first half
    # repeat-interleaved; False: Llama's halves
    rope_interleaved: bool = False
    # gpt-oss: cos/sin hold one angle per rotated pair (head_dim / 2 wide, halves rotated),
    # not Llama's cat(freqs, freqs)
    rope_half_table: bool = False

    @property
    def norm_class(self) -> str:
        return f"{self.prefix}RMSNorm"

    @property
    def mlp_class(self) -> str | None:
        return (self.mlp_name or f"{self.prefix}MLP") if self.dense_mlp else None

    @property
    def experts_class(self) -> str | None:
        return f"{self.prefix}Experts" if self.experts else None

    @property
    def experts_classes(self) -> tuple[str, ...]:
        """Every name the family's experts class has had (none without experts)."""
        return (self.experts_class, *self.experts_aliases) if self.experts else ()

    @property
    def attention_class(self) -> str:
        return f"{self.prefix}Attention"


_RESIDUAL_SCALED = ("its decoder layer scales each branch by residual_multiplier before the "
                    "add (h = x + m * branch), which add_rms_norm does not")

FAMILIES: dict[str, Family] = {f.model_type: f for f in [
    Family("llama", "Llama", "transformers.models.llama.modeling_llama", layer_form="pre_norm"),
    Family("mistral", "Mistral", "transformers.models.mistral.modeling_mistral",
           layer_form="pre_norm"),
    Family("qwen2", "Qwen2", "transformers.models.qwen2.modeling_qwen2", layer_form="pre_norm"),
    Family("qwen3", "Qwen3", "transformers.models.qwen3.modeling_qwen3", layer_form="pre_norm"),
    Family("gemma", "Gemma", "transformers.models.gemma.modeling_gemma", norm_offset=1.0,
           norm_out="input", layer_form="pre_norm"),
    # post_attention_layernorm and post_feedforward_layernorm are post-norms (their output
    # is added to the residual); pre_feedforward_layernorm feeds the MLP
    Family("gemma2", "Gemma2", "transformers.models.gemma2.modeling_gemma2", norm_offset=1.0,
           norm_out="input", in_place_norms=("input_layernorm", "pre_feedforward_layernorm",
                                             "norm"), layer_form="sandwich"),
    # the attention output passes resid_attn_dropout before the add (kept, as the layer has it)
    Family("phi3", "Phi3", "transformers.models.phi3.modeling_phi3", mlp="fused",
           layer_form="pre_norm"),
    Family("granite", "Granite", "transformers.models.granite.modeling_granite",
           layer_note="its layer scales each branch by residual_multiplier before the residual "
                      "add (residual + branch * m); add_rms_norm adds the branch unscaled, so "
                      "the multiply would stay a separate pass over the activations; the "
                      "layer is kept as it is"),
    # sandwich norms as Gemma 2 (post-norms join the residual stream), q_norm/k_norm per head
    Family("gemma3_text", "Gemma3", "transformers.models.gemma3.modeling_gemma3",
           norm_offset=1.0, norm_out="input",
           in_place_norms=("input_layernorm", "pre_feedforward_layernorm", "norm"),
           layer_form="sandwich"),
    # the text decoder of Qwen2-VL (ForConditionalGeneration: "qwen2_vl"; the bare text model:
    # "qwen2_vl_text"); its vision tower has other classes and stays as it is. The
    # multimodal RoPE sections are merged into ordinary cos/sin before apply_rotary_pos_emb.
    *[Family(t, "Qwen2VL", "transformers.models.qwen2_vl.modeling_qwen2_vl",
             mlp_name="Qwen2MLP", layer_form="pre_norm") for t in ("qwen2_vl", "qwen2_vl_text")],
    # some layers skip RoPE (no_rope_layers): their attention calls no rope
    Family("smollm3", "SmolLM3", "transformers.models.smollm3.modeling_smollm3",
           layer_form="pre_norm"),
    Family("ministral", "Ministral", "transformers.models.ministral.modeling_ministral",
           layer_form="pre_norm"),
    # each branch's output is normalised (post_attention_layernorm, post_feedforward_layernorm)
    # and then added: no pre-norm, so only the final norm runs in place; q_norm and k_norm
    # normalise whole projections (heads * head_dim)
    Family("olmo2", "Olmo2", "transformers.models.olmo2.modeling_olmo2", norm_out="input",
           in_place_norms=("norm",),
           layer_note="its decoder layer normalises each branch's output before the add "
                      "(h = x + norm(attn(x))): the norm follows the branch, not the sum"),
    # GLM-4: gate_up_proj MLP, interleaved partial RoPE, four norms per layer
    # (post_self_attn_layernorm and post_mlp_layernorm are post-norms on the branch outputs).
    # Its layer is of the sandwich form under other names: post_self_attn_layernorm, the
    # add, then post_attention_layernorm (the MLP's pre-norm), which is fused
    Family("glm4", "Glm4", "transformers.models.glm4.modeling_glm4", mlp="fused",
           rope_interleaved=True, layer_form="sandwich"),
    # mixtures of experts: the routed experts through speedlight.moe_experts, routing
    # unchanged; Qwen2-MoE's shared expert is a <Prefix>MLP; Qwen3-MoE has per-head
    # q_norm/k_norm
    Family("mixtral", "Mixtral", "transformers.models.mixtral.modeling_mixtral",
           experts="standard", layer_form="pre_norm"),
    Family("qwen2_moe", "Qwen2Moe", "transformers.models.qwen2_moe.modeling_qwen2_moe",
           experts="standard", layer_form="pre_norm"),
    Family("qwen3_moe", "Qwen3Moe", "transformers.models.qwen3_moe.modeling_qwen3_moe",
           experts="standard", layer_form="pre_norm"),
    Family("granitemoe", "GraniteMoe", "transformers.models.granitemoe.modeling_granitemoe",
           experts="standard", layer_note=_RESIDUAL_SCALED),
    # gpt-oss: its GptOssMLP is the expert block (router + GptOssExperts, no dense MLP);
    # experts in its own layout (see Family.experts); RoPE over halves from a half-width
    # cos/sin table; the norm casts after the weight ("input")
    Family("gpt_oss", "GptOss", "transformers.models.gpt_oss.modeling_gpt_oss",
           norm_out="input", dense_mlp=False, experts="gpt_oss", rope_half_table=True,
           layer_form="pre_norm",
           kept=(("attention", "its attention adds a learned sink logit per head (self.sinks, "
                               "passed as s_aux) to every softmax; speedlight.attention has no "
                               "sinks, so the model's own attention runs"),)),
    # DeepSeek-V3: the first first_k_dense_replace layers have a dense DeepseekV3MLP, the
    # rest DeepseekV3MoE (its group-limited router, the model's; the routed experts in the
    # standard layout; the shared experts a DeepseekV3MLP)
    Family("deepseek_v3", "DeepseekV3", "transformers.models.deepseek_v3.modeling_deepseek_v3",
           experts="standard", experts_aliases=("DeepseekV3NaiveMoe",), layer_form="pre_norm",
           kept=(("attention", "its multi-head latent attention gives k the head dim "
                               "qk_nope_head_dim + qk_rope_head_dim and v v_head_dim (192 and "
                               "128 in DeepSeek-V3); speedlight.attention takes k and v of one "
                               "shape, so the model's own attention runs"),
                 ("rope", "with config.rope_interleave (DeepSeek-V3's default) its attention "
                          "rotates q and k by apply_rotary_pos_emb_interleave: pairs "
                          "(2i, 2i + 1) rotated and written back as halves, a form "
                          "speedlight.rope does not have; the model's own RoPE runs"))),
    # hybrid attention + Mamba-2 layers; its MLP (feed_forward) has mlp_multipliers. The
    # input norm feeds both mixers and stays out of place; the Mamba mixer's own gated norm
    # is another class, left as it is. Its layer is pre-norm: the two mixers' scaled outputs
    # are summed, added to the residual, and pre_ff_layernorm normalizes that sum.
    Family("falcon_h1", "FalconH1", "transformers.models.falcon_h1.modeling_falcon_h1",
           in_place_norms=("pre_ff_layernorm", "final_layernorm"), layer_form="pre_norm"),
]}

# Hugging Face activation classes -> (speedlight op, its keyword arguments)
ACTIVATIONS: dict[str, tuple[str, dict]] = {
    "SiLUActivation": ("swiglu", {}),
    "SiLU": ("swiglu", {}),
    "GELUTanh": ("geglu", {"approximate": "tanh"}),
    "PytorchGELUTanh": ("geglu", {"approximate": "tanh"}),
    "NewGELUActivation": ("geglu", {"approximate": "tanh"}),
    "GELUActivation": ("geglu", {"approximate": "none"}),
    "GELU": ("geglu", {"approximate": "none"}),
}
