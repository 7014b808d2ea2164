"""What is particular to speedlight.gated_matmul: split and stacked ([2I, H]) weights in
every dtype and activation against float64 (forward and every gradient), weights read in
place, the stacked form equal to the split one, bad input, the fused MLP module and
torch.compile."""

import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight.inspect.capture import capture_case
from speedlight.ops import gated_matmul as op
from tests.helpers import DTYPES, assert_verified, case_maker, seeded

SPEC = op.SPEC
case = case_maker("gated_matmul", "m", "n", "k")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,layout,flags", [
    pytest.param(1, 1, 16, "contiguous", {}, id="m1-n1-k16"),
    pytest.param(37, 45, 70, "contiguous", {}, id="m37-n45-k70-pointer-path"),
    pytest.param(48, 64, 64, "contiguous", {"concat": True}, id="m48-n64-k64-concat-tma"),
    pytest.param(33, 20, 17, "transposed", {}, id="m33-n20-k17-transposed"),
    pytest.param(30, 19, 21, "strided", {"act": "gelu_tanh"}, id="m30-n19-k21-strided-gelu_tanh"),
    pytest.param(9, 40, 32, "transposed", {"act": "gelu", "concat": True},
                 id="m9-n40-k32-transposed-gelu-concat"),
])
def test_forward_and_backward_match_float64(m, n, k, layout, flags, dtype, device):
    assert_verified(SPEC, case(m, n, k, dtype, layout, **flags), device)


@pytest.mark.parametrize("seed", [1, 2])
def test_several_seeds(seed, device):
    assert_verified(SPEC, case(24, 40, 48, torch.bfloat16, "contiguous", seed), device)


def test_nonfinite_positions_and_empty_shapes(device):
    assert_verified(SPEC, case(13, 24, 40, nonfinite=True), device)
    for m, n, k in ((0, 16, 16), (4, 0, 8), (4, 8, 0)):
        assert_verified(SPEC, case(m, n, k), device)


def test_stacked_weight_equals_split_weights(device):
    x = seeded((2, 7, 48), device=device).requires_grad_()
    w = seeded((2 * 40, 48), device=device, seed=1, scale=0.2).requires_grad_()
    g = seeded((2, 7, 40), device=device, seed=2)
    out = speedlight.gated_matmul(x, w)
    dx, dw = torch.autograd.grad(out, (x, w), g)
    wg, wu = (t.detach().clone().requires_grad_() for t in w.chunk(2, 0))
    out_split = speedlight.gated_matmul(x, wg, wu)
    dx_split, dwg, dwu = torch.autograd.grad(out_split, (x, wg, wu), g)
    torch.testing.assert_close(out, out_split)
    torch.testing.assert_close(dx, dx_split, rtol=1e-5, atol=1e-5)
    assert dw.is_contiguous() and torch.equal(dw, torch.cat([dwg, dwu]))


def test_one_launch_forward_with_weights_read_in_place():
    """The forward is one kernel; a stacked [2I, H] weight is passed as two views of its
    own buffer (the up half I rows in), never copied or concatenated."""
    launches = capture_case(SPEC, case(32, 48, 64, torch.bfloat16, concat=True), "cpu",
                            arch=90, mode="dry").launches
    fwd = [x for x in launches if x.direction == "fwd"]
    assert [x.kernel for x in fwd] == ["_gated_matmul_kernel"]
    args = {a.name: a for a in fwd[0].args}
    assert args["wg_ptr"].shape == args["wu_ptr"].shape == (48, 64)
    assert args["wu_ptr"].lo - args["wg_ptr"].lo == 48 * 64 * 2
    assert next(a.value for a in fwd[0].args if a.name == "TMA") is True


@pytest.mark.parametrize("call,error,match", [
    (lambda x, w: speedlight.gated_matmul(x, w[:, :7]), ValueError, r"inner dimensions"),
    (lambda x, w: speedlight.gated_matmul(x, w[:5]), ValueError, r"first dim must be even"),
    (lambda x, w: speedlight.gated_matmul(x, w, w[:2]), ValueError, r"w_up must have"),
    (lambda x, w: speedlight.gated_matmul(x, w.half()), TypeError, r"one dtype"),
    (lambda x, w: speedlight.gated_matmul(x, w, activation="relu"), ValueError, r"activation"),
])
def test_bad_input_is_refused_before_any_launch(call, error, match):
    from speedlight.verify.harness import LaunchCounter

    counter = LaunchCounter()
    with counter.active(), pytest.raises(error, match=match):
        call(torch.randn(4, 8), torch.randn(6, 8))
    assert counter.count == 0


def test_fused_mlp_module_matches_the_unfused_one(device):
    torch.manual_seed(0)
    ref = snn.GatedMLP(32, 48, activation="gelu_tanh").to(device)
    ours = snn.FusedGatedMLP(32, 48, activation="gelu_tanh").to(device)
    ours.load_state_dict(ref.state_dict())
    x = seeded((3, 5, 32), device=device)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bias"):
        snn.FusedGatedMLP(32, 48, bias=True)


def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()

    def mlp(x, wg, wu, wd):
        return speedlight.matmul(speedlight.gated_matmul(x, wg, wu), wd.t())

    compiled = torch.compile(mlp, fullgraph=True, backend="inductor")
    x = seeded((20, 32), device=device).requires_grad_()
    wg, wu = (seeded((48, 32), device=device, seed=s, scale=0.2).requires_grad_() for s in (1, 2))
    wd = seeded((32, 48), device=device, seed=3, scale=0.2).requires_grad_()
    out = compiled(x, wg, wu, wd)
    grads = torch.autograd.grad(out.sum(), (x, wg, wu, wd))
    out_ref = mlp(x, wg, wu, wd)
    grads_ref = torch.autograd.grad(out_ref.sum(), (x, wg, wu, wd))
    torch.testing.assert_close(out, out_ref)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref)
