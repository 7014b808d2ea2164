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
     "approximate must be 'tanh' or 'none', got 'erf'"),
    (lambda d: snn.GeGLU(approximate="fast"), ValueError, "approximate must be"),
    (lambda d: speedlight.geglu(torch.ones(4, 9, device=d)), ValueError, "must be even"),
    (lambda d: speedlight.geglu(torch.ones(4, 8, dtype=torch.float64, device=d)), TypeError,
     "gate must be a float32, float16 or bfloat16 tensor.*float64"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)


