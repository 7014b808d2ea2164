"""Residual add fused with RMSNorm, the entry of every pre-norm (Llama-style) block:
h = x + residual, y = h / sqrt(mean(h^2) + eps) * (offset + w); returns (y, h).

One pass over memory forward (read x, residual, w; write y, h, rstd). The backward takes
the gradients of both outputs, since h continues down the residual stream:
dx = dresidual = dh + RMSNorm'(h)^T dy, one tensor written once. The kernels are RMSNorm's
own (kernels/rms_norm.py) with the residual switches on, so the math has one copy.
"""

from __future__ import annotations

import torch

from speedlight import shapes
from speedlight.ops import rms_norm_cuda as cuda
from speedlight.ops._checks import check_bool, check_same_device, check_same_dtype, check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._suites import norm_cases, norm_chains, skip_huge_on_cpu
from speedlight.ops.registration import like, register_op, row_stats
from speedlight.ops.rms_norm import (CUDA_DESIGNS, CUDA_SOURCE, LAUNCHERS, check_norm_args,
                                     cuda_launches, model_norm_flags)
from speedlight.ops.rms_norm import _case_of as rms_norm_case_of
from speedlight.ops.rms_norm import cost as rms_norm_cost
from speedlight.ops.rms_norm import make_inputs as rms_norm_inputs
from speedlight.spec import Case, Cost, CudaKernels, KernelDesign, OpSpec, rand_tensor

_PARTIALS = ("each program reads w once and writes one fp32 row of dw partial sums, which "
             "the column sum reads: 1 + P(e + 8)/(4e rows) of compulsory, with P at most one "
             "program per SM or per 4 rows: ~1.04x at 4096 rows, at most ~1.32x")


# --- launchers (usable without autograd): RMSNorm's, with the residual ---------------------

add_rms_norm_fwd = LAUNCHERS.add_rms_norm_fwd
add_rms_norm_infer = LAUNCHERS.add_rms_norm_infer
add_rms_norm_bwd = LAUNCHERS.add_rms_norm_bwd
add_rms_norm_inplace_bwd = LAUNCHERS.add_rms_norm_inplace_bwd


# --- registration: custom ops, fakes and autograd -----------------------------------------

# What the plain and the in-place op share: they differ only in the backward.
# Two implementations: RMSNorm's Triton kernels and its CUDA C++ ones (ops/rms_norm_cuda.py).
_ADD_RMS_NORM_OP = dict(
    forward={"triton": add_rms_norm_fwd, "cuda": cuda.add_rms_norm_fwd},
    outputs=("y", "h", "rstd"),
    stats=("rstd",),
    fake=lambda x, residual, weight, eps, offset: (like(x), like(x), row_stats(x)),
    inference={"triton": add_rms_norm_infer, "cuda": cuda.add_rms_norm_infer},
    unverified=cuda.UNVERIFIED,
    # x and residual enter h with coefficient 1: both receive dh_total (autograd copies
    # it before accumulating, so the two .grad tensors never alias)
    grads=(("x", "residual"), "weight"),
)

ADD_RMS_NORM = register_op(
    "add_rms_norm",
    **_ADD_RMS_NORM_OP,
    backward={"triton": add_rms_norm_bwd, "cuda": cuda.add_rms_norm_bwd},
    backward_fake=lambda dy, dh, h, weight, rstd, offset: (like(h), like(weight)),
    optional_grads=True,  # h alone, or y alone, may be used
)



# The in-place backward writes over dy, the gradient of the norm's output (not dh: the
# residual stream's gradient is the same tensor as the next block's input gradient).
# Gradients are materialized (zeros for an output left unused), so dy is always a tensor
# of this op's own to write over.
ADD_RMS_NORM_INPLACE = register_op(
    "add_rms_norm_inplace", **_ADD_RMS_NORM_OP,
    backward={"triton": add_rms_norm_inplace_bwd, "cuda": cuda.add_rms_norm_inplace_bwd},
    backward_mutates=("dy",))


# --- public function ---------------------------------------------------------------------

@local_rows("x", "residual")
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6, offset: float = 0.0, *, in_place: bool = False,
                 impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): h = x + residual and y = RMSNorm(h) over the last dim, in one pass.

    x, residual: [..., hidden] of one dtype (float32/float16/bfloat16), any strides, of one
    shape or shapes that broadcast as in `x + residual` (y and h then have the broadcast
    shape, and each gradient is summed back to its input's shape); h is rounded to that
    dtype before it is normalized, as an unfused `h = x + residual; y = norm(h)` computes
    it. weight: [hidden] or None. offset: 1.0 for Gemma's (1 + w) form. Returns y and h,
    contiguous, of that shape and x's dtype.
    Differentiable in x, residual and weight (gradients flow in through both y and h);
    works under torch.compile(fullgraph=True).

    in_place: the backward writes the gradient of x and residual over the gradient of y
    it receives (never over h's, the residual stream's), so it allocates nothing of x's
    size; only where y's gradient goes nowhere else, as for rms_norm's in_place (y feeding
    linear layers, as a pre-norm block's does).

    impl: "triton" or "cuda" forces one; None runs the op's default (as rms_norm's).
    """
    check_tensor("x", x, min_dim=1)
    check_tensor("residual", residual)
    check_same_dtype(x=x, residual=residual)
    check_same_device(x=x, residual=residual)
    x, residual = broadcast_residual(x, residual)
    check_norm_args(x, weight, eps, offset)
    check_bool("in_place", in_place)
    op = ADD_RMS_NORM_INPLACE if in_place else ADD_RMS_NORM
    cuda.check_impl(op, impl, x)
    return op(x, residual, weight, float(eps), float(offset), impl=impl)


def broadcast_residual(x: torch.Tensor, residual: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """x and residual expanded (views) to the shape of `x + residual`, as torch broadcasts
    it; ValueError naming residual when the shapes do not broadcast (rows of different
    tokens are never added)."""
    if residual.shape == x.shape:
        return x, residual
    try:
        shape = torch.broadcast_shapes(x.shape, residual.shape)
    except RuntimeError:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)} or one that broadcasts "
                         f"with it, got {tuple(residual.shape)}") from None
    return x.expand(shape), residual.expand(shape)


# --- OpSpec --------------------------------------------------------------------------------

def make_inputs(case: Case, device) -> dict:
    # x, weight, eps and offset as the rms_norm spec draws them (see there), and a residual
    # stream larger than the block's output, as it grows through a model
    inputs = rms_norm_inputs(case, device)
    scale = 4e-3 if case["hidden"] == 1 else 4.0  # keeps h^2 ~ eps over one column
    residual = rand_tensor((case["rows"], case["hidden"]), case, device, salt=2, scale=scale)
    return {**inputs, "residual": residual}


def cost(case: Case, mode: str) -> Cost:
    """RMSNorm's cost on h, plus the residual's: the forward also reads residual and
    writes h (1 FLOP per elem, the add); the backward also reads dh (1 FLOP, adding it)."""
    m, n = case["rows"], case["hidden"]
    tensors = 2 if mode == "fwd" else 1
    return rms_norm_cost(case, mode) + Cost(flops=m * n,
                                            bytes=tensors * m * n * case.dtype.itemsize)


_TWO_PASS_BWD = ("a row longer than 16384 is read twice (dy and h: the row dot, then dx "
                 "with dh) plus dw partial rows")

def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The residual stream of a pre-norm block: h = x + residual, then its RMSNorm."""
    if cfg.norm != "rms":
        return []
    return [Case("add_rms_norm", (("rows", batch * seq), ("hidden", cfg.hidden)),
                 flags=model_norm_flags(cfg), model=cfg.name)]


SPEC = OpSpec(
    impl=add_rms_norm,
    implementations=cuda.implementations(add_rms_norm, ADD_RMS_NORM),
    for_model=for_model,
    case_of=lambda call, args: rms_norm_case_of("add_rms_norm", call, args),
    recognise=lambda graph, calls: norm_chains(graph, calls, "add_rms_norm"),
    fuses="residual add + RMSNorm, returning both the sum and the norm",
    peers={"liger": "liger_fused_add_rms_norm"},
    patches="decoder_layer",
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(lambda suite: norm_cases(
        "add_rms_norm", suite, model_flags=model_norm_flags,
        full_variants=[{"weight": False}, {"in_place": True}],
        quick_variants=[(3, 7, {"weight": False}), (37, 128, {"offset": 1}),
                        (37, 128, {"in_place": True})])),
    grad_inputs=("x", "residual", "weight"),
    skip=skip_huge_on_cpu,
    notes="h = x + residual then RMSNorm(h), both returned; RMSNorm's kernels with the "
          "residual fused; dx = dresidual written once.",
    # RMSNorm's kernels with the residual switches on, held to this op's compulsory bytes
    kernels={
        "_rms_norm_fwd_kernel": KernelDesign(min_occupancy=0.5),
        "_rms_norm_fwd_looped_kernel": KernelDesign(bytes_ratio=1.3, why=(
            "a row longer than 16384 does not fit registers: h is written, then read back "
            "(mostly from L2) for the write of y")),
        "_rms_norm_bwd_kernel": KernelDesign(min_occupancy=0.25, bytes_ratio=1.35, why=_PARTIALS),
        "_column_sum_kernel": KernelDesign(bytes_ratio=1.35, why=_PARTIALS),
        "_rms_norm_bwd_row_dot_kernel": KernelDesign(bytes_ratio=1.8, why=_TWO_PASS_BWD),
        "_rms_norm_bwd_dx_kernel": KernelDesign(bytes_ratio=1.8, why=_TWO_PASS_BWD),
        **CUDA_DESIGNS,  # csrc/rms_norm.cu with the residual fused
    },
    cuda=CudaKernels(CUDA_SOURCE, cuda_launches),
)
