import contextlib

import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight import reference
from speedlight.ops import swiglu as op
from speedlight.spec import Case
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import DTYPES, case_maker, assert_verified, seeded

SPEC = op.SPEC


case = case_maker("swiglu", "rows", "intermediate")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter,layout,flags", [
    pytest.param(1, 1, "contiguous", {}, id="rows1-intermediate1"),
    pytest.param(13, 781, "contiguous", {}, id="rows13-intermediate781"),
    pytest.param(8, 1823, "strided", {}, id="rows8-intermediate1823-strided"),
    pytest.param(6, 1000, "transposed", {}, id="rows6-intermediate1000-transposed"),
    pytest.param(9, 257, "contiguous", {"concat": True}, id="rows9-intermediate257-concat"),
    pytest.param(5, 300, "strided", {"concat": True}, id="rows5-intermediate300-strided-concat"),
    pytest.param(6, 100, "transposed", {"concat": True}, id="rows6-intermediate100-transposed-concat"),
    pytest.param(2, 70001, "contiguous", {}, id="rows2-intermediate70001-two-column-blocks"),
])
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_and_backward_match_float64(rows, inter, layout, flags, dtype, seed, device):
    assert_verified(SPEC, case(rows, inter, dtype, layout, seed, **flags), device)


@pytest.mark.parametrize("concat", [pytest.param(False, id="split"), pytest.param(True, id="concat")])
def test_nonfinite_positions_match(concat, device):
    assert_verified(SPEC, case(5, 300, nonfinite=True, concat=concat), device)


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
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    seen, originals = [], {cls: cls.run for cls in (JITFunction, InterpretedFunction)}

    def wrap(orig):
        def run(self, *args, **kwargs):
            seen.append([a for a in args if isinstance(a, torch.Tensor)])
            return orig(self, *args, **kwargs)
        return run

    for cls, orig in originals.items():
        cls.run = wrap(orig)
    try:
        yield seen
    finally:
        for cls, orig in originals.items():
            cls.run = orig


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


def test_empty_input_launches_nothing(device):
    gate = torch.empty(0, 64, device=device, requires_grad=True)
    up = torch.empty(0, 64, device=device, requires_grad=True)
    gate_up = torch.empty(3, 0, device=device, requires_grad=True)
    counter = LaunchCounter()
    with counter.active():
        out = speedlight.swiglu(gate, up)
        out.sum().backward()
        out2 = speedlight.swiglu(gate_up)
        out2.sum().backward()
    assert out.shape == (0, 64) and out2.shape == (3, 0) and counter.count == 0
    assert gate.grad.shape == (0, 64) and gate_up.grad.shape == (3, 0)


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


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, device):
    torch._dynamo.reset()

    def mlp(x, w_gate_up):
        gate_up = x @ w_gate_up
        return speedlight.swiglu(gate_up) + speedlight.swiglu(*gate_up.chunk(2, -1))

    compiled = torch.compile(mlp, fullgraph=True, backend=backend)
    x = seeded((6, 32), device=device).requires_grad_()
    w = seeded((32, 2 * 48), device=device, seed=3, scale=0.3).requires_grad_()
    y = compiled(x, w)
    grads = torch.autograd.grad(y.sum(), (x, w))
    y_ref = mlp(x, w)
    grads_ref = torch.autograd.grad(y_ref.sum(), (x, w))
    torch.testing.assert_close(y, y_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)


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
     "activation must be one of silu, gelu_tanh, gelu, got 'relu'"),
    (lambda d: snn.GatedMLP.from_config(_tiny_llama_config(hidden_act="relu")), ValueError,
     "config's activation 'relu' has no gated kernel"),
])
def test_bad_input_is_named_and_launches_nothing(call, error, match, device):
    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(device)
    assert counter.count == 0


def test_mismatched_devices():
    with pytest.raises(ValueError, match="up is on meta but gate is on cpu"):
        speedlight.swiglu(torch.ones(4, 8), torch.ones(4, 8, device="meta"))


def assert_64bit_indexing(op, ref, device):
    """op on a concatenated gate_up whose up half and gradient sit past 2^31 elements,
    checked on its last rows against ref in float32 (shared by swiglu and geglu)."""
    rows, inter = 32769, 32771  # rows * (2 * inter) > 2^31
    gate_up = torch.randn(rows, 2 * inter, device=device, dtype=torch.bfloat16,
                          requires_grad=True)
    out = op(gate_up)
    (d_gate_up,) = torch.autograd.grad(out, (gate_up,), torch.ones_like(out))
    tail = slice(rows - 3, rows)
    gt = gate_up.detach()[tail].float().requires_grad_()
    out_ref = ref(gt)
    (d_ref,) = torch.autograd.grad(out_ref, (gt,), torch.ones_like(out_ref))
    torch.testing.assert_close(out[tail].float(), out_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(d_gate_up[tail].float(), d_ref, rtol=2e-2, atol=2e-2)


@needs_gpu("rows x stride > 2^31 needs > 4 GiB per tensor and hours under the CPU interpreter")
def test_64bit_indexing(device):
    assert_64bit_indexing(speedlight.swiglu, reference.swiglu, device)
