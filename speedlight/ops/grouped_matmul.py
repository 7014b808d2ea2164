"""Grouped GEMM, the expert projections of a mixture of experts:
out[rows of g] = act(x[rows of g] @ w[g]^T + bias[g]) for every group g, in one launch.

Host code of kernels/grouped_matmul.py: the launchers `grouped_matmul_fwd` and
`grouped_matmul_bwd` (usable without autograd; the launch rule and operand paths are
ops/_gemm.py's), the registration (custom ops `speedlight::grouped_matmul_fwd / _infer /
_bwd`, fake and autograd rule), the public `speedlight.grouped_matmul`, and the OpSpec
(its cases, inputs and costs in ops/grouped_matmul_cases.py).

Groups are int32 cumulative row ends on the device (group g owns rows
group_offsets[g-1]:group_offsets[g]), as a router's sort leaves them: the kernel reads them,
so no launch needs a host sync and a CUDA graph can hold it. Rows past the last group's end
belong to no group: their output (and their dx) is zeros and they add nothing to dw (an
expert-parallel layer's tokens routed elsewhere, sorted last).

Backward, with dz = dout * act'(z) (act' written by the forward when a gradient is needed):
  dx = dz @ w[g]   on the forward kernel, through a transposed view of w (no copy);
  dw[g] = dz_g^T @ x_g  (w's [G, N, K] layout; x_g^T @ dz_g when w lies as [G, K, N]) and
  dbias[g] = the sum of dz_g's rows, on the weight-gradient kernel: fp32 sums over the
  group's rows, rounded once; an empty group's dw and dbias are zeros.
"""

from __future__ import annotations

import torch
import triton

from speedlight import shapes
from speedlight.kernels.grouped_matmul import _grouped_matmul_dw_kernel, _grouped_matmul_kernel
from speedlight.ops._checks import (FLOAT_DTYPES, check_bool, check_choice, check_same_device,
                                   check_same_dtype, check_tensor)
from speedlight.ops._gemm import (ensure_allocator, gemm_config, gemm_configs, precision, programs,
                                  tma_layout, use_tma)
from speedlight.ops.grouped_matmul_cases import (case_of, cases, cost, for_model, make_inputs,
                                                 skip)
from speedlight.ops.matmul import ACTIVATIONS, DESIGN, _torch_activation, _torch_dact
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime, describe
from speedlight.spec import OpSpec

# --- launchers (usable without autograd) --------------------------------------------------


def check_offset_values(group_offsets: torch.Tensor, m: int) -> None:
    """ValueError unless the cumulative ends start at >= 0, never decrease and end at <= m
    (x's rows). One reduction, and on CUDA one host sync to read it (the public function's
    `check_offsets=False` skips this)."""
    offs = group_offsets
    if offs.numel() == 0:
        return
    wrong = torch.stack([offs[0] < 0, (offs[1:] < offs[:-1]).any(), offs[-1] > m])
    if not bool(wrong.any()):
        return
    shown = offs.tolist() if offs.numel() <= 16 else f"{offs[:8].tolist()} ... {offs[-8:].tolist()}"
    first_neg, decreasing, past = wrong.tolist()
    if first_neg:
        what = f"its first end is {int(offs[0])} < 0"
    elif decreasing:
        at = int((offs[1:] < offs[:-1]).nonzero()[0, 0]) + 1
        what = (f"it decreases at index {at} ({int(offs[at - 1])} -> {int(offs[at])}); ends "
                f"must be cumulative, each group's rows following the last")
    else:
        what = f"its last end is {int(offs[-1])}, past x's {m} rows"
    raise ValueError(f"group_offsets must hold non-decreasing cumulative row ends in [0, {m}] "
                     f"(x's rows), but {what}: {shown}. (check_offsets=False skips this "
                     f"check, which costs a host sync on CUDA)")


def _row_groups(group_offsets: torch.Tensor, m: int) -> torch.Tensor:
    """The group of each of m rows ([m] int64; G for a row past the last group), on the
    device, without a host sync."""
    rows = torch.arange(m, device=group_offsets.device, dtype=group_offsets.dtype)
    return torch.searchsorted(group_offsets.contiguous(), rows, right=True)


def _without_launch(x, w, group_offsets, bias, activation, out_dtype, dact):
    """K = 0 or no group: x @ w[g]^T is zeros; the epilogue of zeros on the host."""
    m, n = x.shape[0], w.shape[1]
    z = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    in_group = _row_groups(group_offsets, m) < w.shape[0]
    if bias is not None and w.shape[0]:
        gid = _row_groups(group_offsets, m).clamp(max=w.shape[0] - 1)
        z = z + torch.where(in_group[:, None], bias.float()[gid], 0.0)
    y = torch.where(in_group[:, None], _torch_activation(z, activation), 0.0)
    if dact is not None:
        dact.copy_(_torch_dact(z, activation))
    return y.to(out_dtype), dact


def _w_tma(w: torch.Tensor) -> str | None:
    """How each group's w[g] [N, K] can be a tensor descriptor ("row": K contiguous, "col":
    N contiguous), None when it cannot (or a group's base is not 16-byte aligned)."""
    if (w.stride(0) * w.element_size()) % 16:
        return None
    return tma_layout(w[0])


def grouped_matmul_fwd(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor,
                       bias: torch.Tensor | None = None, activation: str | None = None,
                       out_dtype: torch.dtype | None = None, store_dact: bool = False,
                       check_offsets: bool = True, row_scale: torch.Tensor | None = None,
                       rows: torch.Tensor | None = None, rows_div: int = 1
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, dact) for x [M, K], w [G, N, K] (any strides), group_offsets [G] int32
    cumulative row ends: out [M, N] contiguous in out_dtype (x's by default), act(x_g @
    w[g]^T + bias[g]) on group g's rows and zeros past the last group; dact = act'(z) in
    out's dtype when store_dact (else None). check_offsets: the offsets' values are
    checked first (a host sync on CUDA). row_scale [M] (contiguous): each row's output
    times row_scale[row] in fp32 before its one rounding (dact unscaled; a mixture of
    experts' routing weights); not with K = 0 or no group. rows [M] int64 (contiguous):
    row r is x[rows[r] // rows_div], gathered in the kernel's loads (x then has any number
    of rows; M is rows'), for a mixture of experts' tokens in expert order."""
    m, k = (x.shape[0] if rows is None else rows.numel()), x.shape[1]
    n_groups, n = w.shape[0], w.shape[1]
    out_dtype = out_dtype or x.dtype
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    dact = torch.empty_like(out) if store_dact else None
    if out.numel() == 0:
        return out, dact
    if check_offsets:
        check_offset_values(group_offsets, m)
    if k == 0 or n_groups == 0:
        if row_scale is not None or rows is not None:
            raise ValueError("grouped_matmul_fwd: row_scale and rows need K > 0 and a group")
        return _without_launch(x, w, group_offsets, bias, activation, out_dtype, dact)
    check_runtime(x, _grouped_matmul_kernel)
    cfg = gemm_config(GROUPED_MATMUL_CONFIGS, max(1, m // n_groups), n, k, x.dtype, x.device,
                      out_dtype=out_dtype, store_dact=store_dact)
    offs = group_offsets.contiguous()
    # gathered rows come by pointers, whatever x's layout; w by TMA where it can
    x_lay, w_lay = (tma_layout(x) if rows is None else "row"), _w_tma(w)
    tma = use_tma(x.device) and x_lay is not None and w_lay is not None
    if tma and x.device.type == "cuda":
        ensure_allocator()
    # every group adds at most one partial row tile, the rows past the last group one more
    most_tiles = (triton.cdiv(m, cfg.block_m) + n_groups + 1) * triton.cdiv(n, cfg.block_n)
    d = dact if dact is not None else out
    bias_arg = bias if bias is not None else out
    scale_arg = row_scale if row_scale is not None else out
    _grouped_matmul_kernel[(programs(most_tiles, x.device),)](
        x, rows if rows is not None else offs, w, out, d, bias_arg, scale_arg, offs, m, n, k,
        n_groups, rows_div, x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), bias.stride(0) if bias is not None else 0,
        bias.stride(1) if bias is not None else 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        BLOCK_G=group_block(n_groups), TMA=tma, X_KMAJOR=x_lay == "row", W_KMAJOR=w_lay == "row",
        GATHER=rows is not None, HAS_BIAS=bias is not None, ACTIVATION=activation or "none",
        STORE_DACT=store_dact, ROW_SCALE=row_scale is not None, PRECISION=precision(x.dtype),
        **cfg.options())
    return out, dact


# the most groups the forward kernel takes: it holds every group's bounds in one vector
MAX_GROUPS = 1023


def group_block(n_groups: int) -> int:
    """The forward kernel's BLOCK_G: a power of two above the groups (lane G is the rows
    past the last group); one compile per expert count a model has."""
    return max(16, triton.next_power_of_2(n_groups + 1))


def _transposed_weight(w: torch.Tensor) -> bool:
    """Whether w [G, N, K] lies as a [G, K, N] tensor (its N stride 1, its K stride not):
    then its gradient is written in that layout too."""
    return w.stride(1) == 1 and w.stride(2) != 1


def heaviest_first(group_offsets: torch.Tensor) -> torch.Tensor:
    """The groups ordered by their rows, most first (int32 [G], a stable sort on the
    device: no host sync): the weight-gradient kernel's schedule, whose tiles cost their
    group's rows, so the longest start first."""
    ends = group_offsets.to(torch.int64)
    rows = torch.diff(ends, prepend=ends.new_zeros(1))
    return torch.argsort(rows, descending=True, stable=True).to(torch.int32)


def grouped_weight_grad(dz: torch.Tensor, x: torch.Tensor, group_offsets: torch.Tensor,
                        w: torch.Tensor, bias: torch.Tensor | None = None, *,
                        rows: torch.Tensor | None = None, gather: str | None = None,
                        rows_div: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dw, dbias) of out = x_g @ w[g]^T + bias[g]: dw[g] = dz_g^T @ x_g [G, N, K] in w's
    dtype and layout (a [G, K, N] tensor transposed gets its gradient as one), dbias[g] the
    sum of dz_g's rows in bias's dtype (None without a bias); fp32 sums, zeros for an empty
    group. With rows [M] int64 (contiguous) and gather "dz" or "x", that operand's row r is
    its row rows[r] // rows_div, read in the kernel's loads (no gathered copy; M is rows'):
    a mixture of experts' dout or hidden in expert order."""
    n_groups, n, k = w.shape
    if gather not in (None, "dz", "x") or (gather is None) != (rows is None):
        raise ValueError(f"grouped_weight_grad: gather must be 'dz' or 'x' with rows, None "
                         f"without; got gather={gather!r}, rows "
                         f"{'None' if rows is None else describe(rows)}")
    m = x.shape[0] if gather != "x" else rows.numel()
    flip = _transposed_weight(w)
    dw = (torch.empty((n_groups, k, n), dtype=w.dtype, device=w.device).transpose(1, 2)
          if flip else torch.empty((n_groups, n, k), dtype=w.dtype, device=w.device))
    dbias = (torch.zeros((n_groups, n), dtype=torch.float32, device=w.device)
             if bias is not None else None)
    if dw.numel() == 0 or m == 0:  # nothing to launch for; dbias (K = 0) on the host
        dw.zero_()
        if dbias is not None and m:
            gid = _row_groups(group_offsets, m)
            rows_dz = dz if gather != "dz" else dz[rows // rows_div]
            dbias = torch.zeros((n_groups + 1, n), dtype=torch.float32, device=w.device
                                ).index_add_(0, gid, rows_dz.float())[:n_groups]
        return dw, dbias.to(bias.dtype) if dbias is not None else None
    check_runtime(x, _grouped_matmul_dw_kernel)
    # c[g] = a_g^T @ b_g: dz^T @ x into dw [G, N, K], or x^T @ dz into dw's [G, K, N] memory
    a, b = (x, dz) if flip else (dz, x)
    gather_of = "" if gather is None else ("a" if (gather == "x") == flip else "b")
    c = dw.transpose(1, 2) if flip else dw
    p, q = a.shape[1], b.shape[1]
    cfg = gemm_config(GROUPED_MATMUL_CONFIGS, p, q, max(1, m // n_groups), x.dtype, x.device)
    a_lay = tma_layout(a) if gather_of != "a" else "row"
    b_lay = tma_layout(b) if gather_of != "b" else "row"
    tma = use_tma(x.device) and a_lay is not None and b_lay is not None
    if tma and x.device.type == "cuda":
        ensure_allocator()
    tiles = n_groups * triton.cdiv(p, cfg.block_m) * triton.cdiv(q, cfg.block_n)
    db = dbias if dbias is not None else c
    offs = group_offsets.contiguous()
    _grouped_matmul_dw_kernel[(programs(tiles, x.device),)](
        a, b, rows if rows is not None else offs, c, db, offs, heaviest_first(offs), m, p, q,
        n_groups, rows_div, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), c.stride(2), db.stride(0),
        BLOCK_P=cfg.block_m, BLOCK_Q=cfg.block_n, BLOCK_M=cfg.block_k, TMA=tma,
        A_PMAJOR=a_lay == "row", B_QMAJOR=b_lay == "row", GATHER_OF=gather_of,
        BIAS_OF="" if bias is None else ("b" if flip else "a"), PRECISION=precision(x.dtype),
        **cfg.options())
    return dw, dbias.to(bias.dtype) if dbias is not None else None


def grouped_matmul_bwd(dout: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                       group_offsets: torch.Tensor, bias: torch.Tensor | None,
                       dact: torch.Tensor | None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx, dw, dbias) of out = act(x_g @ w[g]^T + bias[g]), from dact = act'(z) the
    forward wrote (None, or the registered op's empty placeholder, without an activation).
    dz = dout * act'(z) rounded to x's dtype; dx = dz_g @ w[g] on the forward kernel (zeros
    past the last group), dw and dbias on the weight-gradient kernel."""
    if dact is not None and dact.shape != dout.shape:
        dact = None
    dz = dout if dact is None else dout * dact
    dz = dz.to(x.dtype)
    dx = grouped_matmul_fwd(dz, w.transpose(1, 2), group_offsets, check_offsets=False)[0]
    dw, dbias = grouped_weight_grad(dz, x, group_offsets, w, bias)
    return dx, dw, dbias


def _train_fwd(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor,
               bias: torch.Tensor | None, activation: str | None,
               out_dtype: torch.dtype | None, check_offsets: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward a backward follows: out, and act'(z) with an activation."""
    return grouped_matmul_fwd(x, w, group_offsets, bias, activation, out_dtype,
                              activation is not None, check_offsets)


def _infer_fwd(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor,
               bias: torch.Tensor | None, activation: str | None,
               out_dtype: torch.dtype | None, check_offsets: bool) -> torch.Tensor:
    """The forward when no gradient is needed: out alone."""
    return grouped_matmul_fwd(x, w, group_offsets, bias, activation, out_dtype, False,
                              check_offsets)[0]


def _fake(x, w, group_offsets, bias, activation, out_dtype, check_offsets):
    out = x.new_empty((x.shape[0], w.shape[1]), dtype=out_dtype or x.dtype)
    return out, torch.empty_like(out) if activation is not None else None


def _like_weight(w: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor laid out as grouped_weight_grad writes w's gradient."""
    if _transposed_weight(w):
        return w.new_empty((w.shape[0], w.shape[2], w.shape[1])).transpose(1, 2)
    return w.new_empty(w.shape)


# the GEMM space and rule, with tuned tables of its own (speedlight tune sweeps it)
GROUPED_MATMUL_CONFIGS = gemm_configs("grouped_matmul")

GROUPED_MATMUL = register_op(
    "grouped_matmul",
    forward=_train_fwd,
    outputs=("out", "dact"),
    stats=("dact",),
    fake=_fake,
    inference=_infer_fwd,
    backward=grouped_matmul_bwd,
    backward_fake=lambda dout, x, w, group_offsets, bias, dact: (
        like(x), _like_weight(w), like(bias)),
    grads=("x", "w", "bias"),
)


# --- the public function -------------------------------------------------------------------

def check_grouped_inputs(x, w, group_offsets, bias=None) -> None:
    """The static checks of grouped_matmul's tensors (shapes, dtypes, devices: nothing
    that reads a value, so no host sync)."""
    check_tensor("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [rows, K] (rows grouped by group_offsets), got "
                         f"{describe(x)}")
    check_tensor("w", w)
    if w.dim() != 3:
        raise ValueError(f"w must be 3-D [groups, N, K] (one [N, K] weight per group; a "
                         f"[groups, K, N] tensor passes as .transpose(1, 2)), got {describe(w)}")
    check_same_dtype(x=x, w=w)
    if w.shape[0] > MAX_GROUPS:
        raise ValueError(f"w has {w.shape[0]} groups; grouped_matmul takes at most "
                         f"{MAX_GROUPS} (its kernel holds every group's bounds at once), got "
                         f"{describe(w)}")
    if w.shape[2] != x.shape[1]:
        raise ValueError(f"w [groups, N, K] must have x's K = {x.shape[1]} as its last dim, "
                         f"got {describe(w)} for x {describe(x)}")
    check_tensor("group_offsets", group_offsets, dtypes=(torch.int32,),
                 expected="int32 (cumulative row ends, one per group)")
    if group_offsets.dim() != 1 or group_offsets.shape[0] != w.shape[0]:
        raise ValueError(f"group_offsets must be 1-D with one int32 row end per group of w "
                         f"({w.shape[0]}), got {describe(group_offsets)}")
    if bias is not None:
        check_tensor("bias", bias)
        if tuple(bias.shape) != (w.shape[0], w.shape[1]):
            raise ValueError(f"bias must be [groups, N] = {(w.shape[0], w.shape[1])} (one "
                             f"bias row per group of w), got {describe(bias)}")
    check_same_device(x=x, w=w, group_offsets=group_offsets, bias=bias)


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor, *,
                   bias: torch.Tensor | None = None, activation: str | None = None,
                   out_dtype: torch.dtype | None = None,
                   check_offsets: bool = True) -> torch.Tensor:
    """act(x[rows of g] @ w[g]^T + bias[g]) for every group g, in one persistent launch.

    x: [M, K], rows grouped (any strides); w: [G, N, K], one [N, K] weight per group (the
    layout of transformers' experts; a [G, K, N] tensor passes as `.transpose(1, 2)` and
    is read where it lies); group_offsets: [G] int32 cumulative row ends on x's device
    (group g owns rows group_offsets[g-1]:group_offsets[g], the first from 0; empty groups
    repeat an end), as torch._grouped_mm takes them. Rows past the last end belong to no
    group and come out as zeros. bias: [G, N]; activation: None, "silu", "gelu_tanh" or
    "gelu"; out_dtype: the output dtype (x's by default; float32 keeps the accumulator's
    digits). float32 (TF32 where torch.backends.cuda.matmul.allow_tf32 says so), float16
    or bfloat16, fp32 accumulation. Differentiable in x, w and bias (dw per group with
    fp32 sums; an empty group's dw is zeros); works under torch.compile(fullgraph=True)
    and needs no host sync, except:

    check_offsets: the offsets' values (non-decreasing, within [0, M]) are checked before
    the launch, which on CUDA reads them back (a host sync). Pass check_offsets=False inside
    CUDA graphs or where the offsets are known good (a router's own); unchecked offsets never
    make the kernel read or write outside x, w or out (they are clamped as read), but
    wrong ones give wrong rows. Shapes, dtypes and devices are always checked.
    """
    check_grouped_inputs(x, w, group_offsets, bias)
    check_choice("activation", activation, ACTIVATIONS, optional=True)
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise ValueError(f"out_dtype must be None or one of float32, float16, bfloat16, got "
                         f"{out_dtype!r}")
    check_bool("check_offsets", check_offsets)
    return GROUPED_MATMUL(x, w, group_offsets, bias, activation, out_dtype, check_offsets)


# --- OpSpec ------------------------------------------------------------------------------

SPEC = OpSpec(
    impl=grouped_matmul,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("x", "w", "bias"),
    skip=skip,
    case_of=case_of,
    fuses="per-expert matmul loop (or torch._grouped_mm) + bias + activation",
    notes="grouped GEMM over device-side int32 group ends (no host sync, no per-group "
          "launch, no padding); persistent, TMA + wgmma on Hopper; dx on the same kernel "
          "through w's transpose, dw per group with fp32 sums.",
    family="compute-bound",
    for_model=for_model,
    kernels={"_grouped_matmul_kernel": DESIGN, "_grouped_matmul_dw_kernel": DESIGN},
    count_rows=lambda case: case["m"],
    aligned=lambda case: case.layout != "strided" and all(
        case[p] % 16 == 0 for p in ("n", "k")),
    configs=GROUPED_MATMUL_CONFIGS,
)
