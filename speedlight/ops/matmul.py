"""GEMM with fused epilogues: c = act(scale * (a @ b) + bias) + residual in one kernel.

Host code of kernels/matmul.py's _matmul_kernel: the launcher `matmul_fwd` (usable without
autograd; its launch rule and operand paths are ops/_gemm.py's), the registration (custom
ops `speedlight::matmul_fwd / _infer / _bwd`, fake and autograd rule), the public
`speedlight.matmul`, and the OpSpec.

The backward runs the same kernel through strides: with dz = dy * act'(z) (act' written
by the forward's epilogue when a gradient is needed, so z itself never reaches memory),
da = scale * dz @ b^T and db = scale * a^T @ dz, each operand a transposed view, never a
copy; db is computed in b's own layout (for b = W^T, nn.Linear's weight, dW = dz^T @ a is
written contiguous as W is).

fp8 (float8_e4m3fn a and b, K-major, with float32 scales per tensor or per row/column):
the forward runs _matmul_fp8_kernel, which dequantizes the fp32 accumulator before the
epilogue; the backward runs the bf16 kernel on the dequantized operands (matmul_bwd).
`return_amax` (any dtype) also returns max |c|, folded in the epilogue (delayed scaling).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton

from speedlight import shapes
from speedlight.kernels.matmul import _matmul_fp8_kernel, _matmul_kernel
from speedlight.ops import matmul_cases as cases
from speedlight.ops._gemm import (FP8_DTYPES, default_out_dtype, ensure_allocator, gemm_config,
                                  gemm_configs, precision, programs, tma_layout, use_tma)
from speedlight.ops._checks import (FLOAT_DTYPES, check_bool, check_choice, check_same_device,
                                    check_tensor)
from speedlight.ops._dtensor import local_rows
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime, describe
from speedlight.spec import KernelDesign, OpSpec

ACTIVATIONS = ("silu", "gelu_tanh", "gelu")

# --- launcher (usable without autograd) ----------------------------------------------------

def matmul_fwd(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, activation: str | None = None,
               scale: float | None = None, out_dtype: torch.dtype | None = None,
               store_dact: bool = False, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, return_amax: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(c, dact, amax) for 2-D a [M, K], b [K, N], any strides (fp8: both K-major):
    c = act(scale * (sa * sb * a @ b) + bias) + residual [M, N] contiguous in out_dtype
    (a's dtype by default, bf16 for fp8), dact = act'(z) in c's dtype when store_dact,
    amax = max |c| as a 0-d fp32 when return_amax (else None each). scale_a: fp32 [1] or
    [M, 1]; scale_b: fp32 [1] or [1, N] (fp8 only: both or neither)."""
    m, k = a.shape
    n = b.shape[1]
    out_dtype = out_dtype or default_out_dtype(a.dtype)
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    dact = torch.empty((m, n), dtype=out_dtype, device=a.device) if store_dact else None
    amax = torch.zeros((), dtype=torch.float32, device=a.device) if return_amax else None
    if c.numel() == 0:
        return c, dact, amax
    if k == 0:  # an empty sum: the epilogue of zeros, without a launch
        z = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        c, dact = _epilogue_of_zeros(z, bias, residual, activation, out_dtype, dact)
        if amax is not None:
            amax.copy_(c.float().abs().amax())
        return c, dact, amax
    check_runtime(a, _matmul_kernel)
    if scale_a is not None:
        check_fp8_base(a, b)
    cfg = gemm_config(MATMUL_CONFIGS, m, n, k, a.dtype, a.device, out_dtype=out_dtype,
                      residual=residual is not None, store_dact=store_dact)
    a_lay, b_lay = tma_layout(a), tma_layout(b)
    tma = (use_tma(a.device) and a_lay is not None and b_lay is not None
           and tma_layout(c) == "row")
    if tma and a.device.type == "cuda":
        ensure_allocator()
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    act = activation or "none"
    d = dact if dact is not None else c
    bias_arg = bias if bias is not None else c
    res = residual if residual is not None else c
    amax_bits = amax.view(torch.int32) if amax is not None else c
    grid = (programs(num_tiles, a.device),)
    tiles = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                 GROUP_M=cfg.group_m, TMA=tma, HAS_SCALE=scale is not None,
                 HAS_BIAS=bias is not None, ACTIVATION=act, HAS_RESIDUAL=residual is not None,
                 STORE_DACT=store_dact, STORE_AMAX=amax is not None,
                 **cfg.options())
    bias_stride = bias.stride(0) if bias is not None else 0
    scale_f = float(scale if scale is not None else 1.0)
    if scale_a is None:
        _matmul_kernel[grid](
            a, b, c, d, bias_arg, res, amax_bits, m, n, k, a.stride(0), a.stride(1),
            b.stride(0), b.stride(1), c.stride(0), c.stride(1), bias_stride, res.stride(0),
            res.stride(1), scale_f, A_KMAJOR=a_lay == "row", B_KMAJOR=b_lay == "col",
            PRECISION=precision(a.dtype), **tiles)
        return c, dact, amax
    # fp8: K-major operands (the public function checked it); one value is a scale per
    # tensor, more a scale per row of a / per column of b
    a_rows, b_cols = scale_a.numel() > 1, scale_b.numel() > 1
    _matmul_fp8_kernel[grid](
        a, b, c, d, bias_arg, res, scale_a, scale_b, amax_bits, m, n, k, a.stride(0),
        b.stride(1), c.stride(0), c.stride(1), bias_stride, res.stride(0), res.stride(1),
        scale_a.stride(0) if a_rows else 0, scale_b.stride(-1) if b_cols else 0, scale_f,
        SCALE_A_ROWS=a_rows, SCALE_B_COLS=b_cols, **tiles)
    return c, dact, amax


def dequantized(t: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """t * scale in `dtype` (rounded once from fp32), in t's own layout; t itself when it
    has no scale (not fp8)."""
    if scale is None:
        return t
    return (t.float() * scale.float()).to(dtype)


def _epilogue_of_zeros(z, bias, residual, activation, out_dtype, dact):
    """K = 0: a @ b is zeros; the epilogue in fp32 on the host (nothing to launch for)."""
    if bias is not None:
        z = z + bias.float()
    y, d = _torch_activation(z, activation), _torch_dact(z, activation)
    if residual is not None:
        y = y + residual.float()
    if dact is not None:
        dact.copy_(d)
    return y.to(out_dtype), dact


def _torch_dact(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    """act'(z), as kernels/glu.py's _glu_activation derives it."""
    if activation is None:
        return torch.ones_like(z)
    if activation == "silu":
        s = torch.sigmoid(z)
        return s * (1 + z * torch.sigmoid(-z))
    if activation == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        u = 2 * c * (z + 0.044715 * z ** 3)
        du = 2 * c * (1 + 3 * 0.044715 * z * z)
        s = torch.sigmoid(u)
        return s + z * s * torch.sigmoid(-u) * du
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    return cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _torch_activation(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return z
    if activation == "silu":
        return torch.nn.functional.silu(z)
    return torch.nn.functional.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")


def _like_layout(t: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor of t's shape laid out as matmul_bwd writes t's gradient:
    transposed when t is a transposed view (b = W^T), else contiguous."""
    if t.dim() == 2 and t.stride(0) == 1 and t.stride(1) != 1:
        return t.new_empty((t.shape[1], t.shape[0])).t()
    return t.new_empty(t.shape)


def matmul_bwd(dc: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               bias: torch.Tensor | None, residual: torch.Tensor | None,
               dact: torch.Tensor | None, scale: float | None,
               scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                          torch.Tensor | None]:
    """(da, db, dbias, dresidual) of c = act(scale * a @ b + bias) + residual, from dact =
    act'(z) the forward wrote (None without an activation): dz = dc * act'(z), then
    da = scale * dz @ b^T and db = scale * a^T @ dz by the same kernel through strides; db
    in b's own layout (for b = W^T, dW = dz^T @ a is written as W lies). The registered
    op hands an empty placeholder for a dact the forward did not write.

    After an fp8 forward (scale_a, scale_b given) the backward runs in bf16: a and b are
    dequantized (sa * a, sb * b, rounded once to bf16), the bf16 backward gives the
    gradients of those, and the chain rule's sa, sb turn them into da, db, which are
    returned in a's and b's dtype (autograd would round them to fp8 anyway: a gradient
    has its tensor's dtype)."""
    if dact is not None and dact.shape != dc.shape:
        dact = None
    fp8 = scale_a is not None
    a_in, b_in = a, b
    if fp8:
        a = dequantized(a, scale_a, torch.bfloat16)
        b = dequantized(b, scale_b, torch.bfloat16)
    dz = dc if dact is None else dc * dact
    dz = dz.to(a.dtype)
    da = matmul_fwd(dz, b.t(), scale=scale)[0]  # [M, N] @ [N, K] -> [M, K]: b^T a view
    if b.stride(0) == 1 and b.stride(1) != 1:
        dbt = matmul_fwd(dz.t(), a, scale=scale)[0]  # [N, M] @ [M, K] -> [N, K]
        db = dbt.t()
    else:
        db = matmul_fwd(a.t(), dz, scale=scale)[0]  # [K, M] @ [M, N] -> [K, N]
    if fp8:  # d(sa * a) = sa da: [M, K] * [M, 1] or one value; [K, N] * [1, N] likewise
        da = (da.float() * scale_a.float()).to(a_in.dtype)
        db = (db.float() * scale_b.float()).to(b_in.dtype)
    dbias = dres = None
    if bias is not None:
        # bias is added after the scale: its gradient is dz summed over rows, unscaled
        dbias = (dc.float() * dact.float() if dact is not None else dc.float()).sum(0)
        dbias = dbias.to(bias.dtype)
    if residual is not None:  # dc itself; a copy, since a custom op's output may not alias
        dres = dc.to(residual.dtype, copy=True)
    return da, db, dbias, dres


def _train_fwd(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
               residual: torch.Tensor | None, activation: str | None, scale: float | None,
               out_dtype: torch.dtype | None, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, return_amax: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The forward a backward follows: c, with an activation act'(z), amax when asked."""
    return matmul_fwd(a, b, bias, residual, activation, scale, out_dtype,
                      activation is not None, scale_a, scale_b, return_amax)


def _infer_fwd(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
               residual: torch.Tensor | None, activation: str | None, scale: float | None,
               out_dtype: torch.dtype | None, scale_a: torch.Tensor | None = None,
               scale_b: torch.Tensor | None = None, return_amax: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward when no gradient is needed: c (and amax), act' not written."""
    c, _, amax = matmul_fwd(a, b, bias, residual, activation, scale, out_dtype, False,
                            scale_a, scale_b, return_amax)
    return c, amax


def _fake(a, b, bias, residual, activation, scale, out_dtype, scale_a=None, scale_b=None,
          return_amax=False):
    c = a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or default_out_dtype(a.dtype))
    return (c, torch.empty_like(c) if activation is not None else None,
            c.new_empty((), dtype=torch.float32) if return_amax else None)


# the GEMM space and rule, with tuned tables of its own (speedlight tune sweeps it)
MATMUL_CONFIGS = gemm_configs("matmul")

MATMUL = register_op(
    "matmul",
    forward=_train_fwd,
    outputs=("c", "dact", "amax"),
    stats=("dact",),
    fake=_fake,
    inference=_infer_fwd,
    backward=matmul_bwd,
    backward_fake=lambda dc, a, b, bias, residual, dact, scale, scale_a, scale_b: (
        like(a), _like_layout(b), like(bias), like(residual)),
    grads=("a", "b", "bias", "residual"),
)


# --- the public function -------------------------------------------------------------------

def _sharded_amax_refused(arguments: dict) -> str | None:
    """Why sharded rows of a cannot return the amax: each rank holds its own rows' max."""
    if arguments.get("return_amax"):
        return ("return_amax=True: each rank would hold the max over its own rows only; "
                "all-reduce the output's max yourself (return_amax=False)")
    return None


@local_rows("a", "residual", refuse=_sharded_amax_refused)
def matmul(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
           activation: str | None = None, residual: torch.Tensor | None = None,
           scale: float | None = None, out_dtype: torch.dtype | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
           return_amax: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """act(scale * (a @ b) + bias) + residual in one kernel; fp32 accumulation, one rounding.

    a: [..., K] (leading dims flattened into M); b: [K, N]; both any strides (a transposed
    operand is read where it lies: `x @ w.t()` with nn.Linear's weight w [N, K] is no
    copy), one dtype of float32, float16 or bfloat16 (float32 uses TF32 only where
    torch.backends.cuda.matmul.allow_tf32 is set, as torch.matmul does). bias: [N];
    activation: None, "silu", "gelu_tanh" or "gelu" (exact); residual: [..., N] like the
    output; scale: a float multiplying a @ b before the bias; out_dtype: the output dtype
    (a's by default; float32 keeps the accumulator's digits). Differentiable in a, b, bias
    and residual; works under torch.compile(fullgraph=True).

    fp8: a and b both torch.float8_e4m3fn, K-major as TMA and fp8 wgmma read them (a's K
    contiguous, b = W.t() of a row-major W [N, K], K a multiple of 16), each with its
    dequantization scale in float32: scale_a one value or [..., 1] (per row of a),
    scale_b one value or [1, N] (per column of b); the product is (scale_a * a) @
    (scale_b * b), applied to the fp32 accumulator before the scale, bias, activation and
    residual; the output is bf16 unless out_dtype says otherwise. Its backward runs in
    bf16 on the dequantized operands (the gradients of a and b come back in fp8, their
    dtype, as autograd requires).
    return_amax: also return max |output| (0-d float32, of the values as stored), folded
    in the epilogue, for delayed scaling; it carries no gradient.
    DTensor: a (and residual, with a's placement) sharded along a leading dim (its rows:
    data or sequence parallel) with b, bias and the scales whole on every rank (plain or
    Replicate) gives the output with a's placement. Other placements (b split for tensor
    parallelism, a split along K) raise a ValueError naming the argument and placement:
    speedlight runs no collective, so shard the weights with torch's own parallel linears.
    """
    fp8 = isinstance(a, torch.Tensor) and a.dtype in FP8_DTYPES
    check_tensor("a", a, min_dim=1, dtypes=FLOAT_DTYPES + FP8_DTYPES, expected=_OPERAND_DTYPES)
    check_tensor("b", b, dtypes=FLOAT_DTYPES + FP8_DTYPES, expected=_OPERAND_DTYPES)
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D [K, N], got {describe(b)}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have one dtype (no mixed-precision GEMM; fp8 takes "
                        f"both float8_e4m3fn): a has {a.dtype}, b has {b.dtype}")
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"inner dimensions do not match: a is {tuple(a.shape)} (K = "
                         f"{a.shape[-1]}) but b is {tuple(b.shape)} (K = {b.shape[0]})")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be torch.float32, float16 or bfloat16, got {out_dtype}")
    check_choice("activation", activation, ACTIVATIONS, optional=True)
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    check_bool("return_amax", return_amax)
    lead, (k, n) = a.shape[:-1], b.shape
    out_shape = (*lead, n)
    rows = math.prod(lead)
    if bias is not None:
        check_tensor("bias", bias)
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias must have shape ({n},) (b's N), got {describe(bias)}")
    if residual is not None:
        check_tensor("residual", residual)
        if tuple(residual.shape) != out_shape:
            raise ValueError(f"residual must have the output's shape {out_shape}, got "
                             f"{describe(residual)}")
    check_scales(a, scale_a, scale_b, rows, n)
    check_same_device(a=a, b=b, bias=bias, residual=residual, scale_a=scale_a,
                      scale_b=scale_b)
    a2 = a.reshape(rows, k)
    if fp8:
        check_fp8_layout(a2, b)
        if scale_a.numel() > 1:
            scale_a = scale_a.reshape(rows, 1)
    res2 = residual.reshape(rows, n) if residual is not None else None
    c, amax = MATMUL(a2, b, bias, res2, activation,
                     float(scale) if scale is not None else None, out_dtype, scale_a, scale_b,
                     return_amax)
    return (c.view(out_shape), amax) if return_amax else c.view(out_shape)


_OPERAND_DTYPES = "float32, float16, bfloat16 or float8_e4m3fn"


def check_scales(a: torch.Tensor, scale_a, scale_b, rows: int, n: int) -> None:
    """fp8 operands need both dequantization scales, float32, one value each or scale_a
    [..., 1] per row of a and scale_b [1, N] per column of b; other dtypes take none."""
    if a.dtype not in FP8_DTYPES:
        for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
            if s is not None:
                raise ValueError(f"{name} is the dequantization scale of float8_e4m3fn "
                                 f"operands, but a and b are {a.dtype} (use scale= to scale "
                                 f"their product)")
        return
    lead = tuple(a.shape[:-1])
    for name, s, per, shapes_ok in (
            ("scale_a", scale_a, f"[..., 1] = {(*lead, 1)} (per row of a)",
             ((*lead, 1), (rows, 1))),
            ("scale_b", scale_b, f"[1, N] = (1, {n}) (per column of b)", ((1, n),))):
        if s is None:
            raise ValueError(f"{name} is required with float8_e4m3fn operands: a float32 "
                             f"tensor of one value or {per}, by which the fp8 values are "
                             f"multiplied (got None)")
        check_tensor(name, s, dtypes=(torch.float32,))
        if s.numel() != 1 and tuple(s.shape) not in shapes_ok:
            raise ValueError(f"{name} must hold one value (a scale per tensor) or have shape "
                             f"{per}, got {describe(s)}")


def check_fp8_layout(a2: torch.Tensor, b: torch.Tensor) -> None:
    """fp8 operands as TMA copies them and fp8 wgmma reads them: both K-major (a's K
    stride 1, b's K stride 1, i.e. b = W.t() of a row-major W [N, K]) with rows 16 bytes
    apart (the row stride, K when contiguous, a multiple of 16 fp8 values). Strides only,
    so torch.compile traces it; the launcher checks the base addresses."""
    if a2.numel() == 0 or b.numel() == 0:
        return
    if a2.stride(1) != 1 or a2.stride(0) % 16:
        raise ValueError(f"a (float8_e4m3fn) must be K-major with rows 16 bytes apart: K "
                         f"contiguous and its row stride (K when contiguous) a multiple of "
                         f"16, as TMA and fp8 wgmma read it; got {describe(a2)} with strides "
                         f"{a2.stride()}")
    if b.stride(0) != 1 or b.stride(1) % 16:
        raise ValueError(f"b (float8_e4m3fn) must be K-major with columns 16 bytes apart: "
                         f"b = W.t() of a row-major W [N, K] whose row stride (K when "
                         f"contiguous) is a multiple of 16, as torch._scaled_mm takes it; got "
                         f"{describe(b)} with strides {b.stride()}")


def check_fp8_base(a: torch.Tensor, b: torch.Tensor) -> None:
    """The launcher's half of check_fp8_layout: 16-byte aligned base addresses."""
    for name, t in (("a", a), ("b", b)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name} (float8_e4m3fn) must start at a 16-byte aligned address "
                             f"(TMA copies from there); it is a view at offset "
                             f"{t.storage_offset()} of its storage: copy it (.contiguous() of "
                             f"the row-major tensor) first")


# Design of the bf16/fp16 kernels (compile-only guards: tests/inspect/test_matmul_guard):
# on sm_90a TMA loads into a 3-stage pipeline feeding wgmma (HGMMA); on sm_100a the same
# TMA pipeline feeding tcgen05 MMA (UTCHMMA), its accumulator in tensor memory.
_GEMM = KernelDesign(min_occupancy=0.0, vector_bits=0, spills=False, mma="HGMMA", tma=True,
                     min_stages=3, bytes_ratio=float("inf"),
                     why="a GEMM reads a once per column of tiles and b once per row of "
                         "tiles; grouped order serves those re-reads from L2")
# On gfx942 (MI300X; gfx950 alike) the dots compile to MFMA (v_mfma) with no TMA: operands arrive by
# global/buffer loads into one LDS buffer (num_stages 2, the AMD rule: the next k-step's
# tiles wait in registers), so one stage in LDS is the design there.
_GEMM_GFX942 = dataclasses.replace(_GEMM, mma="MFMA", tma=False, min_stages=1)
_AMD = (("gfx942", _GEMM_GFX942), ("gfx950", _GEMM_GFX942))  # CDNA3 and CDNA4 alike
DESIGN = dataclasses.replace(_GEMM, per_arch=((100, dataclasses.replace(_GEMM, mma="UTCHMMA")),
                                              *_AMD))

# The fp8 kernel: the same pipeline on fp8 wgmma (QGMMA) on sm_90a, fp8 tcgen05 (UTCQMMA)
# on sm_100a; MFMA on gfx942 and gfx950
FP8_DESIGN = dataclasses.replace(_GEMM, mma="QGMMA", per_arch=(
    (100, dataclasses.replace(_GEMM, mma="UTCQMMA")), *_AMD))

SPEC = OpSpec(
    impl=matmul,
    make_inputs=cases.make_inputs,
    cost=cases.cost,
    suites=shapes.suites(cases.cases),
    grad_inputs=("a", "b", "bias", "residual"),
    dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn),
    skip=cases.skip,
    case_of=cases.case_of,
    fuses="matmul + bias + activation + residual add",
    notes="GEMM with bias / scale / activation / residual fused into the epilogue; fp8 "
          "(e4m3, per-tensor or per-row scales, amax) on QGMMA with a bf16 backward; "
          "persistent, grouped tile order, TMA + wgmma on Hopper; backward by the same "
          "kernel through strides.",
    family="compute-bound",
    for_model=cases.for_model,
    kernels={"_matmul_kernel": DESIGN, "_matmul_fp8_kernel": FP8_DESIGN},
    count_rows=lambda case: case["m"],
    aligned=lambda case: case.layout != "strided" and all(
        case[p] % 16 == 0 for p in ("m", "n", "k")),
    configs=MATMUL_CONFIGS,
)
