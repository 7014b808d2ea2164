import contextlib

import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from tests.helpers import assert_rejected, seeded, triton_launches


def test_concatenated_equals_split_halves(device):
    gate_up = seeded((2, 7, 2 * 193), device=device, scale=2.0).requires_grad_()
    out = speedlight.swiglu(gate_up)
    g = seeded(out.shape, device=device, seed=1)
    (d_gate_up,) = torch.autograd.grad(out, (gate_up,), g)
    gate, up = (t.detach().clone().requires_grad_() for t in gate_up.chunk(2, -1))
    out_split = speedlight.swiglu(gate, up)
    d_gate, d_up = torch.autograd.grad(out_split, (gate, up), g)
    assert torch.equal(out, out_split)
    assert d_gate_up.is_contiguous() and torch.equal(d_gate_up, torch.cat([d_gate, d_up], -1))


@contextlib.contextmanager
def launched_tensors():
    """The tensor arguments of every Triton launch inside, in launch order."""
    seen = []
    with triton_launches(lambda kernel, args, kwargs: seen.append(
            [a for a in args if isinstance(a, torch.Tensor)])):
        yield seen


def test_strided_and_concatenated_inputs_are_read_in_place(device):
    """The kernel gets the caller's storage, not a copy: both halves of a gate_up tensor
    whose rows are padded, and a transposed up."""
    inter = 96
    wide = seeded((5, 2 * inter + 8), device=device)
    gate_up = wide[:, : 2 * inter]  # row stride 2 * inter + 8
    up_t = seeded((inter, 5), device=device, seed=1).t()
    with launched_tensors() as seen:
        out = speedlight.swiglu(gate_up)
        out_t = speedlight.swiglu(gate_up[:, :inter], up_t)
    (gate_arg, up_arg, _), (gate_arg2, up_arg2, _) = seen
    e = wide.element_size()
    assert gate_arg.data_ptr() == wide.data_ptr()
    assert up_arg.data_ptr() == wide.data_ptr() + inter * e
    assert gate_arg2.data_ptr() == wide.data_ptr() and up_arg2.data_ptr() == up_t.data_ptr()
    torch.testing.assert_close(out, reference.swiglu(gate_up), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out_t, reference.swiglu(gate_up[:, :inter], up_t),
                               rtol=1e-6, atol=1e-6)


def _tiny_llama_config(**kw):
    from transformers import LlamaConfig
    return LlamaConfig(**{"hidden_size": 64, "intermediate_size": 176, "hidden_act": "silu",
                          **kw})


@pytest.mark.parametrize("bias", [pytest.param(False, id="nobias"), pytest.param(True, id="mlp_bias")])
def test_gated_mlp_loads_hf_llama_mlp_weights_and_matches(bias, device):
    from transformers.models.llama.modeling_llama import LlamaMLP
    config = _tiny_llama_config(mlp_bias=bias)
    torch.manual_seed(0)
    hf = LlamaMLP(config).to(device)
    ours = snn.GatedMLP.from_config(config).to(device)
    assert ours.activation == "silu"
    assert_loads_and_matches_hf(ours, hf, device)


def assert_loads_and_matches_hf(ours, hf, device):
    """ours takes hf's state-dict unchanged (strict: same keys) and then matches it in
    output and in the gradients of the input and every parameter."""
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = seeded((3, 5, hf.hidden_size), device=device).requires_grad_()
    y, y_hf = ours(x), hf(x)
    torch.testing.assert_close(y, y_hf, rtol=1e-5, atol=1e-5)
    g = seeded(y.shape, device=device, seed=1)
    grads = torch.autograd.grad(y, [x] + list(ours.parameters()), g)
    grads_hf = torch.autograd.grad(y_hf, [x] + list(hf.parameters()), g)
    for a, b in zip(grads, grads_hf):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_concatenated_form_reproduces_phi3_mlp(device):
    """Phi-3 projects gate and up with one matmul; swiglu(gate_up) takes its output whole."""
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3MLP
    torch.manual_seed(0)
    hf = Phi3MLP(Phi3Config(hidden_size=64, intermediate_size=160, hidden_act="silu")).to(device)
    x = seeded((2, 7, 64), device=device)
    y = hf.down_proj(speedlight.swiglu(hf.gate_up_proj(x)))
    torch.testing.assert_close(y, hf(x), rtol=1e-5, atol=1e-5)


def test_activation_module(device):
    gate, up = seeded((4, 33), device=device), seeded((4, 33), device=device, seed=1)
    m = snn.SwiGLU()
    assert torch.equal(m(gate, up), speedlight.swiglu(gate, up))
    assert torch.equal(m(torch.cat([gate, up], -1)), speedlight.swiglu(gate, up))


@pytest.mark.parametrize("call,error,match", [
    (lambda d: speedlight.swiglu(torch.ones(4, 8, dtype=torch.int64, device=d)), TypeError,
     "gate must be a float32, float16 or bfloat16 tensor.*int64"),
    (lambda d: speedlight.swiglu(torch.ones(4, 7, device=d)), ValueError,
     r"with up=None.*must be even; got gate of shape \(4, 7\)"),
    (lambda d: speedlight.swiglu(torch.ones(4, 8, device=d), torch.ones(4, 9, device=d)),
     ValueError, r"up must have gate's shape \(4, 8\), got \(4, 9\)"),
    (lambda d: speedlight.swiglu(torch.ones(4, 8, device=d),
                                 torch.ones(4, 8, dtype=torch.bfloat16, device=d)),
     TypeError, "up has dtype torch.bfloat16 but gate has torch.float32"),
    (lambda d: speedlight.swiglu(torch.ones(4, 8, device=d), [1.0]), TypeError,
     "up must be a torch.Tensor"),
    (lambda d: speedlight.swiglu(torch.ones((), device=d)), ValueError,
     "gate must have at least 1 dim"),
    (lambda d: snn.GatedMLP(8, 16, activation="relu"), ValueError,
     "activation must be one of 'silu', 'gelu_tanh', 'gelu', got 'relu'"),
    (lambda d: snn.GatedMLP.from_config(_tiny_llama_config(hidden_act="relu")), ValueError,
     "config's activation 'relu' has no gated kernel"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    assert_rejected(lambda: call(device), error, match)




# --- Falcon-H1's mlp_multipliers ----------------------------------------------------------

@pytest.mark.parametrize("bias", [pytest.param(False, id="nobias"), pytest.param(True, id="mlp_bias")])
def test_gated_mlp_reproduces_falcon_h1_mlp_with_its_multipliers(bias, device):
    """FalconH1MLP: down_proj(up * act(gate * gate_multiplier)) * down_multiplier; the
    multipliers are read from mlp_multipliers and folded into the kernel (down_multiplier
    after down_proj when it has a bias)."""
    from transformers import FalconH1Config
    from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1MLP
    config = FalconH1Config(hidden_size=64, intermediate_size=176, mlp_bias=bias,
                            mlp_multipliers=[0.75, 2.5])
    torch.manual_seed(0)
    hf = FalconH1MLP(config).to(device)
    ours = snn.GatedMLP.from_config(config).to(device)
    assert (ours.gate_multiplier, ours.down_multiplier) == (0.75, 2.5)
    assert "down_multiplier=2.5" in repr(ours)
    assert_loads_and_matches_hf(ours, hf, device)


@pytest.mark.parametrize("call,error,match", [
    (lambda g: speedlight.swiglu(g, g, gate_multiplier="2"), TypeError, "gate_multiplier must be a number"),
    (lambda g: speedlight.swiglu(g, g, down_multiplier=float("inf")), ValueError,
     "down_multiplier must be finite"),
    (lambda g: speedlight.geglu(g, g, gate_multiplier=True), TypeError, "gate_multiplier"),
])
def test_bad_multiplier_is_named_and_launches_nothing(call, error, match, device):
    gate = seeded((2, 8), device=device)
    assert_rejected(lambda: call(gate), error, match)


def test_multipliers_of_one_are_the_plain_unit(device):
    gate, up = seeded((3, 40), device=device), seeded((3, 40), device=device, seed=1)
    assert torch.equal(speedlight.swiglu(gate, up, gate_multiplier=1.0, down_multiplier=1.0),
                       speedlight.swiglu(gate, up))
