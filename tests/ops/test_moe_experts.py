"""What is particular to speedlight.moe_experts (tests/ops/test_contract.py runs its quick
suite in every dtype, torch.compile, empty and non-finite inputs; tests/ops/test_fuzz.py
every argument): gpt-oss's clamp where it bites, sentinel indices, the weights' gradients
in their own layout, only the gradients asked for, autocast, named bad input, and on a GPU
no host sync, a CUDA graph and bitwise-repeatable results."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import speedlight
from speedlight.ops import moe_experts as op
from speedlight.ops.moe_experts_bwd import moe_experts_bwd
from speedlight.ops.moe_experts_launch import moe_experts_fwd
from speedlight.verify.harness import LaunchCounter
from tests.conftest import needs_gpu
from tests.helpers import assert_rejected, assert_verified, case_maker

SPEC = op.SPEC
case = case_maker("moe_experts", "tokens", "hidden", "inter", "experts", "k")
GRADS = ("hidden", "top_k_weights", "gate_up_proj", "down_proj")


def _inputs(c, device, grads=GRADS):
    inputs = SPEC.make_inputs(c, device)
    for name in grads:
        inputs[name] = inputs[name].detach().requires_grad_(True)
    return inputs


def test_clamped_swiglu_where_the_clamp_bites(device):
    """gpt-oss's unit with a limit inside the values' range, so gate and up are clamped on
    both sides (fp32: no rounding puts a value across the limit)."""
    assert_verified(SPEC, case(10, 16, 8, 4, 2, layout="transposed", act="clamped_swiglu",
                               interleaved=True, bias=True, swiglu_limit=0.5), device)


def test_sentinel_pairs_add_nothing_and_get_no_weight_gradient(device):
    """An index >= E (an expert-parallel sentinel) or < 0: the output is the output with
    those weights zeroed (or made infinite), and their weights' gradient is exactly
    zero."""
    c = case(8, 16, 8, 3, 2, sentinel=True)
    inputs = _inputs(c, device, grads=("top_k_weights",))
    index = inputs["top_k_index"]
    index[0, 0] = -1
    out = speedlight.moe_experts(**inputs)
    out.sum().backward()
    outside = (index < 0) | (index >= 3)
    assert outside.sum() > 2
    dw = inputs["top_k_weights"].grad
    assert torch.equal(dw[outside], torch.zeros_like(dw[outside]))
    assert (dw[~outside] != 0).all()
    zeroed = dict(inputs, top_k_weights=torch.where(outside, 0.0, inputs["top_k_weights"]),
                  top_k_index=index.clamp(0, 2))
    torch.testing.assert_close(out, speedlight.moe_experts(**zeroed))
    # a sentinel's weight is never read into the output, even an infinite one (the down
    # GEMM's epilogue scales its zero row to NaN; the combine drops it by its index)
    inf = dict(inputs, top_k_weights=torch.where(outside, float("inf"),
                                                 inputs["top_k_weights"].detach()))
    with torch.no_grad():
        torch.testing.assert_close(speedlight.moe_experts(**inf), out.detach())


def test_weight_gradients_lie_as_the_weights_do(device):
    """gpt-oss's [E, H, 2 I] and [E, I, H] tensors passed transposed get gradients of the
    same layout (no copy of a weight or its gradient)."""
    inputs = _inputs(case(6, 16, 8, 3, 2, layout="transposed"), device)
    speedlight.moe_experts(**inputs).sum().backward()
    for name in ("gate_up_proj", "down_proj"):
        w = inputs[name]
        assert w.grad.stride() == w.stride(), name


class _Allocations(TorchDispatchMode):
    """The shape of every tensor the ops run under it return (views and in-place ops
    aside): what a launcher allocates, seen from inside it."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func._schema.is_mutable and not func.is_view:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            self.shapes += [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)]
        return out


def test_backward_makes_no_tensor_of_pairs_by_hidden(device):
    """dout and hidden are read in expert order by the kernels' loads, and dhidden is
    summed slot by slot into [tokens, H]: nothing the backward allocates holds tokens x k
    rows of H (the gathered copies it made before had 2 of them), and nothing is kept
    from the forward but z."""
    c = case(16, 32, 4, 4, 4, bias=True)  # pairs 64; E x 2 I = 32 rows < pairs
    inputs = SPEC.make_inputs(c, device)
    options = [inputs["activation"], inputs["interleaved"], 1.0, 1.0, 1.702, 7.0]
    tensors = [inputs[n] for n in ("hidden", "top_k_index", "top_k_weights", "gate_up_proj",
                                   "down_proj", "gate_up_bias", "down_bias")]
    out, z = moe_experts_fwd(*tensors, *options)
    assert z.shape == (64, 8)
    seen = _Allocations()
    with seen:
        grads = moe_experts_bwd(torch.randn_like(out), *tensors, z, *options, [True] * 6)
    assert all(g is not None for g in grads)
    pairs_by_hidden = 64 * 32
    assert seen.shapes and max(math.prod(s) for s in seen.shapes) < pairs_by_hidden, \
        sorted(seen.shapes, key=math.prod)[-3:]


def test_only_the_gradients_asked_for_are_computed(device):
    """With only the routing weights trainable, neither weight gradient nor dhidden is
    launched: fewer launches than with every gradient."""
    launches = {}
    for grads in (GRADS, ("top_k_weights",)):
        inputs = _inputs(case(6, 16, 8, 3, 2), device, grads)
        out = speedlight.moe_experts(**inputs)
        counter = LaunchCounter()
        with counter.active():
            out.sum().backward()
        launches[grads] = counter.kernels
        assert inputs["top_k_weights"].grad is not None
    assert len(launches[("top_k_weights",)]) < len(launches[GRADS])
    assert not any("dw" in k for k in launches[("top_k_weights",)])


@pytest.mark.parametrize("c", [
    pytest.param(case(9, 16, 8, 3, 2, torch.bfloat16), id="halves-silu-bf16"),
    pytest.param(case(9, 16, 12, 3, 2, torch.bfloat16, layout="transposed",
                      **op.cases.GPT_OSS), id="gpt-oss-interleaved-bf16"),
])
def test_inference_and_training_outputs_are_the_same_bits(c, device):
    """The gate unit in the gate_up GEMM's epilogue reads z as rounded (what the backward
    reads back), so the inference forward (z not written) and the training forward give
    one output, bit for bit."""
    inputs = _inputs(c, device)
    trained = speedlight.moe_experts(**inputs)
    with torch.no_grad():
        inferred = speedlight.moe_experts(**inputs)
    assert trained.requires_grad and not inferred.requires_grad
    assert torch.equal(trained.detach(), inferred)


def test_autocast_runs_in_its_dtype_and_returns_hiddens(device):
    """Under torch.autocast(bf16) with fp32 inputs the block runs in bf16 (as the eager
    loop's matmuls would) and returns fp32; gradients reach the fp32 leaves."""
    inputs = _inputs(case(6, 16, 8, 3, 2), device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = speedlight.moe_experts(**inputs)
    assert out.dtype == torch.float32
    cast = {k: (v.detach().to(torch.bfloat16) if k in ("hidden", "gate_up_proj", "down_proj")
                else v.detach() if isinstance(v, torch.Tensor) else v)
            for k, v in inputs.items()}
    torch.testing.assert_close(out, speedlight.moe_experts(**cast).float())
    out.sum().backward()
    assert inputs["gate_up_proj"].grad.dtype == torch.float32


@pytest.mark.parametrize("change,error,match", [
    pytest.param(lambda i: {"top_k_index": i["top_k_index"][:, :1]}, ValueError,
                 "top_k_weights must have top_k_index's shape", id="k-mismatch"),
    pytest.param(lambda i: {"top_k_index": i["top_k_index"].float()}, TypeError,
                 "top_k_index must be a int64 or int32", id="float-index"),
    pytest.param(lambda i: {"down_proj": i["down_proj"][:2]}, ValueError,
                 r"down_proj must be \[E, H, I\] = \(3, 16, 8\)", id="experts-mismatch"),
    pytest.param(lambda i: {"gate_up_proj": i["gate_up_proj"][:, :7]}, ValueError,
                 r"gate_up_proj must be \[E, 2 I, H\]", id="odd-gate-up"),
    pytest.param(lambda i: {"hidden": i["hidden"][None]}, ValueError, "hidden must be 2-D",
                 id="3-D-hidden"),
    pytest.param(lambda i: {"top_k_index": i["top_k_index"][:5]}, ValueError,
                 "top_k_index must be \\[tokens, k\\] with hidden's 6 tokens", id="tokens"),
    pytest.param(lambda i: {"down_proj": i["down_proj"].half()}, TypeError,
                 "down_proj has dtype torch.float16", id="weight-dtype"),
    pytest.param(lambda i: {"gate_up_bias": i["down_proj"][:, 0]}, ValueError,
                 r"gate_up_bias must be \[E, 16\]", id="bias-shape"),
    pytest.param(lambda i: {"activation": "relu"}, ValueError, "activation must be one of",
                 id="activation"),
    pytest.param(lambda i: {"swiglu_limit": float("inf")}, ValueError,
                 "swiglu_limit must be finite", id="limit"),
    pytest.param(lambda i: {"swiglu_limit": -1.0, "activation": "clamped_swiglu"}, ValueError,
                 "swiglu_limit must be >= 0", id="negative-limit"),
    pytest.param(lambda i: {"hidden": i["hidden"][:1].expand(2 ** 31, -1),
                            "top_k_index": i["top_k_index"][:1].expand(2 ** 31, -1),
                            "top_k_weights": i["top_k_weights"][:1].expand(2 ** 31, -1)},
                 ValueError, r"top_k_index holds 4294967296 \(token, slot\) pairs",
                 id="pairs-past-int32"),
])
def test_bad_input_is_named(change, error, match, device):
    inputs = SPEC.make_inputs(case(6, 16, 8, 3, 2), device)
    assert_rejected(lambda: speedlight.moe_experts(**dict(inputs, **change(inputs))), error,
                    match)


@needs_gpu("host syncs, CUDA graphs and run-to-run bits are a GPU's matter")
def test_no_host_sync_cuda_graph_and_repeatable_bits(device):
    """Forward and backward with CUDA's sync debug mode set to error (no .item, no
    nonzero), captured in a CUDA graph and replayed, and bitwise equal run to run (the
    combine sums each token's rows in a fixed order)."""
    c = case(4096, 512, 256, 16, 4, torch.bfloat16, routing="skewed", sentinel=True)
    inputs = _inputs(c, device)

    def step():
        for name in GRADS:
            inputs[name].grad = None
        out = speedlight.moe_experts(**inputs)
        out.backward(torch.ones_like(out))
        return [out.detach().clone()] + [inputs[n].grad.clone() for n in GRADS]

    first = step()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    static = {k: v for k, v in inputs.items()}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        speedlight.moe_experts(**static)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = speedlight.moe_experts(**static)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, first[0])


def test_zero_width_hidden_gives_zero_weight_gradients(device):
    """H = 0: an empty output, no launch, and the routing weights' gradient is exactly zero
    (the saved gate_up output is zeros, not uninitialized memory)."""
    inputs = _inputs(case(5, 0, 8, 3, 2), device)
    counter = LaunchCounter()
    with counter.active():
        out = speedlight.moe_experts(**inputs)
    assert out.shape == (5, 0) and counter.count == 0
    out.sum().backward()
    assert torch.equal(inputs["top_k_weights"].grad, torch.zeros_like(inputs["top_k_weights"]))
