import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from tests.helpers import assert_rejected, seeded
from tests.ops.test_swiglu import assert_loads_and_matches_hf



def test_the_two_gelus_differ_where_they_should(device):
    """tanh and exact gelu agree to ~1e-3 and are not the same function: the kernel must
    not compute one for the other."""
    gate, up = seeded((4, 512), device=device, scale=2.0), torch.ones(4, 512, device=device)
    tanh, exact = speedlight.geglu(gate, up), speedlight.geglu(gate, up, approximate="none")
    torch.testing.assert_close(tanh, torch.nn.functional.gelu(gate, approximate="tanh"),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(exact, torch.nn.functional.gelu(gate), rtol=1e-6, atol=1e-6)
    gap = (tanh - exact).abs().max().item()
    assert 1e-5 < gap < 1e-2


@pytest.mark.parametrize("model", ["gemma", "gemma2"])
def test_gated_mlp_loads_hf_gemma_mlp_weights_and_matches(model, device):
    if model == "gemma":
        from transformers import GemmaConfig as Config
        from transformers.models.gemma.modeling_gemma import GemmaMLP as MLP
    else:
        from transformers import Gemma2Config as Config
        from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP as MLP
    config = Config(hidden_size=64, intermediate_size=176)
    torch.manual_seed(0)
    hf = MLP(config).to(device)
    ours = snn.GatedMLP.from_config(config).to(device)
    assert ours.activation == "gelu_tanh"
    assert_loads_and_matches_hf(ours, hf, device)


def test_exact_gelu_mlp_matches_its_unfused_form(device):
    torch.manual_seed(0)
    ours = snn.GatedMLP(48, 80, activation="gelu", bias=True).to(device)
    x = seeded((7, 48), device=device)
    y_ref = ours.down_proj(reference.geglu(ours.gate_proj(x), ours.up_proj(x), "none"))
    torch.testing.assert_close(ours(x), y_ref, rtol=1e-5, atol=1e-5)


def test_activation_module(device):
    gate, up = seeded((4, 33), device=device), seeded((4, 33), device=device, seed=1)
    assert torch.equal(snn.GeGLU()(gate, up), speedlight.geglu(gate, up))
    exact = snn.GeGLU(approximate="none")
    assert "approximate='none'" in repr(exact)
    assert torch.equal(exact(torch.cat([gate, up], -1)), speedlight.geglu(gate, up, "none"))


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.geglu(torch.ones(4, 8, device=d), approximate="erf"), ValueError,
     "approximate must be one of 'tanh', 'none', got 'erf'"),
    (lambda d: snn.GeGLU(approximate="fast"), ValueError, "approximate must be"),
    (lambda d: speedlight.geglu(torch.ones(4, 9, device=d)), ValueError, "must be even"),
    (lambda d: speedlight.geglu(torch.ones(4, 8, dtype=torch.float64, device=d)), TypeError,
     "gate must be a float32, float16 or bfloat16 tensor.*float64"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)




def _gemma4_config(**kw):
    from transformers import Gemma4TextConfig
    return Gemma4TextConfig(**{
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 5,
        "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 64,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                        "sliding_attention", "full_attention"], **kw})


def test_gated_mlp_widens_the_layers_gemma4_double_wide_mlp_widens(device):
    """Gemma 4's use_double_wide_mlp doubles the MLP of the layers that reuse another
    layer's keys and values (the last num_kv_shared_layers): from_config(config, layer_idx)
    builds each layer's MLP at Hugging Face's width, and matches it."""
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextMLP
    config = _gemma4_config()
    torch.manual_seed(0)
    widths = []
    for layer in range(config.num_hidden_layers):
        hf = Gemma4TextMLP(config, layer).to(device)
        ours = snn.GatedMLP.from_config(config, layer).to(device)
        assert ours.intermediate_size == hf.intermediate_size and ours.activation == "gelu_tanh"
        widths.append(ours.intermediate_size)
    assert widths == [48, 48, 48, 96, 96]
    assert_loads_and_matches_hf(ours, hf, device)  # a widened layer
    with pytest.raises(ValueError, match="needs layer_idx.*use_double_wide_mlp"):
        snn.GatedMLP.from_config(config)
    with pytest.raises(ValueError, match="layer_idx must be an int in \\[0, 5\\)"):
        snn.GatedMLP.from_config(config, 5)
    # without shared layers nothing is widened, and no layer_idx is needed
    assert snn.GatedMLP.from_config(_gemma4_config(num_kv_shared_layers=0)).intermediate_size == 48
