"""A team's own op, verified by the same harness as speedlight's built-in ones:

    speedlight verify --spec examples/relu_squared.py --only-spec

relu(x)^2 (Primer's activation), a Triton kernel for the forward and the backward, and the
OpSpec that tells speedlight how to make inputs, what the op costs and which cases to run.
"""

import torch
import triton
import triton.language as tl

from speedlight import shapes
from speedlight.spec import Case, Cost, OpSpec, rand_tensor


@triton.jit
def _relu_squared_kernel(x_ptr, dy_ptr, out_ptr, n, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """forward: out = relu(x)^2; backward: out = dy * 2 * relu(x). All pointers [n]."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = tl.maximum(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32), 0.0)
    if BACKWARD:
        out = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32) * 2.0 * r
    else:
        out = r * r
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x, dy=None):
    x = x.contiguous()
    out = torch.empty_like(x)
    if x.numel():
        grid = (triton.cdiv(x.numel(), 1024),)
        _relu_squared_kernel[grid](x, dy.contiguous() if dy is not None else x, out, x.numel(),
                                   BACKWARD=dy is not None, BLOCK=1024)
    return out


class _ReluSquared(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _launch(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _launch(x, dy)


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return _ReluSquared.apply(x)


def relu_squared_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x).pow(2)


def _cases(suite):
    return [Case("relu_squared", {"rows": r, "cols": c}, model=m)
            for r, c, m in shapes.rows_and_width(suite, "intermediate")]


SPEC = OpSpec(
    name="relu_squared",
    impl=lambda x: relu_squared(x),
    reference=lambda x: relu_squared_reference(x),
    make_inputs=lambda case, device: {"x": rand_tensor((case["rows"], case["cols"]), case, device)},
    # forward: read x, write y (2 FLOP/elem); backward: read x, dy, write dx (2 FLOP/elem)
    cost=lambda case, mode: Cost(2 * case["rows"] * case["cols"],
                                 (2 if mode == "fwd" else 3) * case["rows"] * case["cols"]
                                 * case.dtype.itemsize),
    suites=shapes.suites(_cases),
    grad_inputs=("x",),
)
