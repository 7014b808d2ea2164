"""What speedlight knows about each Hugging Face model family it patches.

A family is found by `model.config.model_type`; each entry names the classes whose
instances speedlight swaps, and the modeling module whose `apply_rotary_pos_emb` the
attention layers call. The names are those of transformers >= 4.52 and 5.x.
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

    @property
    def norm_class(self) -> str:
        return f"{self.prefix}RMSNorm"

    @property
    def mlp_class(self) -> str:
        return f"{self.prefix}MLP"

    @property
    def attention_class(self) -> str:
        return f"{self.prefix}Attention"


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
