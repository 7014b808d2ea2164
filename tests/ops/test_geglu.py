import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import geglu as op
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import DTYPES, case_maker, assert_verified, seeded
from tests.ops.test_swiglu import assert_64bit_indexing, assert_loads_and_matches_hf

SPEC = op.SPEC
APPROXIMATE = [pytest.param("tanh", id="tanh"), pytest.param("none", id="exact")]


case = case_maker("geglu", "rows", "intermediate")


@pytest.mark.parametrize("approximate", APPROXIMATE)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter,layout,flags", [
    pytest.param(1, 1, "contiguous", {}, id="rows1-intermediate1"),
    pytest.param(13, 781, "contiguous", {}, id="rows13-intermediate781"),
    pytest.param(8, 1823, "strided", {}, id="rows8-intermediate1823-strided"),
    pytest.param(6, 1000, "transposed", {}, id="rows6-intermediate1000-transposed"),
    pytest.param(9, 257, "contiguous", {"concat": True}, id="rows9-intermediate257-concat"),
    pytest.param(5, 300, "strided", {"concat": True}, id="rows5-intermediate300-strided-concat"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_backward_match_float64(rows, inter, layout, flags, dtype, approximate,
                                            seed, device):
    assert_verified(SPEC, case(rows, inter, dtype, layout, seed, approximate=approximate,
                               **flags), device)


@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_nonfinite_positions_match(approximate, device):
    assert_verified(SPEC, case(5, 300, nonfinite=True, approximate=approximate), device)


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


def test_empty_input_launches_nothing(device):
    gate_up = torch.empty(0, 128, device=device, requires_grad=True)
    counter = LaunchCounter()
    with counter.active():
        out = speedlight.geglu(gate_up)
        out.sum().backward()
    assert out.shape == (0, 64) and counter.count == 0
    assert gate_up.grad.shape == (0, 128)


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


@pytest.mark.parametrize("backend,approximate", [("aot_eager", "none"), ("inductor", "tanh")])
def test_torch_compile_fullgraph(backend, approximate, device):
    torch._dynamo.reset()

    def mlp(x, w_gate, w_up):
        return speedlight.geglu(x @ w_gate, x @ w_up, approximate=approximate) * 2.0

    compiled = torch.compile(mlp, fullgraph=True, backend=backend)
    x = seeded((6, 32), device=device).requires_grad_()
    wg = seeded((32, 48), device=device, seed=3, scale=0.3).requires_grad_()
    wu = seeded((32, 48), device=device, seed=4, scale=0.3).requires_grad_()
    y = compiled(x, wg, wu)
    grads = torch.autograd.grad(y.sum(), (x, wg, wu))
    y_ref = mlp(x, wg, wu)
    grads_ref = torch.autograd.grad(y_ref.sum(), (x, wg, wu))
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.geglu(torch.ones(4, 8, device=d), approximate="erf"), ValueError,
     "approximate must be 'tanh' or 'none', got 'erf'"),
    (lambda d: snn.GeGLU(approximate="fast"), ValueError, "approximate must be"),
    (lambda d: speedlight.geglu(torch.ones(4, 9, device=d)), ValueError, "must be even"),
    (lambda d: speedlight.geglu(torch.ones(4, 8, dtype=torch.float64, device=d)), TypeError,
     "gate must be a float32, float16 or bfloat16 tensor.*float64"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(device)
    assert counter.count == 0


@needs_gpu("rows x stride > 2^31 needs > 4 GiB per tensor and hours under the CPU interpreter")
def test_64bit_indexing(device):
    assert_64bit_indexing(speedlight.geglu, reference.geglu, device)
