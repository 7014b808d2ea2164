"""Softmax along one dim, any length: a row-tile kernel when rows fit one block, an online
looped kernel for long rows, a split-row pair of kernels when long rows are too few to
fill the GPU. fp32 arithmetic whatever the input dtype."""

from __future__ import annotations

import torch
import triton

from speedlight import launch, shapes
from speedlight.kernels.softmax import (
    _softmax_bwd_kernel,
    _softmax_bwd_looped_kernel,
    _softmax_bwd_split_dot_kernel,
    _softmax_bwd_split_write_kernel,
    _softmax_fwd_kernel,
    _softmax_fwd_looped_kernel,
    _softmax_fwd_split_stats_kernel,
    _softmax_fwd_split_write_kernel,
)
from speedlight.launch import planned_sm_count, row_tile
from speedlight.ops._checks import check_tensor
from speedlight.ops._dtensor import local_rows
from speedlight.ops._suites import is_call_of, rows_case, skip_huge_on_cpu
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime
from speedlight.spec import (Case, Chain, Cost, KernelDesign, OpSpec, dtype_name, inject_nonfinite,
                             rand_tensor)
from speedlight.tuning import Configs

MAX_FUSED_N = 16384
LOOP_BLOCK_N = 4096
FWD_TILE = 4096  # elements per program of the fused forward on a GPU (launch.row_tile's)
SPLIT_SPAN = 16384  # columns per program when a row is split

# The fused forward's elements per program on a GPU (row_tile: whole rows, one warp per 512
# elements), keyed by (row length, dtype); a tuned table's entry per row length.
SOFTMAX_CONFIGS = Configs("softmax", space={"tile": (1024, 2048, 4096, 8192, 16384)},
                          default=lambda key: {"tile": FWD_TILE},
                          bucket=lambda key: f"cols{key[0]}-{dtype_name(key[1])}")


def _split_plan(n_rows: int, n_cols: int, device: torch.device) -> int:
    """How many spans to cut each long row into: 1 (the looped kernel) unless rows are too
    few to give every SM one."""
    sms = planned_sm_count(device)
    if sms is None:
        return 1 if n_rows >= 2 else max(1, min(4, triton.cdiv(n_cols, SPLIT_SPAN)))
    if n_rows >= sms:
        return 1
    return max(1, min(triton.cdiv(n_cols, SPLIT_SPAN), triton.cdiv(2 * sms, n_rows)))


def _as_rows(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t with `dim` moved last and the rest flattened: [rows, n]; a view when possible."""
    moved = t.movedim(dim, -1)
    return moved.reshape(-1, moved.shape[-1])


def _rows_out(like: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A contiguous output of like's shape, and its [rows, n] view along `dim` (strided
    when dim is not last; the kernels follow its strides), or None when no such view
    exists (dim in the middle of 3+ dims)."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    moved = out.movedim(dim, -1)
    try:
        return out, moved.view(-1, moved.shape[-1])
    except RuntimeError:
        return out, None


def softmax_fwd(x: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax of x along dim; a new tensor of x's shape and dtype."""
    dim = dim % x.dim()
    y, y2 = _rows_out(x, dim)
    if x.numel() == 0:
        return y
    check_runtime(x, _softmax_fwd_kernel)
    x2 = _as_rows(x, dim)
    scratch = y2 is None
    if scratch:  # output view not expressible as [rows, n]: write rows, then copy
        y2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _softmax_rows_fwd(x2, y2)
    if scratch:
        y.movedim(dim, -1).copy_(y2.view(y.movedim(dim, -1).shape))
    return y


def _softmax_rows_fwd(x2: torch.Tensor, y2: torch.Tensor) -> None:
    n_rows, n_cols = x2.shape
    strides = (x2.stride(0), x2.stride(1), y2.stride(0), y2.stride(1))
    if n_cols <= MAX_FUSED_N:
        # on a GPU, the elements per program: the rule's or a tuned table's (launch.config)
        tile = (launch.config(SOFTMAX_CONFIGS, (n_cols, x2.dtype), x2.device)["tile"]
                if planned_sm_count(x2.device) is not None else None)
        block_m, block_n, num_warps = row_tile(n_cols, x2.device, max_block_n=MAX_FUSED_N,
                                               max_tile=tile)
        _softmax_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
            x2, y2, n_rows, n_cols, *strides, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps)
        return
    n_splits = _split_plan(n_rows, n_cols, x2.device)
    if n_splits == 1:
        _softmax_fwd_looped_kernel[(n_rows,)](
            x2, y2, n_cols, *strides, BLOCK_N=LOOP_BLOCK_N, num_warps=8)
        return
    span = triton.cdiv(triton.cdiv(n_cols, n_splits), LOOP_BLOCK_N) * LOOP_BLOCK_N
    n_splits = triton.cdiv(n_cols, span)
    m = torch.empty((n_rows, n_splits), dtype=torch.float32, device=x2.device)
    d = torch.empty_like(m)
    grid = (n_rows, n_splits)
    _softmax_fwd_split_stats_kernel[grid](
        x2, m, d, n_cols, span, strides[0], strides[1], n_splits,
        BLOCK_N=LOOP_BLOCK_N, num_warps=8)
    _softmax_fwd_split_write_kernel[grid](
        x2, y2, m, d, n_cols, span, *strides, n_splits,
        BLOCK_N=LOOP_BLOCK_N, BLOCK_S=triton.next_power_of_2(n_splits), num_warps=8)


def softmax_bwd(dy: torch.Tensor, y: torch.Tensor, dim: int) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy, dim)); a new tensor of y's shape and dtype."""
    dim = dim % y.dim()
    dx, dx2 = _rows_out(y, dim)
    if y.numel() == 0:
        return dx
    check_runtime(y, _softmax_bwd_kernel)
    y2, dy2 = _as_rows(y, dim), _as_rows(dy, dim)
    scratch = dx2 is None
    if scratch:
        dx2 = torch.empty(y2.shape, dtype=y.dtype, device=y.device)
    n_rows, n_cols = y2.shape
    strides = (y2.stride(0), y2.stride(1), dy2.stride(0), dy2.stride(1),
               dx2.stride(0), dx2.stride(1))
    if n_cols <= MAX_FUSED_N:
        block_m, block_n, num_warps = row_tile(n_cols, y.device, max_block_n=MAX_FUSED_N)
        _softmax_bwd_kernel[(triton.cdiv(n_rows, block_m),)](
            y2, dy2, dx2, n_rows, n_cols, *strides, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps)
    else:
        n_splits = _split_plan(n_rows, n_cols, y.device)
        span = triton.cdiv(triton.cdiv(n_cols, n_splits), LOOP_BLOCK_N) * LOOP_BLOCK_N
        n_splits = triton.cdiv(n_cols, span)
        if n_splits == 1:
            _softmax_bwd_looped_kernel[(n_rows,)](
                y2, dy2, dx2, n_cols, *strides, BLOCK_N=LOOP_BLOCK_N, num_warps=8)
        else:
            c = torch.empty((n_rows, n_splits), dtype=torch.float32, device=y.device)
            grid = (n_rows, n_splits)
            _softmax_bwd_split_dot_kernel[grid](
                y2, dy2, c, n_cols, span, *strides[:4], n_splits,
                BLOCK_N=LOOP_BLOCK_N, num_warps=8)
            _softmax_bwd_split_write_kernel[grid](
                y2, dy2, dx2, c, n_cols, span, *strides, n_splits,
                BLOCK_N=LOOP_BLOCK_N, BLOCK_S=triton.next_power_of_2(n_splits), num_warps=8)
    if scratch:
        dx.movedim(dim, -1).copy_(dx2.view(dx.movedim(dim, -1).shape))
    return dx


# --- registration: custom ops, fakes and autograd -----------------------------------------

SOFTMAX = register_op(
    "softmax",
    forward=softmax_fwd,
    outputs=("y",),
    fake=lambda x, dim: like(x),
    backward=softmax_bwd,
    backward_fake=lambda dy, y, dim: like(y),
    grads=("x",),
)


@local_rows("x", over=lambda a: (a["dim"],))
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(x) along dim (default the last), any length, fp32 arithmetic.

    x: float32/float16/bfloat16, any strides. Returns a tensor of x's shape and dtype.
    Differentiable; works under torch.compile(fullgraph=True).
    """
    check_tensor("x", x, min_dim=1)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be in [{-x.dim()}, {x.dim() - 1}] for x of shape "
                         f"{tuple(x.shape)}, got {dim}")
    return SOFTMAX(x, dim % x.dim())


# --- OpSpec --------------------------------------------------------------------------------

def make_inputs(case: Case, device) -> dict:
    x = rand_tensor((case["rows"], case["cols"]), case, device, scale=2.0)
    if case.flag("nonfinite"):
        inject_nonfinite(x, case)
    return {"x": x, "dim": -1}


def cost(case: Case, mode: str) -> Cost:
    m, n, e = case["rows"], case["cols"], case.dtype.itemsize
    if mode == "fwd":
        # read x; write y. max, subtract, exp, sum, divide: 5 FLOP/elem.
        return Cost(flops=5 * m * n, bytes=2 * m * n * e)
    # read y, dy; write dx. c (2) and y * (dy - c) (2): 4 FLOP/elem.
    return Cost(flops=4 * m * n, bytes=3 * m * n * e)


def cases(suite: str) -> list[Case]:
    def case(rows, cols, layout="contiguous", model=None, **flags):
        return Case("softmax", (("rows", rows), ("cols", cols)), layout=layout, flags=flags,
                    model=model)

    out = [case(r, w, model=m) for r, w, m in shapes.rows_and_width(suite, "vocab")]
    if suite == "quick":
        out += [case(37, 128, "strided"), case(5, 781, "transposed"), case(6, 1000, nonfinite=True),
                case(0, 64), case(3, 20001, "strided"), case(1, 40000)]
    if suite == "model":
        # attention-score rows: [heads * seq, seq] at common context lengths
        out += [case(32 * s, s, model="attention") for s in (512, 2048, 4096)]
    if suite == "full":
        out += [case(r, w, "strided") for r, w in ((257, 1021), (3, 4093), (1031, 127))]
        out += [case(3, 100003, "transposed"), case(257, 1021, nonfinite=True), case(0, 4096),
                case(1, 262144), case(2, 262147), case(65537, 32771, huge=True)]
    return out


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """Eager attention's softmax over the scores: [batch * heads * seq, seq]."""
    if not cfg.heads:
        return []
    return [Case("softmax", (("rows", batch * cfg.heads * seq), ("cols", seq)), model=cfg.name)]


def case_of(call: str, args) -> Case | None:
    """x (y in the backward) as [rows, cols] along dim."""
    if not is_call_of(call, "softmax"):
        return None
    x = args["x"] if "x" in args else args["y"]
    return rows_case("softmax", x.movedim(args["dim"], -1), "cols")


def recognise(g, calls) -> list[Chain]:
    """A softmax with its dtype casts, or spelled out as exp / sum / div (after a max
    subtracted), over the last dim; one inside attention is part of attention's chain."""
    chains = []

    def found(pattern, fwd, x, module):
        chains.append(Chain(pattern, fwd, module,
                            rows_case("softmax", g.tensor(x), "cols"), inside=("attention",)))
    for r in g.fwd:
        i = r["index"]
        if r["name"] == "_softmax":
            fwd = {i}
            up = g.input_base(i, 0)
            if g.name(up) == "_to_copy":
                fwd.add(up)
            downs = [c for c in g.uses(i) if g.name(c) == "_to_copy"]
            fwd |= set(downs[:1])
            if len(fwd) > 1:
                found("softmax with its dtype casts", fwd, g.row(min(fwd))["inputs"][0],
                      r["module"])
        elif r["name"] == "div" and len(r["producers"]) == 2:
            e, total = g.input_base(i, 0), g.input_base(i, 1)
            if g.name(e) == "exp" and g.name(total) == "sum" and g.input_base(total, 0) == e:
                fwd = {e, total, i}
                sub = g.input_base(e, 0)
                if g.name(sub) == "sub":
                    fwd.add(sub)
                    if g.name(g.input_base(sub, 1)) in ("amax", "max"):
                        fwd.add(g.input_base(sub, 1))
                found("softmax spelled out (exp, sum, div)", fwd, g.row(min(fwd))["inputs"][0],
                      r["module"])
    return chains


_TWO_PASS = ("a row longer than 16384 does not fit registers: x is read twice, for the "
             "online max and sum and for the write (the second read mostly from L2), plus "
             "per-span statistics when the row is split")
_TWO_PASS_BWD = ("a row longer than 16384 is read twice: y and dy for the row dot, then "
                 "again for dx (5/3 of compulsory)")

SPEC = OpSpec(
    impl=softmax,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("x",),
    skip=skip_huge_on_cpu,
    notes="Softmax over the last dim; rows longer than 16384 take the online kernels.",
    for_model=for_model,
    case_of=case_of,
    recognise=recognise,
    fuses="softmax with its casts folded in",
    peers={"liger": "liger_softmax"},
    kernels={
        "_softmax_fwd_kernel": KernelDesign(min_occupancy=0.5),
        "_softmax_bwd_kernel": KernelDesign(min_occupancy=0.5),
        **dict.fromkeys(("_softmax_fwd_looped_kernel", "_softmax_fwd_split_stats_kernel",
                         "_softmax_fwd_split_write_kernel"),
                        KernelDesign(min_occupancy=0.5, bytes_ratio=1.52, why=_TWO_PASS)),
        **dict.fromkeys(("_softmax_bwd_looped_kernel", "_softmax_bwd_split_dot_kernel",
                         "_softmax_bwd_split_write_kernel"),
                        KernelDesign(min_occupancy=0.5, bytes_ratio=1.7, why=_TWO_PASS_BWD)),
    },
    configs=SOFTMAX_CONFIGS,
)
