"""Real model configurations, and the case suites built from them.

Suites:
  quick  small shapes the Triton interpreter runs in seconds on a CPU, odd sizes included;
  model  the hidden sizes and vocabularies of the models below at 1, 512, 4096 and 16384
         tokens (decode, short prefill, training micro-batch, long context);
  full   model plus odd shapes: size 1, primes, non-powers of two, rows longer than one
         block and longer than 65536.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

SUITES = ("quick", "model", "full")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    hf_model_type: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    norm: str  # "rms" or "layer"
    norm_eps: float
    mlp: str  # "swiglu", "geglu" (gelu-tanh gate) or "gelu" (not gated)
    rotary_dim: int  # 0 when positions are learned embeddings
    source: str
    norm_offset: float = 0.0  # Gemma scales by (1 + w)
    rope_interleaved: bool = False  # GPT-J pairs (0,1),(2,3)...; Llama/NeoX rotate halves
    logit_softcap: float | None = None
    attn_softcap: float | None = None  # attn_logit_softcapping (Gemma 2)
    sliding_window: int | None = None  # keys a query sees on its sliding-window layers
    # a mixture of experts: routed experts per layer, experts each token picks, and the
    # width of a shared expert (Qwen2-MoE) if any; intermediate is one expert's width
    experts: int = 0
    experts_per_token: int = 0
    shared_intermediate: int = 0


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


MODELS: dict[str, ModelConfig] = {m.name: m for m in [
    ModelConfig("llama-3-8b", "llama", 4096, 14336, 32, 8, 128, 128256, "rms", 1e-5, "swiglu",
                128, _hf("meta-llama/Meta-Llama-3-8B")),
    ModelConfig("llama-3-70b", "llama", 8192, 28672, 64, 8, 128, 128256, "rms", 1e-5, "swiglu",
                128, _hf("meta-llama/Meta-Llama-3-70B")),
    ModelConfig("mistral-7b", "mistral", 4096, 14336, 32, 8, 128, 32000, "rms", 1e-5, "swiglu",
                128, _hf("mistralai/Mistral-7B-v0.1"), sliding_window=4096),
    ModelConfig("qwen2.5-7b", "qwen2", 3584, 18944, 28, 4, 128, 152064, "rms", 1e-6, "swiglu",
                128, _hf("Qwen/Qwen2.5-7B")),
    ModelConfig("qwen3-8b", "qwen3", 4096, 12288, 32, 8, 128, 151936, "rms", 1e-6, "swiglu",
                128, _hf("Qwen/Qwen3-8B")),
    ModelConfig("gemma-2-9b", "gemma2", 3584, 14336, 16, 8, 256, 256000, "rms", 1e-6, "geglu",
                256, _hf("google/gemma-2-9b"), norm_offset=1.0, logit_softcap=30.0,
                attn_softcap=50.0, sliding_window=4096),
    ModelConfig("gemma-3-1b", "gemma3_text", 1152, 6912, 4, 1, 256, 262144, "rms", 1e-6, "geglu",
                256, _hf("google/gemma-3-1b-pt"), norm_offset=1.0,
                sliding_window=512),
    ModelConfig("phi-3-mini", "phi3", 3072, 8192, 32, 32, 96, 32064, "rms", 1e-5, "swiglu",
                96, _hf("microsoft/Phi-3-mini-4k-instruct")),
    ModelConfig("granite-3.1-8b", "granite", 4096, 12800, 32, 8, 128, 49155, "rms", 1e-5,
                "swiglu", 128, _hf("ibm-granite/granite-3.1-8b-base")),
    ModelConfig("olmo-2-7b", "olmo2", 4096, 11008, 32, 32, 128, 100352, "rms", 1e-6, "swiglu",
                128, _hf("allenai/OLMo-2-1124-7B")),
    # GLM-4 rotates half of each head, in interleaved pairs
    ModelConfig("glm-4-9b", "glm4", 4096, 13696, 32, 2, 128, 151552, "rms", 1e-5, "swiglu",
                64, _hf("THUDM/GLM-4-9B-0414"), rope_interleaved=True),
    ModelConfig("smollm3-3b", "smollm3", 2048, 11008, 16, 4, 128, 128256, "rms", 1e-6, "swiglu",
                128, _hf("HuggingFaceTB/SmolLM3-3B")),
    ModelConfig("ministral-8b", "ministral", 4096, 12288, 32, 8, 128, 131072, "rms", 1e-5,
                "swiglu", 128, _hf("mistralai/Ministral-8B-Instruct-2410"),
                sliding_window=32768),
    # the text decoder of the image-text model (its text_config)
    ModelConfig("qwen2-vl-7b", "qwen2_vl", 3584, 18944, 28, 4, 128, 152064, "rms", 1e-6,
                "swiglu", 128, _hf("Qwen/Qwen2-VL-7B-Instruct")),
    # mixtures of experts: intermediate is one expert's width (moe_intermediate_size where
    # the config has one), the width each routed token's gated unit runs at
    ModelConfig("mixtral-8x7b", "mixtral", 4096, 14336, 32, 8, 128, 32000, "rms", 1e-5, "swiglu",
                128, _hf("mistralai/Mixtral-8x7B-v0.1"), experts=8, experts_per_token=2),
    ModelConfig("qwen1.5-moe-a2.7b", "qwen2_moe", 2048, 1408, 16, 16, 128, 151936, "rms", 1e-6,
                "swiglu", 128, _hf("Qwen/Qwen1.5-MoE-A2.7B"), experts=60, experts_per_token=4,
                shared_intermediate=5632),
    ModelConfig("qwen3-30b-a3b", "qwen3_moe", 2048, 768, 32, 4, 128, 151936, "rms", 1e-6,
                "swiglu", 128, _hf("Qwen/Qwen3-30B-A3B"), experts=128, experts_per_token=8),
    ModelConfig("granite-3.0-1b-a400m", "granitemoe", 1024, 512, 16, 8, 64, 49155, "rms", 1e-6,
                "swiglu", 64, _hf("ibm-granite/granite-3.0-1b-a400m-base"), experts=32,
                experts_per_token=8),
    ModelConfig("gpt-j-6b", "gptj", 4096, 16384, 16, 16, 256, 50400, "layer", 1e-5, "gelu",
                64, _hf("EleutherAI/gpt-j-6b"), rope_interleaved=True),
    ModelConfig("gpt-2", "gpt2", 768, 3072, 12, 12, 64, 50257, "layer", 1e-5, "gelu",
                0, _hf("openai-community/gpt2")),
]}

# Decoder layers of each model (num_hidden_layers / n_layer in the same config.json files).
NUM_LAYERS: dict[str, int] = {
    "llama-3-8b": 32, "llama-3-70b": 80, "mistral-7b": 32, "qwen2.5-7b": 28, "qwen3-8b": 36,
    "gemma-2-9b": 42, "gemma-3-1b": 26, "phi-3-mini": 32, "gpt-j-6b": 28, "gpt-2": 12,
    "granite-3.1-8b": 40, "olmo-2-7b": 32, "glm-4-9b": 40, "smollm3-3b": 36,
    "ministral-8b": 36, "qwen2-vl-7b": 28, "mixtral-8x7b": 32, "qwen1.5-moe-a2.7b": 24,
    "qwen3-30b-a3b": 48, "granite-3.0-1b-a400m": 24,
}

MODEL_TOKENS = (1, 512, 4096, 16384)

# quick: (rows, width) pairs a CPU interpreter runs fast, still with odd sizes.
QUICK_ROWS_WIDTHS = ((1, 1), (3, 7), (37, 128), (5, 781), (4, 1000), (2, 4096), (1, 70001))
# full: odd sizes crossed with odd row counts.
ODD_WIDTHS = (1, 2, 3, 17, 127, 509, 1000, 1021, 4093, 6000, 12289, 65537, 100003)
ODD_ROWS = (1, 3, 257, 1031)


def model_values(field: str, models: Iterable[ModelConfig] | None = None) -> list[tuple[int, str]]:
    """Distinct values of a ModelConfig field, each with the first model that has it."""
    seen: dict[int, str] = {}
    for m in models or MODELS.values():
        v = getattr(m, field)
        if v and v not in seen:
            seen[v] = m.name
    return sorted(seen.items())


def distinct_configs(fields: Sequence[str], where: Callable[[ModelConfig], bool] | None = None
                     ) -> list[tuple[tuple, str]]:
    """Distinct tuples of ModelConfig fields (e.g. heads, kv_heads, head_dim), each with the
    first model that has it, in table order; models for which `where` is false are left out."""
    seen: dict[tuple, str] = {}
    for m in MODELS.values():
        if where is None or where(m):
            seen.setdefault(tuple(getattr(m, f) for f in fields), m.name)
    return list(seen.items())


def rows_and_width(suite: str, field: str = "hidden") -> list[tuple[int, int, str | None]]:
    """(rows, width, model) points of a suite for ops over a [tokens, width] tensor, with
    width taken from the ModelConfig field (hidden, intermediate, vocab, ...)."""
    check_suite(suite)
    if suite == "quick":
        return [(r, w, None) for r, w in QUICK_ROWS_WIDTHS]
    points = [(t, w, name) for w, name in model_values(field) for t in MODEL_TOKENS]
    if suite == "full":
        points += [(r, w, None) for w in ODD_WIDTHS for r in ODD_ROWS if r * w <= 2**27]
    return points


def rows_width_variant(suite: str, field: str, variant: Callable[[ModelConfig], object]
                       ) -> list[tuple[int, int, str | None, object]]:
    """rows_and_width's points with each model's `variant` (e.g. its norm offset): the
    model points are every distinct (width, variant) pair, so a width two models share is
    kept once per variant (Gemma 2's hidden size with its (1 + w) norm as well as Qwen's
    without). Other points carry variant None."""
    check_suite(suite)
    points = [(r, w, m, None) for r, w, m in rows_and_width(suite, field) if m is None]
    if suite == "quick":
        return points
    seen: dict[tuple[int, object], str] = {}
    for m in MODELS.values():
        key = (getattr(m, field), variant(m))
        if key[0] and key not in seen:
            seen[key] = m.name
    model_points = [(t, w, name, v) for (w, v), name in
                    sorted(seen.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
                    for t in MODEL_TOKENS]
    return model_points + points


def check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {suite!r}")


def suites(build: Callable[[str], Sequence]) -> dict[str, Callable[[], list]]:
    """The suites mapping of an OpSpec from one builder taking the suite name."""
    return {name: (lambda name=name: list(build(name))) for name in SUITES}


_GEGLU_ACTS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu", "gelu_python")


def from_hf_config(config, name: str | None = None) -> ModelConfig:
    """The ModelConfig of a Hugging Face causal-LM config (LlamaConfig, Gemma2Config, ...),
    so the suites and a model's own shapes speak the same vocabulary."""
    model_type = getattr(config, "model_type", None) or "unknown"
    if hasattr(config, "get_text_config"):  # Qwen2-VL: the text decoder's own config
        config = config.get_text_config()
    get = lambda *keys, default=None: next(  # noqa: E731
        (getattr(config, k) for k in keys if getattr(config, k, None) is not None), default)
    hidden = get("hidden_size", "n_embd")
    heads = get("num_attention_heads", "n_head")
    head_dim = get("head_dim", default=hidden // heads)
    act = str(get("hidden_activation", "hidden_act", "activation_function", default="silu"))
    gated = model_type not in ("gpt2", "gptj")
    mlp = ("geglu" if act in _GEGLU_ACTS else "swiglu") if gated else "gelu"
    rotary = get("rotary_dim")
    if rotary is None and model_type != "gpt2":
        rope = getattr(config, "rope_parameters", None)  # 5.x keeps the factor there (GLM-4)
        factor = get("partial_rotary_factor") or (
            rope.get("partial_rotary_factor") if isinstance(rope, dict) else None) or 1.0
        rotary = int(head_dim * float(factor))
    return ModelConfig(
        name=name or model_type, hf_model_type=model_type, hidden=hidden,
        intermediate=get("moe_intermediate_size", "intermediate_size", "n_inner",
                         default=4 * hidden),
        heads=heads, kv_heads=get("num_key_value_heads", default=heads), head_dim=head_dim,
        vocab=get("vocab_size"), norm="layer" if not gated else "rms",
        norm_eps=float(get("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=1e-6)),
        mlp=mlp, rotary_dim=rotary or 0, source="Hugging Face config",
        norm_offset=1.0 if model_type.startswith("gemma") else 0.0,
        rope_interleaved=model_type in ("gptj", "glm4"),
        logit_softcap=get("final_logit_softcapping"),
        attn_softcap=get("attn_logit_softcapping"), sliding_window=get("sliding_window"),
        experts=get("num_local_experts", "num_experts", default=0),
        experts_per_token=get("num_experts_per_tok", default=0) if get(
            "num_local_experts", "num_experts") else 0,
        shared_intermediate=get("shared_expert_intermediate_size", default=0))
