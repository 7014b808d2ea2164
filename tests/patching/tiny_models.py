"""Tiny random-weight models of every family speedlight patches, built from configs in
code (no download), small enough for the CPU interpreter."""

from __future__ import annotations

import torch

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              tie_word_embeddings=False)


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
    raise KeyError(model_type)


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "falcon_h1", "granite"]


def build(model_type: str, seed: int = 0, dtype=torch.float32):
    import transformers as tf
    torch.manual_seed(seed)
    cfg = config(model_type)
    cfg._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(cfg).to(dtype)
    # Gemma norms start at w = 0 (scale 1); move them off it so the offset form is tested
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def batch(vocab: int, batch: int = 2, seq: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # some ignored targets
    return ids, labels
