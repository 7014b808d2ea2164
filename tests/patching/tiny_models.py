"""Tiny random-weight models of every family speedlight patches, built from configs in
code (no download), small enough for the CPU interpreter."""

from __future__ import annotations

import torch

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              tie_word_embeddings=False)
# the newer families' defaults name special tokens past the tiny vocabulary
NO_TOKENS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)


def config(model_type: str):
    import transformers as tf
    if model_type == "llama":
        return tf.LlamaConfig(**COMMON, head_dim=16)
    if model_type == "mistral":
        return tf.MistralConfig(**COMMON, head_dim=16, sliding_window=None)
    if model_type == "qwen2":
        return tf.Qwen2Config(**COMMON)
    if model_type == "qwen3":
        return tf.Qwen3Config(**COMMON, head_dim=16)
    if model_type == "gemma":
        return tf.GemmaConfig(**COMMON, head_dim=16, hidden_act="gelu_pytorch_tanh")
    if model_type == "gemma2":
        return tf.Gemma2Config(**COMMON, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                               query_pre_attn_scalar=16, sliding_window=8,
                               final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    if model_type == "phi3":
        return tf.Phi3Config(**{**COMMON, "num_key_value_heads": 4}, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2,
                             partial_rotary_factor=0.5)
    if model_type == "granite":
        return tf.GraniteConfig(**COMMON, logits_scaling=4.0, residual_multiplier=0.5,
                                embedding_multiplier=2.0, attention_multiplier=0.2)
    if model_type == "falcon_h1":  # hybrid: attention and a small Mamba-2 mixer per layer
        return tf.FalconH1Config(**COMMON, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
                                 mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
                                 mamba_chunk_size=8, mlp_multipliers=[0.75, 2.5],
                                 lm_head_multiplier=0.5)
    new = dict(COMMON, **NO_TOKENS)
    if model_type == "gemma3_text":  # one sliding-window layer, one global
        return tf.Gemma3TextConfig(**new, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                                   query_pre_attn_scalar=16, sliding_window=8,
                                   layer_types=["sliding_attention", "full_attention"],
                                   final_logit_softcapping=30.0)
    if model_type == "olmo2":
        return tf.Olmo2Config(**new)
    if model_type == "glm4":  # interleaved RoPE over half of each head
        return tf.Glm4Config(**new, head_dim=16, partial_rotary_factor=0.5)
    if model_type == "smollm3":  # the second layer skips RoPE
        return tf.SmolLM3Config(**new, no_rope_layers=[1, 0])
    if model_type == "ministral":
        return tf.MinistralConfig(**new, head_dim=16, sliding_window=8,
                                  layer_types=["sliding_attention", "full_attention"])
    if model_type == "qwen2_vl":  # text decoder with multimodal RoPE, one tiny vision block
        text = dict(new, model_type="qwen2_vl_text",
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         mrope_section=[2, 3, 3]))
        return tf.Qwen2VLConfig(text_config=text, vision_config=dict(
            depth=1, embed_dim=32, num_heads=2, hidden_size=64, patch_size=2,
            spatial_merge_size=1, temporal_patch_size=1))
    moe = dict(new, intermediate_size=48)
    if model_type == "mixtral":
        return tf.MixtralConfig(**moe, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                sliding_window=None)
    if model_type == "qwen2_moe":  # with its sigmoid-gated shared expert
        return tf.Qwen2MoeConfig(**moe, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=48, shared_expert_intermediate_size=64)
    if model_type == "qwen3_moe":  # the second layer dense (mlp_only_layers)
        return tf.Qwen3MoeConfig(**moe, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=48, mlp_only_layers=[1])
    if model_type == "granitemoe":
        return tf.GraniteMoeConfig(**moe, num_local_experts=4, num_experts_per_tok=2,
                                   logits_scaling=4.0, residual_multiplier=0.5,
                                   embedding_multiplier=2.0, attention_multiplier=0.2)
    if model_type == "gpt_oss":  # sinks, one sliding layer, biases, clamped SwiGLU experts
        return tf.GptOssConfig(**moe, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                               sliding_window=8, router_aux_loss_coef=0.02,
                               layer_types=["sliding_attention", "full_attention"],
                               rope_parameters=dict(rope_type="default", rope_theta=10000.0))
    if model_type == "deepseek_v3":  # one dense layer, then 8 routed experts in 2 groups
        return tf.DeepseekV3Config(**{**moe, "num_key_value_heads": 4}, moe_intermediate_size=48,
                                   n_routed_experts=8, n_group=2, topk_group=1,
                                   num_experts_per_tok=2, n_shared_experts=1,
                                   first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                                   qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12)
    raise KeyError(model_type)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "falcon_h1", "granite"]
# added with the mixture-of-experts support; each adds ~1-2 s of CPU interpreter time
NEW_FAMILIES = ["gemma3_text", "olmo2", "glm4", "smollm3", "ministral", "qwen2_vl", "mixtral",
                "qwen2_moe", "qwen3_moe", "granitemoe"]
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "granitemoe")
# the families whose experts have a layout of their own or whose attention is kept
# (gpt-oss: transposed, interleaved, biased experts, attention with sinks; DeepSeek-V3:
# latent attention, group-limited router): in the signature, autocast and trace tests, the
# float64 model check in tests/patching/test_experts.py
KEEPING_FAMILIES = ["gpt_oss", "deepseek_v3"]


def build(model_type: str, seed: int = 0, dtype=torch.float32, **overrides):
    """The tiny model of model_type, its (text) config's fields set from overrides first
    (e.g. a sliding window for Mistral)."""
    import transformers as tf
    torch.manual_seed(seed)
    cfg = config(model_type)
    for name, value in overrides.items():
        setattr(cfg.get_text_config(), name, value)
    cfg._attn_implementation = "eager"
    if model_type == "qwen2_vl":  # no causal-LM auto class: the image-text model, run on text
        model = tf.Qwen2VLForConditionalGeneration(cfg).to(dtype)
    else:
        model = tf.AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Gemma norms start at w = 0 (scale 1); move them off it so the offset form is tested
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def assert_same_gradients(model, got, expected, tol: dict, where: str = "") -> None:
    """got and expected (gradients of model's parameters, in order) are None for the same
    parameters and close within tol for the others; a mismatch names its parameter."""
    for (name, _), g, e in zip(model.named_parameters(), got, expected):
        assert (g is None) == (e is None), f"{where}{name}"
        if e is not None:
            torch.testing.assert_close(g, e, **tol, msg=lambda m: f"{where}{name}: {m}")


def assert_same_step(model, got, expected, tol: dict) -> None:
    """got and expected, each the (logits, loss, gradients) of a training step of model or
    a copy of it, are close within tol."""
    torch.testing.assert_close(got[0], expected[0], **tol)
    torch.testing.assert_close(got[1], expected[1], **tol)
    assert_same_gradients(model, got[2], expected[2], tol)


def vocab(model) -> int:
    """The vocabulary of a causal LM (Qwen2-VL's sits in its text config)."""
    return model.config.get_text_config().vocab_size


def batch(vocab: int, batch: int = 2, seq: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # some ignored targets
    return ids, labels
