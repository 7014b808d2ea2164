import pytest

from speedlight import shapes

REQUIRED = ["llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-7b", "gemma-2-9b",
            "phi-3-mini", "gpt-2"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_models_are_described_with_a_source(name):
    m = shapes.MODELS[name]
    assert m.source.startswith("https://huggingface.co/")
    assert m.hidden > 0 and m.intermediate > m.hidden and m.vocab > 30000
    assert m.heads % m.kv_heads == 0
    assert m.head_dim in (64, 96, 128, 256)


def test_known_configurations():
    m = shapes.MODELS["llama-3-8b"]
    assert (m.hidden, m.intermediate, m.heads, m.kv_heads, m.head_dim, m.vocab) == \
        (4096, 14336, 32, 8, 128, 128256)
    assert shapes.MODELS["gemma-2-9b"].norm_offset == 1.0
    assert shapes.MODELS["gpt-2"].norm == "layer"


def test_quick_suite_is_small_but_odd():
    pts = shapes.rows_and_width("quick")
    widths = {w for _, w, _ in pts}
    assert 1 in widths and any(w % 2 == 1 and w > 100 for w in widths)
    assert any(w > 65536 for w in widths)
    assert all(r * w <= 200_000 for r, w, _ in pts)


def test_model_suite_uses_real_sizes_and_token_counts():
    pts = shapes.rows_and_width("model", "hidden")
    assert {r for r, _, _ in pts} == set(shapes.MODEL_TOKENS)
    assert {4096, 8192, 3584, 3072, 768} <= {w for _, w, _ in pts}
    vocab = {w for _, w, _ in shapes.rows_and_width("model", "vocab")}
    assert {128256, 32000, 152064, 256000, 262144} <= vocab


def test_full_suite_adds_odd_shapes():
    full = shapes.rows_and_width("full")
    widths = {w for _, w, _ in full}
    assert {1, 17, 4093, 65537, 100003} <= widths
    assert set(shapes.rows_and_width("model")) <= set(full)


def test_unknown_suite():
    with pytest.raises(ValueError, match="suite must be one of"):
        shapes.rows_and_width("huge")


def test_rows_width_variant_keeps_a_shared_width_once_per_variant():
    points = shapes.rows_width_variant("model", "hidden", lambda m: m.norm_offset)
    at_3584 = {(m, v) for t, w, m, v in points if w == 3584 and t == shapes.MODEL_TOKENS[0]}
    assert at_3584 == {("qwen2.5-7b", 0.0), ("gemma-2-9b", 1.0)}
    plain = {(t, w) for t, w, _ in shapes.rows_and_width("model", "hidden")}
    assert {(t, w) for t, w, _, _ in points} == plain
    quick = shapes.rows_width_variant("quick", "hidden", lambda m: m.norm_offset)
    assert [(r, w) for r, w, _, _ in quick] == list(shapes.QUICK_ROWS_WIDTHS)


MOE = {"mixtral-8x7b": (8, 2), "qwen1.5-moe-a2.7b": (60, 4), "qwen3-30b-a3b": (128, 8),
       "granite-3.0-1b-a400m": (32, 8)}


@pytest.mark.parametrize("name", ["granite-3.1-8b", "olmo-2-7b", "glm-4-9b", "smollm3-3b",
                                  "ministral-8b", "qwen2-vl-7b", *MOE])
def test_patched_families_have_real_configurations(name):
    from speedlight.patching.families import FAMILIES
    m = shapes.MODELS[name]
    assert m.source.startswith("https://huggingface.co/") and m.source.endswith("config.json")
    assert m.hf_model_type in FAMILIES and shapes.NUM_LAYERS[name] > 0
    assert m.heads % m.kv_heads == 0 and m.head_dim in (64, 128)
    assert (m.experts, m.experts_per_token) == MOE.get(name, (0, 0))
    if not m.experts:  # an expert is narrower than the hidden size; a dense MLP wider
        assert m.intermediate > m.hidden


def test_from_hf_config_reads_experts_text_configs_and_partial_rotary():
    tf = pytest.importorskip("transformers")
    moe = shapes.from_hf_config(tf.Qwen3MoeConfig(num_experts=16, num_experts_per_tok=4,
                                                  moe_intermediate_size=96))
    assert (moe.experts, moe.experts_per_token, moe.intermediate) == (16, 4, 96)
    vl = shapes.from_hf_config(tf.Qwen2VLConfig(text_config=dict(hidden_size=256,
                                                                 num_attention_heads=4)))
    assert vl.hf_model_type == "qwen2_vl" and vl.hidden == 256 and vl.head_dim == 64
    glm = shapes.from_hf_config(tf.Glm4Config(head_dim=128, partial_rotary_factor=0.5))
    assert glm.rotary_dim == 64 and glm.rope_interleaved
    dense = shapes.from_hf_config(tf.LlamaConfig())
    assert (dense.experts, dense.experts_per_token) == (0, 0)
