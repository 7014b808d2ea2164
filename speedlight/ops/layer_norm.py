"""LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b over the trailing dims.

The contract of torch.nn.functional.layer_norm: biased variance, weight and bias each
optional, normalized_shape any number of trailing dims (flattened into one row). fp32
statistics whatever the input dtype; y has x's dtype, dw and db those of w and b.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import triton

from speedlight import shapes
from speedlight.kernels.layer_norm import (
    _layer_norm_bwd_kernel,
    _layer_norm_bwd_row_dot_kernel,
    _layer_norm_fwd_kernel,
    _layer_norm_fwd_looped_kernel,
)
from speedlight.launch import as_rows, persistent_row_grid, pipeline_depth
from speedlight.ops._checks import check_same_device, check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._partials import (BWD_WIDE, bwd_programs_per_sm, norm_bwd_grid,
                                      partial_programs, sum_partials)
from speedlight.ops._suites import (is_call_of, norm_cases, norm_chains, rows_case,
                                    skip_huge_on_cpu)
from speedlight.ops.registration import like, register_op, row_stats
from speedlight.ops.rms_norm import FWD_WARPS_PER_SM, check_eps
from speedlight.runtime import check_runtime
from speedlight.spec import Case, Cost, KernelDesign, OpSpec, inject_nonfinite, rand_tensor

MAX_FUSED_N = 16384  # rows up to this many columns are held in registers
LOOP_BLOCK_N = 4096  # chunk of a longer row
SPLIT_BLOCK_N = 1024  # column block of the backward of longer rows
SPLIT_PROGRAMS_PER_SM = 4  # rows longer than MAX_FUSED_N: row-block programs per SM
# Forward on a GPU: one program of 32 warps per SM (each program re-reads both w and b, so
# few programs: ~3% of the compulsory bytes at 4096 rows), tiles of 8192 values at 8 per
# lane (whole rows from 8192 wide), its tile loop pipelined up to 3 tiles ahead.
FWD_TILE = 8192
FWD_VALUES_PER_LANE = 8
FWD_PIPELINE = 5


# --- launchers (usable without autograd) --------------------------------------------------

def layer_norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y (x's shape and dtype, contiguous), mean and rstd ([rows] fp32), over x's last dim."""
    return _forward(x, weight, bias, eps, store_stats=True)


def layer_norm_infer(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    """y alone: the forward when no gradient is wanted (mean and rstd are not written)."""
    return _forward(x, weight, bias, eps, store_stats=False)[0]


def _forward(x, weight, bias, eps, store_stats: bool):
    """layer_norm_fwd's y, mean and rstd; mean and rstd None unless store_stats."""
    n_cols = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_rows = x.numel() // n_cols if n_cols else 0
    mean = rstd = None
    if store_stats:
        mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return y, mean, rstd
    check_runtime(x, _layer_norm_fwd_kernel)
    x2 = as_rows(x, n_cols)
    y2 = y.view(-1, n_cols)
    # placeholder pointers for the inputs a constexpr switches off
    # the kernels step weight and bias by 1
    args = (x2, weight.contiguous() if weight is not None else x2,
            bias.contiguous() if bias is not None else x2, y2,
            mean if store_stats else y2, rstd if store_stats else y2)
    strides = (x2.stride(0), x2.stride(1), y2.stride(0))
    switches = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                    STORE_STATS=store_stats)
    if n_cols <= MAX_FUSED_N:
        # persistent: w and b read once per program
        grid, block_m, block_n, num_warps = persistent_row_grid(
            n_rows, n_cols, x.device, max_block_n=MAX_FUSED_N, tile=FWD_TILE,
            warps_per_sm=FWD_WARPS_PER_SM, values_per_lane=FWD_VALUES_PER_LANE)
        stages = pipeline_depth(block_m * block_n * x.element_size(),
                                max(1, FWD_WARPS_PER_SM // num_warps), x.device,
                                deepest=FWD_PIPELINE)
        _layer_norm_fwd_kernel[grid](
            *args, n_rows, n_cols, *strides, eps, **switches,
            BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, num_warps=num_warps)
    else:
        _layer_norm_fwd_looped_kernel[(n_rows,)](
            *args, n_cols, *strides, eps, **switches, BLOCK_N=LOOP_BLOCK_N, num_warps=8)
    return y, mean, rstd


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dx (x's shape and dtype), dw and db (the dtypes of weight and bias; None where that
    parameter is None). bias is passed for its presence and dtype; its values are not read."""
    n_cols = x.shape[-1]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    has_weight, has_bias = weight is not None, bias is not None
    if x.numel() == 0:
        return (dx, torch.zeros_like(weight) if has_weight else None,
                torch.zeros_like(bias) if has_bias else None)
    check_runtime(x, _layer_norm_bwd_kernel)
    n_rows = x.numel() // n_cols
    x2 = as_rows(x, n_cols)
    dy2 = as_rows(dy, n_cols)
    dx2 = dx.view(-1, n_cols)
    w = weight.contiguous() if has_weight else x2  # the kernels step w by 1
    fused = n_cols <= MAX_FUSED_N
    if fused:  # as RMSNorm's backward: persistent, rows strided over the programs
        # one row per tile from 4096 wide: dw, db and w beside the tiles fill 64 registers
        block_m, block_n, num_warps, n_programs = norm_bwd_grid(
            n_rows, n_cols, x.device, wide_tile=BWD_WIDE)
    else:
        block_m, block_n, num_warps = 4, SPLIT_BLOCK_N, 4
        n_programs = partial_programs(triton.cdiv(n_rows, block_m), SPLIT_PROGRAMS_PER_SM,
                                      x.device)

    def partial(wanted: bool) -> torch.Tensor:
        return torch.empty((n_programs, n_cols) if wanted else (1,), dtype=torch.float32,
                           device=x.device)

    dw_partial, db_partial = partial(has_weight), partial(has_bias)
    strides = (dy2.stride(0), dy2.stride(1), x2.stride(0), x2.stride(1))
    switches = dict(HAS_WEIGHT=has_weight, HAS_BIAS=has_bias)
    if fused:
        c1 = c2 = rstd  # not read
        grid = (n_programs, 1)
        # each stage of the pipeline holds a tile of dy and of x
        stages = pipeline_depth(2 * block_m * block_n * x.element_size(),
                                bwd_programs_per_sm(block_n, num_warps), x.device)
    else:
        c1 = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        c2 = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        _layer_norm_bwd_row_dot_kernel[(n_rows,)](
            dy2, x2, w, mean, rstd, c1, c2, n_cols, *strides, HAS_WEIGHT=has_weight,
            BLOCK_N=LOOP_BLOCK_N, num_warps=8)
        grid, stages = (n_programs, triton.cdiv(n_cols, block_n)), 1
    _layer_norm_bwd_kernel[grid](
        dy2, x2, w, mean, rstd, c1, c2, dx2, dw_partial, db_partial,
        n_rows, n_cols, *strides, dx2.stride(0),
        SPLIT_ROW=not fused, **switches, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
        num_warps=num_warps)
    if not (has_weight or has_bias):
        return dx, None, None
    first, second = (dw_partial, db_partial) if has_weight else (db_partial, None)
    sums = sum_partials(first, (weight if has_weight else bias).dtype,
                        second if has_bias else None, bias.dtype if has_bias else None)
    dw, db = sums if has_weight else (None, sums[0])
    return dx, dw, db


# --- registration: custom ops, fakes and autograd -----------------------------------------

LAYER_NORM = register_op(
    "layer_norm",
    forward=layer_norm_fwd,
    outputs=("y", "mean", "rstd"),
    stats=("mean", "rstd"),
    fake=lambda x, weight, bias, eps: (like(x), row_stats(x), row_stats(x)),
    inference=layer_norm_infer,
    backward=layer_norm_bwd,
    grads=("x", "weight", "bias"),
)


# --- public function ---------------------------------------------------------------------

@local_rows("x", over=lambda a: range(-len(_normalized_dims(a["normalized_shape"])), 0))
def layer_norm(x: torch.Tensor, normalized_shape: int | Sequence[int],
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the trailing dims `normalized_shape`, as
    torch.nn.functional.layer_norm: (x - mean) / sqrt(var + eps) * weight + bias.

    x: [..., *normalized_shape] float32/float16/bfloat16, any strides. weight, bias:
    normalized_shape, or None. Returns a tensor of x's shape and dtype. Differentiable in
    x, weight and bias; works under torch.compile(fullgraph=True).
    """
    check_tensor("x", x)
    dims = _normalized_dims(normalized_shape)
    if x.dim() < len(dims) or tuple(x.shape[x.dim() - len(dims):]) != dims:
        raise ValueError(f"x's trailing dims must be normalized_shape {dims}, got "
                         f"x of shape {tuple(x.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        check_tensor(name, t)
        if tuple(t.shape) != dims:
            raise ValueError(f"{name} must have normalized_shape {dims}, got {tuple(t.shape)}")
    check_same_device(x=x, weight=weight, bias=bias)
    check_eps(eps)
    n = math.prod(dims)
    if len(dims) != 1:
        lead = x.shape[:x.dim() - len(dims)]
        flat = x.reshape(*lead, n)
        w = weight.reshape(n) if weight is not None else None
        b = bias.reshape(n) if bias is not None else None
        return LAYER_NORM(flat, w, b, float(eps)).view(x.shape)
    return LAYER_NORM(x, weight, bias, float(eps))


def _normalized_dims(normalized_shape) -> tuple[int, ...]:
    dims = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if (not dims or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in dims)):
        raise TypeError(f"normalized_shape must be an int or a non-empty sequence of "
                        f"non-negative ints, got {normalized_shape!r}")
    return dims


# --- OpSpec --------------------------------------------------------------------------------

def make_inputs(case: Case, device) -> dict:
    rows, hidden = case["rows"], case["hidden"]
    # a mean away from 0 checks that the variance is taken around it, as real activations
    # (GPT-2's residual stream) have
    x = rand_tensor((rows, hidden), case, device, shift=1.0)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    weight = bias = None
    if case.flag("weight", True):
        weight = rand_tensor((hidden,), case, device, layout="contiguous", salt=1, scale=0.2,
                             shift=1.0)
    if case.flag("bias", True):
        bias = rand_tensor((hidden,), case, device, layout="contiguous", salt=2, scale=0.2)
    return {"x": x, "normalized_shape": (hidden,), "weight": weight, "bias": bias,
            "eps": 1e-5}


def cost(case: Case, mode: str) -> Cost:
    m, n = case["rows"], case["hidden"]
    e = case.dtype.itemsize
    params = n * e * (case.flag("weight", True) + case.flag("bias", True))
    if mode == "fwd":
        # read x, w, b; write y, mean, rstd (fp32, kept for the backward).
        # FLOP per elem: sum 1, center 1, square-sum 2, * rstd 1, * w 1, + b 1.
        return Cost(flops=7 * m * n, bytes=2 * m * n * e + params + 8 * m, saved=8 * m)
    # read dy, x, w, mean, rstd; write dx, dw, db (b is not read).
    # FLOP per elem: xhat 2, dxhat 1, c1 1, c2 2, dx 4, dw 2, db 1.
    w = n * e if case.flag("weight", True) else 0
    return Cost(flops=13 * m * n, bytes=3 * m * n * e + w + params + 8 * m)


_PARTIALS = ("each program reads w once and writes fp32 partial rows of dw and db, which the "
             "column sum reads: 1 + P(e + 16)/(3e rows) of compulsory, with P at most one "
             "program per SM or per 4 rows: ~1.1x at 4096 rows, at most ~1.75x; rows longer "
             "than 16384 also read dy and x twice (the row dots, then dx)")


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The pre-attention and pre-MLP LayerNorms of a GPT-style block."""
    if cfg.norm != "layer":
        return []
    return [Case("layer_norm", (("rows", batch * seq), ("hidden", cfg.hidden)), model=cfg.name)]


def case_of(call: str, args) -> Case | None:
    if not is_call_of(call, "layer_norm"):
        return None
    return rows_case("layer_norm", args["x"], "hidden",
                     weight=False if args["weight"] is None else None,
                     bias=False if args["bias"] is None else None)


SPEC = OpSpec(
    impl=layer_norm,
    for_model=for_model,
    case_of=case_of,
    recognise=lambda graph, calls: norm_chains(graph, calls, "layer_norm"),
    fuses="LayerNorm in one kernel per direction",
    peers={"liger": "liger_layer_norm"},
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(lambda suite: norm_cases(
        "layer_norm", suite, full_variants=[{"weight": False, "bias": False}],
        quick_variants=[(3, 7, {"weight": False, "bias": False}), (5, 781, {"bias": False}),
                        (37, 128, {"weight": False})])),
    grad_inputs=("x", "weight", "bias"),
    skip=skip_huge_on_cpu,
    notes="Normalizes the trailing dims (biased variance, taken around the mean); fp32 "
          "statistics; dW and dB reduced per program, then summed and cast in one launch.",
    kernels={
        # one program of 32 warps per SM (FWD_WARPS_PER_SM): at most 64 registers
        "_layer_norm_fwd_kernel": KernelDesign(min_occupancy=0.5),
        "_layer_norm_fwd_looped_kernel": KernelDesign(bytes_ratio=2.1, why=(
            "a row longer than 16384 does not fit registers: it is read three times, for "
            "the mean, the centred sum of squares and the write (the last two mostly from L2)")),
        # sized as RMSNorm's backward (ops/_partials.norm_bwd_grid): 50% from 4096 wide
        "_layer_norm_bwd_kernel": KernelDesign(min_occupancy=0.25, bytes_ratio=1.9, why=_PARTIALS),
        "_column_sum_kernel": KernelDesign(bytes_ratio=1.9, why=_PARTIALS),
        "_layer_norm_bwd_row_dot_kernel": KernelDesign(bytes_ratio=2.2, why=(
            "rows longer than 16384: dy and x are read for the row dots c1, c2 and again "
            "for dx, plus the dw and db partial rows")),
    },
)
