"""What is particular to speedlight.gated_matmul (tests/ops/test_contract.py runs its quick
suite in every dtype, torch.compile, empty and non-finite inputs): the TMA path with split
weights, weights read in place, the stacked form equal to the split one, its errors, the
fused MLP module."""

import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight.inspect.launches import capture_case
from speedlight.ops import gated_matmul as op
from tests.helpers import (DTYPES, assert_module_matches, assert_rejected, assert_verified, case_maker,
                           seeded)

SPEC = op.SPEC
case = case_maker("gated_matmul", "m", "n", "k")


# The quick suite (split and stacked weights, each activation, odd sizes, transposed and
# strided layouts, empty and non-finite inputs) runs in every dtype in
# tests/ops/test_contract.py; these are the cases it does not have.
@pytest.mark.parametrize("dtype", DTYPES)
def test_tma_path_with_split_weights_matches_float64(dtype, device):
    assert_verified(SPEC, case(32, 48, 64, dtype, act="gelu_tanh"), device)


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
    assert_rejected(lambda: call(torch.randn(4, 8), torch.randn(6, 8)), error, match)


def test_fused_mlp_module_matches_the_unfused_one(device):
    torch.manual_seed(0)
    ref = snn.GatedMLP(32, 48, activation="gelu_tanh").to(device)
    ours = snn.FusedGatedMLP(32, 48, activation="gelu_tanh").to(device)
    assert_module_matches(ours, ref, seeded((3, 5, 32), device=device))
    with pytest.raises(ValueError, match="bias"):
        snn.FusedGatedMLP(32, 48, bias=True)
