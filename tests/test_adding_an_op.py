"""docs/adding-an-op.md, followed step by step with a toy op: y = x * w + b over rows,
a Triton kernel, a second ("cuda") implementation through an extension-style function,
one registration, an OpSpec (weights laid out as the case says), and the tools' checks on
it. The page's own example, scale_shift, runs from the page in tests/ops/contract.py."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from speedlight import launch
from speedlight.ops._checks import check_same_device, check_tensor
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime
from speedlight.spec import Case, Cost, OpSpec, rand_tensor
from speedlight.verify import verify_case
from speedlight.verify.harness import LaunchCounter


# 1. the kernel (a team's kernels/<op>.py) --------------------------------------------------

@triton.jit
def _toy_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, stride_xm, stride_ym,
                    stride_w, stride_b, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = x * w + b. x_ptr, y_ptr [n_rows, n_cols] (row strides given, unit column
    stride); w_ptr, b_ptr [n_cols] (strides given). BLOCK_N >= n_cols."""
    offs_m = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    mask = (offs_m < n_rows)[:, None] & (offs_n < n_cols)[None, :]
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask).to(tl.float32)
    w = tl.load(w_ptr + offs_n * stride_w, mask=offs_n < n_cols).to(tl.float32)
    b = tl.load(b_ptr + offs_n * stride_b, mask=offs_n < n_cols).to(tl.float32)
    y = x * w[None, :] + b[None, :]  # [BM, BN] * [1, BN] + [1, BN] -> [BM, BN]
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
             y.to(y_ptr.dtype.element_ty), mask=mask)


# 2. launchers (a team's ops/<op>.py) -------------------------------------------------------

def toy_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y  # no launch on an empty input
    check_runtime(x, _toy_fwd_kernel)
    n_cols = x.shape[-1]
    x2, y2 = launch.as_rows(x, n_cols), y.view(-1, n_cols)
    block_m, block_n, num_warps = launch.row_tile(n_cols, x.device, max_block_n=4096)
    _toy_fwd_kernel[(triton.cdiv(x2.shape[0], block_m),)](
        x2, w, b, y2, x2.shape[0], n_cols, x2.stride(0), y2.stride(0), w.stride(0), b.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y


def toy_bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx = dy * w, dw = sum(dy * x), db = sum(dy) over rows (plain torch: a toy)."""
    dy2, x2 = dy.reshape(-1, x.shape[-1]).float(), x.reshape(-1, x.shape[-1]).float()
    return ((dy2 * w.float()).to(x.dtype).view(x.shape), (dy2 * x2).sum(0).to(w.dtype),
            dy2.sum(0).to(w.dtype))


# The CUDA C++ path in outline: `ext = torch.utils.cpp_extension.load(...)` on first use,
# each of its launching functions wrapped by launch.extension_kernel. A plain function
# stands in for the compiled one here, so the registration is exercised on any machine.
def _toy_fwd_extension(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor):
    torch.addcmul(b, x, w, out=y)


_toy_fwd_cuda_kernel = launch.extension_kernel(_toy_fwd_extension, "toy_fwd_cuda")


def toy_fwd_cuda(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        _toy_fwd_cuda_kernel(x, w, b, y)
    return y


# 3. one registration ---------------------------------------------------------------------

TOY = register_op(
    "toy_scale_shift", namespace="speedlight_tests",
    forward={"triton": toy_fwd, "cuda": toy_fwd_cuda},
    outputs=("y",),
    fake=lambda x, w, b: like(x),
    backward={"triton": toy_bwd, "cuda": toy_bwd},
    backward_fake=lambda dy, x, w: (like(x), like(w), like(w)),
    grads=("x", "w", "b"),
)


# 4. the public function: checks before any launch ----------------------------------------

def toy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, impl: str | None = None):
    check_tensor("x", x, min_dim=1)
    check_tensor("w", w)
    check_tensor("b", b)
    for name, t in (("w", w), ("b", b)):
        if tuple(t.shape) != (x.shape[-1],):
            raise ValueError(f"{name} must have shape ({x.shape[-1]},), got {tuple(t.shape)}")
    check_same_device(x=x, w=w, b=b)
    return TOY(x, w, b, impl=impl)


def toy_reference(x, w, b, impl=None):
    return x * w + b


# 5. the OpSpec ---------------------------------------------------------------------------

def _vector(n: int, case: Case, device, salt: int) -> torch.Tensor:
    """A [n] weight laid out as the case says: contiguous, else with stride 2."""
    if case.layout == "contiguous":
        return rand_tensor((n,), case, device, salt=salt)
    return rand_tensor((n, 2), case, device, layout="contiguous", salt=salt)[:, 0]


def _make_inputs(case: Case, device) -> dict:
    rows, cols = case["rows"], case["cols"]
    return {"x": rand_tensor((rows, cols), case, device),
            "w": _vector(cols, case, device, 1), "b": _vector(cols, case, device, 2),
            "impl": case.flag("impl")}


def _cost(case: Case, mode: str) -> Cost:
    m, n, e = case["rows"], case["cols"], case.dtype.itemsize
    if mode == "fwd":  # read x, w, b; write y. A multiply-add: 2 FLOP/elem.
        return Cost(flops=2 * m * n, bytes=2 * m * n * e + 2 * n * e)
    return Cost(flops=4 * m * n, bytes=3 * m * n * e + 3 * n * e)


def _cases(suite: str) -> list[Case]:
    def case(rows, cols, layout="contiguous", **flags):
        return Case("toy", (("rows", rows), ("cols", cols)), layout=layout, flags=flags)
    return [case(5, 33), case(3, 70, "strided"), case(3, 40, "strided", impl="cuda"),
            case(4, 16, impl="cuda"), case(0, 8)]


SPEC = OpSpec(name="toy", impl=toy, reference=toy_reference, make_inputs=_make_inputs,
              cost=_cost, suites={"quick": lambda: _cases("quick")},
              grad_inputs=("x", "w", "b"))


# 6. the tools' checks --------------------------------------------------------------------

@pytest.mark.parametrize("case", SPEC.cases("quick"), ids=lambda c: c.label)
def test_toy_op_verifies_against_float64(case, device):
    for dtype in (torch.float32, torch.bfloat16):
        r = verify_case(SPEC, case.with_(dtype=dtype), device)
        assert r.status == "pass", f"{case.id}: {r.status}: {r.reason}"
        assert r.checks


def test_launch_counting_sees_both_implementations(device):
    x = torch.randn(3, 8, device=device)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    for impl, kernel in (("triton", "_toy_fwd_kernel"), ("cuda", "toy_fwd_cuda")):
        counter = LaunchCounter()
        with counter.active():
            toy(x, w, b, impl=impl)
            toy(x[:0], w, b, impl=impl)  # empty: nothing launched
        assert counter.kernels == [kernel]


def test_impl_is_checked_and_compiles(device):
    x = torch.randn(3, 8, device=device, requires_grad=True)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    with pytest.raises(ValueError, match="no implementation 'rocm'.*triton, cuda"):
        toy(x, w, b, impl="rocm")
    compiled = torch.compile(lambda x: toy(x, w, b, impl="cuda") * 2, fullgraph=True,
                             backend="aot_eager")
    y = compiled(x)
    (gx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(y, (x * w + b) * 2)
    torch.testing.assert_close(gx, (2 * w).expand(3, 8))


def test_the_recipe_example_kernel_passes_the_byte_guard():
    """docs/adding-an-op.md's scale_shift, as the page writes it, run under the interpreter
    at an aligned shape with the rows inspect's byte guard holds a kernel at (enough per SM
    of the H200 it is sized for): its forward moves at most the default design's bytes per
    compulsory byte (KernelDesign().bytes_ratio), as `speedlight inspect --check` holds it."""
    from speedlight.inspect.guard import AMORTISED_ROWS_PER_SM
    from speedlight.inspect.launches import capture_case
    from speedlight.spec import KernelDesign
    from speedlight.target import resolve
    from tests.ops.contract import recipe_module

    spec, target = recipe_module().SPEC, resolve("h200")
    rows = AMORTISED_ROWS_PER_SM * target.sku.sm_count
    case = Case("scale_shift", (("rows", rows), ("cols", 256)), dtype=torch.bfloat16)
    with launch.for_target(target):
        capture = capture_case(spec, case, "cpu", arch=target.arch, mode="run", backward=False)
    moved = sum(k.loaded + k.stored for k in capture.direction("fwd"))
    compulsory = spec.cost(case, "fwd").bytes
    assert compulsory <= moved <= KernelDesign().bytes_ratio * compulsory, moved / compulsory
