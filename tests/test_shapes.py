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
