"""What is particular to speedlight.matmul on float8_e4m3fn operands (the contract test runs
matmul's quick suite in fp8 too: per-tensor and per-row scales, amax, epilogues, odd M and
N): several tiles and a K loop with a tail, the amax fold over tiles and programs, the
launches (fp8 kernel forward, bf16 kernel backward), bad input named before any launch, a
kernel that drops a scale failed by verify, torch.compile, the cost in fp8 bytes."""

import pytest
import torch

import speedlight
from speedlight.inspect.launches import capture_case
from speedlight.ops import matmul as op
from speedlight.verify import verify_case
from tests.conftest import gpu_target, needs_gpu
from tests.helpers import assert_rejected, assert_verified, case_maker

FP8 = torch.float8_e4m3fn
SPEC = op.SPEC
case = case_maker("matmul", "m", "n", "k")


def fp8_operands(m, n, k, seed=0, per_row=False):
    """a [m, k] and b = W^T (W [n, k] row-major) in e4m3 with their scales."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(FP8)
    b = torch.randn(n, k, generator=g).to(FP8).t()
    sa = torch.rand((m, 1) if per_row else (), generator=g) + 0.25
    sb = torch.rand((1, n) if per_row else (1,), generator=g) + 0.25
    return a, b, sa, sb


@pytest.mark.parametrize("flags", [
    pytest.param({"rowscale": True, "bias": True, "amax": True}, id="rowscale-bias-amax"),
    pytest.param({"act": "gelu", "residual": True, "scale": 0.25}, id="gelu-residual-scale"),
])
def test_several_tiles_and_a_k_loop_with_a_tail(flags, device):
    """Two row tiles and K = 144 in two steps (the second 16 wide) under the interpreter's
    128 tiles, forward and backward."""
    assert_verified(SPEC, case(150, 40, 144, FP8, linear=True, **flags), device)


@pytest.mark.parametrize("dtype", [FP8, torch.bfloat16], ids=["fp8", "bf16"])
def test_amax_is_the_max_of_the_stored_output_over_every_tile(dtype, device):
    """Four tiles over two persistent programs fold into one amax: exactly max |c| of what
    was stored (the tile's fp32 max rounded once equals the max of the rounded values)."""
    a, b, sa, sb = fp8_operands(150, 140, 32, per_row=True)
    a, b = a.to(device), b.to(device)
    kw = {"scale_a": sa.to(device), "scale_b": sb.to(device)} if dtype == FP8 else {}
    if dtype != FP8:
        a, b = a.to(dtype), b.to(dtype)
    c, amax = speedlight.matmul(a, b, activation="silu", return_amax=True, **kw)
    assert amax.dtype == torch.float32 and amax.shape == ()
    assert amax.item() == c.float().abs().max().item()


def test_amax_is_nan_where_the_output_has_a_nan(device):
    """A NaN in the epilogue's input (here the residual) makes amax NaN, as torch.amax: the
    NaN's bits are above +Inf's in the int32 order the fold uses."""
    a, b, sa, sb = fp8_operands(40, 24, 16)
    residual = torch.zeros(40, 24, dtype=torch.bfloat16)
    residual[7, 3] = float("nan")
    c, amax = speedlight.matmul(a.to(device), b.to(device), scale_a=sa.to(device),
                                scale_b=sb.to(device), residual=residual.to(device),
                                return_amax=True)
    assert torch.isnan(c[7, 3]) and torch.isnan(amax)


@needs_gpu("the Triton interpreter decodes e4m3fn's NaN (0x7F) as 480; the GPU's "
           "conversion gives NaN")
def test_a_nan_operand_gives_nan_rows_and_amax(device):
    a, b, sa, sb = fp8_operands(40, 24, 16)
    a[7, 3] = float("nan")
    c, amax = speedlight.matmul(a.to(device), b.to(device), scale_a=sa.to(device),
                                scale_b=sb.to(device), return_amax=True)
    assert torch.isnan(c[7]).all() and not torch.isnan(c[6]).any() and torch.isnan(amax)


def test_per_row_scale_of_a_batched_a(device):
    """a [B, S, K] with scale_a [B, S, 1]: the rows flattened, each its own scale."""
    a, b, sa, sb = fp8_operands(6, 24, 32, per_row=True)
    a, b, sa, sb = (t.to(device) for t in (a, b, sa, sb))
    flat = speedlight.matmul(a, b, scale_a=sa, scale_b=sb)
    batched = speedlight.matmul(a.view(2, 3, 32), b, scale_a=sa.view(2, 3, 1), scale_b=sb)
    assert batched.shape == (2, 3, 24) and batched.dtype == torch.bfloat16
    torch.testing.assert_close(batched.view(6, 24), flat, rtol=0, atol=0)


def test_forward_launches_the_fp8_kernel_and_the_backward_runs_in_bf16():
    launches = capture_case(SPEC, case(32, 48, 64, FP8, linear=True, rowscale=True), "cpu",
                            arch=90, mode="dry").launches
    assert [x.kernel for x in launches] == ["_matmul_fp8_kernel", "_matmul_kernel",
                                            "_matmul_kernel"]
    dtypes = [next(x.dtype for x in launch.args if x.name == "a_ptr") for launch in launches]
    assert dtypes == ["fp8", "bf16", "bf16"]


def _fp8(m=4, n=6, k=16):
    return fp8_operands(m, n, k)


def _off_by_one(a):
    """a's values in a view one byte past a 16-byte boundary (row stride still 16)."""
    return a.repeat(2, 1).view(-1)[1:1 + a.numel()].view(a.shape)


@pytest.mark.parametrize("call,error,match", [
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b), ValueError,
                 r"scale_a is required with float8_e4m3fn", id="no-scales"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa), ValueError,
                 r"scale_b is required", id="no-scale_b"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa.bfloat16(), scale_b=sb),
                 TypeError, r"scale_a must be a float32 tensor.*bfloat16", id="scale-dtype"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=torch.ones(4, 2),
                                                        scale_b=sb),
                 ValueError, r"scale_a must hold one value.*\(4, 1\).*\(4, 2\)",
                 id="scale_a-shape"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa,
                                                        scale_b=torch.ones(6, 1)),
                 ValueError, r"scale_b must hold one value.*\(1, 6\).*\(6, 1\)",
                 id="scale_b-shape"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa.to("meta"), scale_b=sb),
                 ValueError, r"scale_a is on meta", id="scale-device"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a.to(torch.float8_e5m2),
                                                        b.to(torch.float8_e5m2),
                                                        scale_a=sa, scale_b=sb),
                 TypeError, r"a must be a .*float8_e4m3fn tensor.*float8_e5m2", id="e5m2"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b.bfloat16(), scale_a=sa, scale_b=sb),
                 TypeError, r"one dtype.*float8_e4m3fn.*bfloat16", id="mixed-fp8-bf16"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a.bfloat16(), b.bfloat16(), scale_a=sa,
                                                        scale_b=sb),
                 ValueError, r"scale_a is the dequantization scale of float8_e4m3fn",
                 id="bf16-scales"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b.contiguous(), scale_a=sa, scale_b=sb),
                 ValueError, r"b \(float8_e4m3fn\) must be K-major", id="b-row-major"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a[:, :8].contiguous(),
                                                        b[:8].t().contiguous().t(),
                                                        scale_a=sa, scale_b=sb),
                 ValueError, r"a \(float8_e4m3fn\) must be K-major.*multiple of 16", id="k8"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(_off_by_one(a), b, scale_a=sa,
                                                        scale_b=sb),
                 ValueError, r"a \(float8_e4m3fn\) must start at a 16-byte aligned", id="a-base"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa, scale_b=sb,
                                                        out_dtype=FP8),
                 TypeError, r"out_dtype", id="fp8-out"),
    pytest.param(lambda a, b, sa, sb: speedlight.matmul(a, b, scale_a=sa, scale_b=sb,
                                                        return_amax=1),
                 TypeError, r"return_amax must be a bool", id="amax-flag"),
])
def test_bad_fp8_input_is_refused_before_any_launch(call, error, match):
    assert_rejected(lambda: call(*_fp8()), error, match)


def test_verify_fails_a_kernel_that_drops_the_per_column_scale(monkeypatch, device):
    """A launcher that dequantizes by scale_b's mean instead of each column's scale passes
    no check: the harness catches a wrong fp8 epilogue."""
    real = op.matmul_fwd

    def one_scale_for_b(*args, **kwargs):
        args = list(args)
        if len(args) > 9 and args[9] is not None:
            args[9] = args[9].mean().reshape(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(op, "matmul_fwd", one_scale_for_b)
    r = verify_case(SPEC, case(17, 48, 32, FP8, linear=True, rowscale=True), device)
    assert r.status == "fail" and "y" in [c.name for c in r.checks if not c.passed], r.reason


def test_torch_compile_traces_fp8_with_amax(device):
    torch._dynamo.reset()
    a, b, sa, sb = (t.to(device) for t in fp8_operands(17, 24, 32, per_row=True))
    bias = torch.randn(24, device=device, dtype=torch.bfloat16)

    def block(a, b, sa, sb, bias):
        c, amax = speedlight.matmul(a, b, scale_a=sa, scale_b=sb, bias=bias, activation="silu",
                                    return_amax=True)
        return c * 2, amax

    got = torch.compile(block, fullgraph=True, backend="aot_eager")(a, b, sa, sb, bias)
    torch.testing.assert_close(got, block(a, b, sa, sb, bias), rtol=0, atol=0)


def test_cost_counts_fp8_bytes():
    """Llama-3-8B's up projection at 4096 tokens: a and b one byte an element, the bf16
    output two, the per-tensor scales 4 each."""
    m, n, k = 4096, 14336, 4096
    fwd = SPEC.cost(case(m, n, k, FP8, linear=True), "fwd")
    assert fwd.bytes == m * k + k * n + 8 + 2 * m * n
    assert fwd.flops == 2 * m * n * k + 2 * m * n  # and the dequantization's two multiplies
    bf16 = SPEC.cost(case(m, n, k, torch.bfloat16, linear=True), "fwd")
    assert bf16.bytes == 2 * (m * k + k * n) + 2 * m * n


def test_launch_rule_gives_fp8_128_byte_k_steps_and_128_x_128_tiles():
    """BLOCK_K 128 (a 128-byte TMA row); 128 x 128 at prefill, since the partial sums
    promoted into a second fp32 accumulator spill at 128 x 256 (inspect: 96 bytes)."""
    from speedlight.launch import for_target
    from speedlight.ops import _gemm as gemm

    with for_target(gpu_target(132)):
        prefill = gemm.launch_config(4096, 14336, 4096, FP8, torch.device("cpu"))
        decode = gemm.launch_config(16, 4096, 4096, FP8, torch.device("cpu"))
    assert (prefill.block_m, prefill.block_n, prefill.block_k, prefill.num_warps,
            prefill.num_stages) == (128, 128, 128, 8, 4)
    assert (decode.block_m, decode.block_n, decode.block_k, decode.num_warps) == (64, 128, 128, 4)
