"""What is particular to speedlight.matmul (tests/ops/test_contract.py runs its quick suite
in every dtype, torch.compile, empty and non-finite inputs): both operand paths (TMA
descriptors, pointers) with the layouts that select them, transposed operands read
without copies, the weight gradient in the weight's layout, the TF32 switch, the launch
rule, its errors, nn.Linear."""

import pytest
import torch

import speedlight
import speedlight.nn as snn
from speedlight.inspect.launches import capture_case
from speedlight.ops import _gemm as gemm
from speedlight.ops import matmul as op
from speedlight.launch import for_target
from tests.conftest import gpu_target
from tests.helpers import (DTYPES, assert_module_matches, assert_rejected, assert_verified, case_maker,
                           seeded)

SPEC = op.SPEC
case = case_maker("matmul", "m", "n", "k")


# The quick suite (every epilogue, odd sizes, transposed and strided operands, empty and
# non-finite inputs) runs in every dtype in tests/ops/test_contract.py; these are the cases
# it does not have.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,layout,flags", [
    pytest.param(48, 64, 80, "contiguous", {"linear": True, "act": "gelu", "residual": True},
                 id="m48-n64-k80-linear-tma-gelu-residual"),
    pytest.param(32, 48, 32, "transposed", {"bias": True, "scale": 2.0},
                 id="m32-n48-k32-transposed-tma-bias-scale"),
])
def test_forward_and_backward_match_float64(m, n, k, layout, flags, dtype, device):
    assert_verified(SPEC, case(m, n, k, dtype, layout, **flags), device)


@pytest.mark.parametrize("seed", [1, 2])
def test_several_seeds_with_every_epilogue(seed, device):
    assert_verified(SPEC, case(24, 40, 56, torch.bfloat16, "contiguous", seed, linear=True,
                               bias=True, act="silu", residual=True, scale=0.25), device)


def test_tiles_and_k_loop_over_several_programs(device):
    """Two tiles a side and a K loop of two steps under the interpreter's 128 tiles: the
    persistent loop's grouped order and the K tails."""
    assert_verified(SPEC, case(150, 140, 130, torch.float16, linear=True, bias=True), device)


def _launch(c, **kw):
    capture = capture_case(SPEC, c, "cpu", arch=90, mode="dry", **kw)
    return capture.launches


def _constexpr(launch, name):
    return next(a.value for a in launch.args if a.name == name)


@pytest.mark.parametrize("layout,flags,tma,a_kmajor,b_kmajor", [
    pytest.param("contiguous", {"linear": True}, True, True, True, id="x-wT"),
    pytest.param("contiguous", {}, True, True, False, id="row-major"),
    pytest.param("transposed", {}, True, False, True, id="both-transposed"),
    pytest.param("strided", {}, False, False, False, id="padded-rows"),
])
def test_aligned_layouts_take_tma_and_others_the_pointer_path(layout, flags, tma, a_kmajor,
                                                              b_kmajor):
    (fwd,) = _launch(case(64, 64, 64, torch.bfloat16, layout, **flags), backward=False)
    assert _constexpr(fwd, "TMA") is tma
    if tma:
        assert (_constexpr(fwd, "A_KMAJOR"), _constexpr(fwd, "B_KMAJOR")) == (a_kmajor, b_kmajor)


def test_transposed_operands_are_read_in_place_forward_and_backward():
    """x @ W^T launches on W's own strides; the backward's da = dz @ W and dW = dz^T @ x
    are launched on transposed views (no copy kernel, no contiguous buffer)."""
    launches = _launch(case(32, 48, 64, torch.bfloat16, linear=True))
    fwd, bwd_a, bwd_b = launches
    b = next(a for a in fwd.args if a.name == "b_ptr")
    assert b.shape == (64, 48) and b.strides == (1, 64)
    assert [x.kernel for x in launches] == ["_matmul_kernel"] * 3
    # dW = dz^T @ x: a is dz^T, a [N, M] view of the contiguous [M, N] dz
    a = next(x for x in bwd_b.args if x.name == "a_ptr")
    assert a.shape == (48, 32) and a.strides == (1, 48)


def test_weight_gradient_is_laid_out_as_the_weight(device):
    w = seeded((48, 64), device=device).requires_grad_()
    x = seeded((32, 64), device=device, seed=1)
    speedlight.matmul(x, w.t()).sum().backward()
    assert w.grad.is_contiguous()
    torch.testing.assert_close(w.grad, torch.ones(32, 48).t() @ x)


def test_tf32_only_where_torch_allows_it():
    c = case(64, 64, 64)
    was = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert _constexpr(_launch(c, backward=False)[0], "PRECISION") == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert _constexpr(_launch(c, backward=False)[0], "PRECISION") == "tf32"
        assert _constexpr(_launch(case(64, 64, 64, torch.bfloat16), backward=False)[0],
                          "PRECISION") == "ieee"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was


def test_launch_rule_picks_points_of_the_declared_space():
    dev = torch.device("cpu")
    with for_target(gpu_target(132)):
        decode = gemm.launch_config(1, 4096, 4096, torch.bfloat16, dev)
        big = gemm.launch_config(4096, 14336, 4096, torch.bfloat16, dev)
        fp32_out = gemm.launch_config(4096, 14336, 4096, torch.bfloat16, dev, out_dtype=torch.float32)
        gated = gemm.launch_config(4096, 14336, 4096, torch.bfloat16, dev, operands=2)
        f32 = gemm.launch_config(4096, 4096, 4096, torch.float32, dev)
    assert (decode.block_m, decode.num_warps) == (64, 4)
    assert (big.block_m, big.block_n, big.block_k, big.num_warps, big.num_stages) == (128, 256, 64, 8, 3)
    assert (fp32_out.block_n, gated.block_n) == (128, 128)
    assert f32.block_k == 32
    for cfg in (decode, big, fp32_out, gated, f32):
        assert cfg.block_m in gemm.CONFIG_SPACE["BLOCK_M"] and cfg.block_n in gemm.CONFIG_SPACE["BLOCK_N"]
        assert cfg.block_k in gemm.CONFIG_SPACE["BLOCK_K"] and cfg.group_m in gemm.CONFIG_SPACE["GROUP_M"]
        assert cfg.num_warps in gemm.CONFIG_SPACE["num_warps"]
        assert cfg.num_stages in gemm.CONFIG_SPACE["num_stages"] and cfg.num_stages >= 3
    with for_target(gpu_target(132)):
        (fwd,) = _launch(case(2048, 4096, 64, torch.bfloat16, linear=True), backward=False)
    assert fwd.grid == (132, 1, 1)  # persistent: one program per SM, 256 tiles


@pytest.mark.parametrize("call,error,match", [
    (lambda a, b: speedlight.matmul(a, b[:7]), ValueError, r"inner dimensions.*K = 8.*K = 7"),
    (lambda a, b: speedlight.matmul(a, b.half()), TypeError, r"one dtype.*float32.*float16"),
    (lambda a, b: speedlight.matmul(a.int(), b), TypeError, r"a must be a float32"),
    (lambda a, b: speedlight.matmul(a, b[None]), ValueError, r"b must be 2-D"),
    (lambda a, b: speedlight.matmul(a, b, bias=torch.zeros(5)), ValueError, r"bias.*\(6,\)"),
    (lambda a, b: speedlight.matmul(a, b, residual=torch.zeros(4, 5)), ValueError,
     r"residual.*\(4, 6\)"),
    (lambda a, b: speedlight.matmul(a, b, activation="relu"), ValueError, r"activation"),
    (lambda a, b: speedlight.matmul(a, b, out_dtype=torch.int8), TypeError, r"out_dtype"),
])
def test_bad_input_is_refused_before_any_launch(call, error, match):
    assert_rejected(lambda: call(torch.randn(4, 8), torch.randn(8, 6)), error, match)


def test_linear_module_keeps_torch_state_dict(device):
    torch.manual_seed(0)
    ref = torch.nn.Linear(40, 24).to(device)
    ours = snn.Linear(40, 24).to(device)
    assert_module_matches(ours, ref, seeded((3, 5, 40), device=device))
    assert ours.state_dict().keys() == ref.state_dict().keys()


def test_tma_allocator_is_set_in_every_thread():
    """Triton keeps its scratch allocator in a ContextVar: a thread that never set it (the
    autograd engine's GPU backward thread) has the null allocator. ensure_allocator runs
    before each descriptor launch, so the thread that launches has one (a once-only
    setting left matmul's TMA path failing on an H200: 'no allocator was set')."""
    import threading

    from triton.runtime import _allocation

    from speedlight.ops._gemm import ensure_allocator

    seen = {}

    def launch_side():
        seen["before"] = _allocation._allocator.get()
        ensure_allocator()
        seen["after"] = _allocation._allocator.get()

    ensure_allocator()  # the calling thread's setting does not reach a new thread
    t = threading.Thread(target=launch_side)
    t.start()
    t.join()
    assert isinstance(seen["before"], _allocation.NullAllocator)
    assert not isinstance(seen["after"], _allocation.NullAllocator)
