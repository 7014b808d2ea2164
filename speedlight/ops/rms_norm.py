"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * (offset + w) over the last dim.

offset=1 is the Gemma form (weights stored as w - 1). Accumulation is fp32 whatever the
input dtype; y has x's dtype, dw has w's dtype.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import triton

from speedlight import launch, shapes
from speedlight.kernels.rms_norm import (
    _rms_norm_bwd_dx_kernel,
    _rms_norm_bwd_kernel,
    _rms_norm_bwd_row_dot_kernel,
    _rms_norm_fwd_kernel,
    _rms_norm_fwd_looped_kernel,
)
from speedlight.launch import (
    CUDA_TYPES,
    as_rows,
    pipeline_depth,
    planned_sm_count,
    planned_warp_size,
    persistent_row_grid,
)
from speedlight.ops import rms_norm_cuda as cuda
from speedlight.ops._checks import check_bool, check_same_device, check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._partials import (bwd_programs_per_sm, norm_bwd_grid, partial_programs,
                                      sum_partials)
from speedlight.ops._rms_norm_launchers import RmsNormLaunchers
from speedlight.ops._suites import (is_call_of, norm_cases, norm_chains, rows_case,
                                    skip_huge_on_cpu)
from speedlight.ops.registration import like, register_op, row_stats
from speedlight.runtime import check_runtime
from speedlight.spec import (Case, Cost, CudaKernels, CudaLaunch, KernelDesign, OpSpec,
                             dtype_name, inject_nonfinite, rand_tensor)
from speedlight.tuning import Configs

MAX_FUSED_N = 16384  # rows up to this many columns are held in registers
LOOP_BLOCK_N = 4096  # chunk of a longer row
# Persistent forward on a GPU: one row per tile from 4096 wide (16 values per lane: a
# 8192-wide row on 16 warps), tiles of several rows of 4096 values below (8 values per lane:
# the rescue of an extreme row then fits 64 registers), FWD_WARPS_PER_SM resident warps.
FWD_TILE = 4096
FWD_WARPS_PER_SM = 32
FWD_VALUES_PER_LANE = {True: 16, False: 8}  # one row per tile, several
SPLIT_PROGRAMS_PER_SM = 4  # rows longer than MAX_FUSED_N: row-block programs per SM
SPLIT_BLOCK_M, SPLIT_BLOCK_N = 4, 1024

# The persistent forward's tile and grid, keyed by (hidden, dtype, SM count); a tuned
# table's entry per hidden size and dtype (`speedlight tune rms_norm` sweeps the space).
RMS_NORM_CONFIGS = Configs(
    "rms_norm", space={"tile": (2048, 4096, 8192, 16384), "warps_per_sm": (16, 32, 48, 64)},
    default=lambda key: {"tile": max(FWD_TILE, triton.next_power_of_2(key[0])),
                         "warps_per_sm": FWD_WARPS_PER_SM},
    bucket=lambda key: f"hidden{key[0]}-{dtype_name(key[1])}")


# --- launchers (usable without autograd) --------------------------------------------------

def rms_norm_residual_fwd(x: torch.Tensor, residual: torch.Tensor | None,
                          weight: torch.Tensor | None, eps: float, offset: float,
                          store_rstd: bool = True
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """y, h and rstd of RMSNorm over h = x + residual (h is None and x is normalized when
    residual is None: plain RMSNorm). y and h are contiguous, of x's shape and dtype; rstd
    is [rows] fp32, or None when store_rstd is False (no backward will read it)."""
    n_cols = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    n_rows = x.numel() // n_cols if n_cols else 0
    rstd = (torch.empty(n_rows, dtype=torch.float32, device=x.device) if store_rstd
            else None)
    if x.numel() == 0:
        return y, h, rstd
    check_runtime(x, _rms_norm_fwd_kernel)
    x2 = as_rows(x, n_cols)
    y2 = y.view(-1, n_cols)
    # placeholder pointers for the inputs a constexpr switches off
    r2 = as_rows(residual, n_cols) if residual is not None else x2
    h2 = h.view(-1, n_cols) if h is not None else y2
    w = weight.contiguous() if weight is not None else x2  # the kernels step w by 1
    args = (x2, r2, w, y2, h2, rstd if store_rstd else y2)
    strides = (x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1), y2.stride(0))
    switches = dict(HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
                    STORE_RSTD=store_rstd)
    if n_cols <= MAX_FUSED_N:
        # Persistent: a grid of as many programs as fit (FWD_WARPS_PER_SM warps per SM)
        # walks the row tiles, so w is read once per program, not once per tile.
        config = launch.config(RMS_NORM_CONFIGS, (n_cols, x.dtype, planned_sm_count(x.device)),
                               x.device)
        one_row = triton.next_power_of_2(n_cols) >= config["tile"]
        grid, block_m, block_n, num_warps = persistent_row_grid(
            n_rows, n_cols, x.device, max_block_n=MAX_FUSED_N, **config,
            values_per_lane=FWD_VALUES_PER_LANE[one_row])
        # each stage of the pipeline holds a tile of x (and of the residual)
        stages = pipeline_depth(
            block_m * block_n * x.element_size() * (1 + (residual is not None)),
            max(1, config["warps_per_sm"] // num_warps), x.device)
        _rms_norm_fwd_kernel[grid](
            *args, n_rows, n_cols, *strides, eps, offset, **switches,
            BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=num_warps)
    else:
        _rms_norm_fwd_looped_kernel[(n_rows,)](
            *args, n_cols, *strides, eps, offset, **switches,
            BLOCK_N=LOOP_BLOCK_N, num_warps=8)
    return y, h, rstd


def rms_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                 rstd: torch.Tensor, offset: float, dh: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dx (x's shape and dtype) and dw (w's dtype; None without a weight).

    dh: a gradient that already reaches x by another path (the residual stream, when x is
    h = x_in + residual), added to dx in fp32 before the one rounding.
    out: where dx is written (contiguous, x's shape and dtype), e.g. dy itself: every
    element of dy (and dh) is read by the program that writes the same element of dx,
    before it writes it, so dx may be written over them.
    """
    n_cols = x.shape[-1]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    has_weight = weight is not None
    if x.numel() == 0:
        dw = torch.zeros_like(weight) if has_weight else None
        return dx, dw
    check_runtime(x, _rms_norm_bwd_kernel)
    n_rows = x.numel() // n_cols
    x2 = as_rows(x, n_cols)
    dy2 = as_rows(dy, n_cols)
    dh2 = as_rows(dh, n_cols) if dh is not None else dy2  # placeholder when HAS_DH=False
    dx2 = dx.view(-1, n_cols)
    w = weight.contiguous() if has_weight else x2  # the kernels step w by 1
    fused = n_cols <= MAX_FUSED_N
    if fused:
        block_m, block_n, num_warps, n_programs = norm_bwd_grid(n_rows, n_cols, x.device)
    else:
        block_m, block_n, num_warps = SPLIT_BLOCK_M, SPLIT_BLOCK_N, 4
        n_programs = partial_programs(triton.cdiv(n_rows, block_m), SPLIT_PROGRAMS_PER_SM,
                                      x.device)
    dw_partial = torch.empty((n_programs, n_cols) if has_weight else (1,),
                             dtype=torch.float32, device=x.device)
    strides = (dy2.stride(0), dy2.stride(1), x2.stride(0), x2.stride(1),
               dh2.stride(0), dh2.stride(1), dx2.stride(0))
    switches = dict(HAS_DH=dh is not None, HAS_WEIGHT=has_weight)
    if fused:
        # each stage of the pipeline holds a tile of dy and of x (and of dh)
        stages = pipeline_depth(block_m * block_n * x.element_size() * (2 + (dh is not None)),
                                bwd_programs_per_sm(block_n, num_warps), x.device)
        _rms_norm_bwd_kernel[(n_programs,)](
            dy2, x2, w, rstd, dh2, dx2, dw_partial, n_rows, n_cols,
            *strides, offset, **switches, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
            num_warps=num_warps)
    else:
        c = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        _rms_norm_bwd_row_dot_kernel[(n_rows,)](
            dy2, x2, w, rstd, c, n_cols, *strides[:4], offset,
            HAS_WEIGHT=has_weight, BLOCK_N=LOOP_BLOCK_N, num_warps=8)
        grid = (n_programs, triton.cdiv(n_cols, block_n))
        # 128 lanes (4 warps of 32, 2 waves of 64): 8 values of a 1024-wide row of w each,
        # one 128-bit load in bf16
        _rms_norm_bwd_dx_kernel[grid](
            dy2, x2, w, rstd, c, dh2, dx2, dw_partial, n_rows, n_cols,
            *strides, offset, **switches, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=128 // planned_warp_size(x.device))
    dw = sum_partials(dw_partial, weight.dtype)[0] if has_weight else None
    return dx, dw


# rms_norm_fwd, rms_norm_infer, rms_norm_inplace_bwd (and add_rms_norm's launchers) from
# the two above, as the CUDA C++ implementation makes its own from its two
LAUNCHERS = RmsNormLaunchers(rms_norm_residual_fwd, rms_norm_bwd)
rms_norm_fwd = LAUNCHERS.rms_norm_fwd
rms_norm_infer = LAUNCHERS.rms_norm_infer
rms_norm_inplace_bwd = LAUNCHERS.rms_norm_inplace_bwd


# --- registration: custom ops, fakes and autograd -----------------------------------------

# What the plain and the in-place op share: they differ only in the backward.
# Two implementations: the Triton kernels above and the CUDA C++ ones (ops/rms_norm_cuda.py).
_RMS_NORM_OP = dict(
    forward={"triton": rms_norm_fwd, "cuda": cuda.rms_norm_fwd},
    outputs=("y", "rstd"),
    stats=("rstd",),
    fake=lambda x, weight, eps, offset: (like(x), row_stats(x)),
    inference={"triton": rms_norm_infer, "cuda": cuda.rms_norm_infer},
    grads=("x", "weight"),
    unverified=cuda.UNVERIFIED,
)

RMS_NORM = register_op(
    "rms_norm",
    **_RMS_NORM_OP,
    backward={"triton": rms_norm_bwd, "cuda": cuda.rms_norm_bwd},
)


# The in-place backward: dx is written over the incoming gradient dy (mutation declared to
# torch), so the backward allocates nothing of x's size. Safe only where dy reaches no
# other consumer: see rms_norm's `in_place`.
RMS_NORM_INPLACE = register_op(
    "rms_norm_inplace", **_RMS_NORM_OP,
    backward={"triton": rms_norm_inplace_bwd, "cuda": cuda.rms_norm_inplace_bwd},
    backward_mutates=("dy",))


# --- public function ---------------------------------------------------------------------

@local_rows("x")
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             offset: float = 0.0, *, in_place: bool = False,
             impl: str | None = None) -> torch.Tensor:
    """RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * (offset + weight).

    x: [..., hidden] float32/float16/bfloat16, any strides. weight: [hidden] or None
    (no scale). offset: 1.0 for Gemma's (1 + w) form. Returns a tensor of x's shape and
    dtype. Differentiable in x and weight; works under torch.compile(fullgraph=True).

    in_place: the backward writes dx over the gradient of y it receives, so it allocates
    nothing of x's size, when nothing else can read that gradient; otherwise it writes
    into a copy (the result is the same). Copied: the caller's own tensor when y is the
    root of backward (`y.backward(g)` leaves g alone), a gradient another consumer of y
    has yet to take (an add's, handed to both operands), one a hook on y or on a view of
    y may keep; y.retain_grad() keeps a copy of its own. What it cannot see: a gradient
    a hook on y's view stored as another view of the same tensor after the check, or one
    kept by Python code outside autograd's hooks. Under torch.compile the compiler owns
    the buffers. speedlight.patch turns it on for norms whose output feeds linear layers
    alone, where the gradient is the linear layers' fresh one.

    impl: "triton" or "cuda" (CUDA C++, built on first use; a CUDA build of torch and
    nvcc/ninja needed) forces one; None runs the op's default (Triton until a GPU run has
    verified the CUDA one, see RMS_NORM.default).
    """
    check_tensor("x", x, min_dim=1)
    check_norm_args(x, weight, eps, offset)
    check_bool("in_place", in_place)
    op = RMS_NORM_INPLACE if in_place else RMS_NORM
    cuda.check_impl(op, impl, x)
    return op(x, weight, float(eps), float(offset), impl=impl)


def check_norm_args(x: torch.Tensor, weight: torch.Tensor | None, eps, offset) -> None:
    """The checks every RMSNorm entry point shares: weight [hidden] on x's device (or None,
    then no offset), eps a finite non-negative number."""
    if weight is not None:
        check_tensor("weight", weight)
        if tuple(weight.shape) != (x.shape[-1],):
            raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last dim, "
                             f"got {tuple(weight.shape)} (x has shape {tuple(x.shape)})")
        check_same_device(x=x, weight=weight)
    elif offset:
        raise ValueError(f"offset={offset} scales a weight, but weight is None")
    if not isinstance(offset, (int, float)) or isinstance(offset, bool):
        raise TypeError(f"offset must be a number (1.0 for Gemma's (1 + w) form), "
                        f"got {offset!r}")
    check_eps(eps)


def check_eps(eps) -> None:
    """eps of a norm: a finite non-negative number (NaN would pass a plain `eps < 0`)."""
    if (not isinstance(eps, (int, float)) or isinstance(eps, bool)
            or not math.isfinite(eps) or eps < 0):
        raise ValueError(f"eps must be a finite non-negative number, got {eps!r}")


# --- OpSpec --------------------------------------------------------------------------------

def model_norm_flags(model: shapes.ModelConfig) -> dict:
    """The case flags of a model's RMSNorm: Gemma's (1 + w) form where the model has it."""
    return {"offset": 1} if model.norm_offset else {}


def make_inputs(case: Case, device) -> dict:
    rows, hidden = case["rows"], case["hidden"]
    # Over one column y = x / sqrt(x^2 + eps) * w, whose gradient w * eps / (x^2 + eps)^1.5
    # is all cancellation unless x^2 ~ eps: draw x at that scale so the case stays
    # well-conditioned and tests the kernel, not float32.
    x = rand_tensor((rows, hidden), case, device, scale=1e-3 if hidden == 1 else 1.0)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    offset = float(case.flag("offset", 0.0))
    weight = None
    if case.flag("weight", True):
        # Gemma stores w - 1 (near 0); plain RMSNorm weights sit near 1.
        weight = rand_tensor((hidden,), case, device, layout="contiguous", salt=1, scale=0.2,
                             shift=0.0 if offset else 1.0)
    inputs = {"x": x, "weight": weight, "eps": 1e-6, "offset": offset}
    if case.flag("in_place"):
        inputs["in_place"] = True
    return inputs


def cost(case: Case, mode: str) -> Cost:
    m, n = case["rows"], case["hidden"]
    e = case.dtype.itemsize
    w = n * e if case.flag("weight", True) else 0
    if mode == "fwd":
        # read x, w; write y, rstd (fp32, kept for the backward). sum(x^2): 2 FLOP/elem;
        # x * rstd * w': 2.
        return Cost(flops=4 * m * n, bytes=2 * m * n * e + w + 4 * m, saved=4 * m)
    # read dy, x, w, rstd; write dx, dw. FLOP: xhat 1, dxhat 1, c 2, dx 3, dw 2 per elem.
    return Cost(flops=9 * m * n, bytes=3 * m * n * e + 2 * w + 4 * m)


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    if cfg.norm != "rms":
        return []
    return [Case("rms_norm", (("rows", batch * seq), ("hidden", cfg.hidden)),
                 flags=model_norm_flags(cfg), model=cfg.name)]


def _case_of(op: str, call: str, args) -> Case | None:
    """The Case of a call of rms_norm's (or add_rms_norm's) registered ops, in place or
    not: x (h in add_rms_norm's backward) over its rows, with a weight or not, and Gemma's
    offset."""
    in_place = is_call_of(call, f"{op}_inplace")
    if not (in_place or is_call_of(call, op)):
        return None
    x = args["x"] if "x" in args else args["h"]
    return rows_case(op, x, "hidden", weight=False if args["weight"] is None else None,
                     offset=1 if args.get("offset") else None, in_place=in_place or None)


CUDA_DESIGNS = {
    "rms_norm_fwd_kernel": KernelDesign(min_occupancy=0.5),
    # 64 registers/thread (launch bounds of 1024 threads) and the dw sums in shared memory
    "rms_norm_bwd_kernel": KernelDesign(min_occupancy=0.5),
    # one fp32 partial per column per program, summed down a column: 32-bit by design
    "rms_norm_dw_reduce_kernel": KernelDesign(vector_bits=32),
}

_PARTIALS = ("each program reads w once and writes one fp32 row of dw partial sums, which "
             "the column sum reads: 1 + P(e + 8)/(3e rows) of compulsory, with P at most one "
             "program per SM or per 4 rows: ~1.05x at 4096 rows, at most ~1.42x")
_TWO_PASS = ("a row longer than 16384 does not fit registers: it is read twice, for the "
             "sum of squares and for the write (the second read mostly from L2)")
_TWO_PASS_BWD = ("a row longer than 16384 is read twice (dy and x: the row dot, then dx) "
                 "plus dw partial rows")

CUDA_SOURCE = str(Path(__file__).resolve().parent.parent / "csrc" / "rms_norm.cu")


def cuda_launches(case: Case, sm_count: int) -> list[CudaLaunch]:
    """The launches of the CUDA C++ RMSNorm (csrc/rms_norm.cu) for a case on a GPU of
    `sm_count` SMs, sized as its launcher sizes them: the forward, then (the op takes
    gradients) the backward and, with a weight, the dw reduce. add_rms_norm launches the
    same kernels at the same geometry (with its residual and dh pointers set)."""
    rows, hidden = case["rows"], case["hidden"]
    t = CUDA_TYPES[case.dtype]
    weight = bool(case.flag("weight", True))
    out = []
    if rows and hidden:
        grid, threads = cuda.cuda_row_launch(rows, hidden, case.dtype, sm_count)
        out.append(CudaLaunch("rms_norm_fwd_kernel", t, grid, threads))
    if not hidden or not (rows or weight):
        return out
    smem = cuda.cuda_shared_dw_bytes(hidden) if weight else 0
    grid, threads = cuda.cuda_row_launch(rows, hidden, case.dtype, sm_count, backward=True,
                                    weight=weight)
    out.append(CudaLaunch("rms_norm_bwd_kernel", f"{t}, {'true' if smem else 'false'}", grid,
                          threads, smem, "bwd"))
    if weight:
        grid, threads = cuda.cuda_column_launch(hidden)
        out.append(CudaLaunch("rms_norm_dw_reduce_kernel", t, grid, threads, 0, "bwd"))
    return out


SPEC = OpSpec(
    impl=rms_norm,
    implementations=cuda.implementations(rms_norm, RMS_NORM),
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(lambda suite: norm_cases(
        "rms_norm", suite, model_flags=model_norm_flags,
        full_variants=[{"weight": False}, {"in_place": True}],
        quick_variants=[(3, 7, {"weight": False}), (5, 781, {"weight": False}),
                        (37, 128, {"offset": 1}), (37, 128, {"in_place": True})])),
    grad_inputs=("x", "weight"),
    skip=skip_huge_on_cpu,
    notes="Normalizes the last dim; fp32 accumulation; dW reduced per program, then summed and "
          "cast in one launch.",
    for_model=for_model,
    case_of=lambda call, args: _case_of("rms_norm", call, args),
    recognise=lambda graph, calls: norm_chains(graph, calls, "rms_norm"),
    fuses="RMSNorm in one kernel per direction",
    peers={"liger": "liger_rms_norm"},
    patches="rms_norm",
    kernels={
        # its persistent grid is sized for 32 resident warps per SM (FWD_WARPS_PER_SM),
        # under 64 registers with the rescue branch (8 values per lane for tiles of rows)
        "_rms_norm_fwd_kernel": KernelDesign(min_occupancy=0.5),
        "_rms_norm_fwd_looped_kernel": KernelDesign(bytes_ratio=1.5, why=_TWO_PASS),
        # 50% from 4096 wide (8 values per lane, 32 warps, ~60 registers); narrower rows
        # hold 16 values per lane on 8 warps (~115 registers: 25%)
        "_rms_norm_bwd_kernel": KernelDesign(min_occupancy=0.25, bytes_ratio=1.45, why=_PARTIALS),
        "_column_sum_kernel": KernelDesign(bytes_ratio=1.45, why=_PARTIALS),
        "_rms_norm_bwd_row_dot_kernel": KernelDesign(bytes_ratio=2.0, why=_TWO_PASS_BWD),
        "_rms_norm_bwd_dx_kernel": KernelDesign(bytes_ratio=2.0, why=_TWO_PASS_BWD),
        # CUDA C++ (csrc/rms_norm.cu): 16-byte vectors over rows, grids of the blocks
        # resident at once (launch.cuda_row_launch), no spills
        **CUDA_DESIGNS,
    },
    cuda=CudaKernels(CUDA_SOURCE, cuda_launches),
    configs=RMS_NORM_CONFIGS,
)
