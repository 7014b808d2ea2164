"""Triton kernels of speedlight's GEMMs: c = epilogue(a @ b), and the gated MLP's
out = act(x @ w_gate^T) * (x @ w_up^T) with both projections of a tile in one program.

Both kernels are persistent: a grid of about one program per resident slot walks the
output tiles p, p + P, p + 2P... in grouped order (GROUP_M row-tiles side by side share
the same columns of b, so a group's b tiles are read from L2, not DRAM). Operands come in
one of two ways, chosen by the launcher (constexpr TMA):
  TMA=True   tensor descriptors (tl.make_tensor_descriptor): on Hopper, TMA copies tiles
             into shared memory through a num_stages-deep pipeline and wgmma reads them
             there; out-of-bounds rows and columns are zero-filled by the copy itself.
             Each operand's contiguous dimension is its last (A_KMAJOR / B_KMAJOR say
             whether that is K; otherwise the tile is loaded transposed and tl.trans'd,
             which wgmma takes as a transposed shared-memory operand, no copy).
  TMA=False  pointer loads with masks, any strides (cp.async pipeline on Ampere).
The epilogue (bias, output scale, activation, residual) runs on the fp32 accumulator in
registers, so the pre-activation never reaches memory unless the backward needs act'.

fp8 (float8_e4m3fn operands, both K-major: TMA copies 128-byte rows of 128 values and
wgmma runs as QGMMA): the accumulator is dequantized first in the epilogue, by a scale per
tensor or per row of a (SCALE_A_ROWS) times one per tensor or per column of b
(SCALE_B_COLS); with STORE_AMAX each tile also folds max|c| of what it stores into one
fp32 by an atomic max on its bits (|c| >= 0, so the int32 order is the float order and a
NaN, whose bits are above +Inf's, wins as torch.amax's NaN does).

Under the Triton interpreter tl.dot is wrong in bfloat16: there (INTERPRETED, read from
TRITON_INTERPRET when this module is imported, as Triton itself reads it) loaded bf16
tiles are converted to fp32 before the dot; bf16 products are exact in fp32, so this is
the GPU's math up to summation order. A compiled kernel never has the conversion.
"""

import os

import triton
import triton.language as tl

from speedlight.kernels.glu import _glu_activation

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile `tile_id` in grouped order: tiles run down GROUP_M
    row-tiles of one column before moving to the next column, so consecutive tiles share
    b's column tile and a group's rows of a stay in L2."""
    group_size = GROUP_M * num_pid_n
    group = tile_id // group_size
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size) % rows_in_group
    pid_n = (tile_id % group_size) // rows_in_group
    return pid_m, pid_n


@triton.jit
def _operand_desc(ptr, rows, cols, stride_row, stride_col, BLOCK_ROWS: tl.constexpr,
                  BLOCK_COLS: tl.constexpr, COLS_CONTIGUOUS: tl.constexpr):
    """A tensor descriptor of a [rows, cols] operand (or output) whose tiles are
    [BLOCK_ROWS, BLOCK_COLS]: over its memory as laid out, [rows, cols] when the cols are
    contiguous, else [cols, rows] (then loads return transposed tiles)."""
    if COLS_CONTIGUOUS:
        return tl.make_tensor_descriptor(ptr, shape=[rows, cols], strides=[stride_row, 1],
                                         block_shape=[BLOCK_ROWS, BLOCK_COLS])
    else:
        return tl.make_tensor_descriptor(ptr, shape=[cols, rows], strides=[stride_col, 1],
                                         block_shape=[BLOCK_COLS, BLOCK_ROWS])


@triton.jit
def _load_operand(desc, ptr, off_row, off_col, rows, cols, stride_row, stride_col,
                  BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, TMA: tl.constexpr,
                  COLS_CONTIGUOUS: tl.constexpr):
    """The [BLOCK_ROWS, BLOCK_COLS] tile at (off_row, off_col) of a [rows, cols] operand,
    zero outside it: by its descriptor (TMA) or by pointers with masks (64-bit offsets)."""
    if TMA:
        if COLS_CONTIGUOUS:
            tile = desc.load([off_row, off_col])
        else:
            tile = tl.trans(desc.load([off_col, off_row]))  # [BC, BR] -> [BR, BC]
    else:
        offs_r = off_row + tl.arange(0, BLOCK_ROWS)
        offs_c = off_col + tl.arange(0, BLOCK_COLS)
        mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :]
        ptrs = (ptr + offs_r.to(tl.int64)[:, None] * stride_row
                + offs_c.to(tl.int64)[None, :] * stride_col)
        tile = tl.load(ptrs, mask=mask, other=0.0)
    if INTERPRETED and tile.dtype == tl.bfloat16:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def _dequantize(acc, offs_m, offs_n, M, N, scale_a_ptr, stride_sa, scale_b_ptr, stride_sb,
                SCALE_A_ROWS: tl.constexpr, SCALE_B_COLS: tl.constexpr):
    """acc * scale_a * scale_b in fp32: scale_a one value or [M] (stride_sa apart), scale_b
    one value or [N] (stride_sb apart)."""
    if SCALE_A_ROWS:
        sa = tl.load(scale_a_ptr + offs_m.to(tl.int64) * stride_sa, mask=offs_m < M, other=0.0)
        acc = acc * sa[:, None]
    else:
        acc = acc * tl.load(scale_a_ptr)
    if SCALE_B_COLS:
        sb = tl.load(scale_b_ptr + offs_n.to(tl.int64) * stride_sb, mask=offs_n < N, other=0.0)
        acc = acc * sb[None, :]
    else:
        acc = acc * tl.load(scale_b_ptr)
    return acc


@triton.jit
def _fold_amax(amax_ptr, y, offs_m, offs_n, M, N, out_dtype: tl.constexpr):
    """Fold max|y| over the tile's valid elements, as rounded to out_dtype (what is
    stored), into the fp32 at amax_ptr (an int32 view: an atomic max on the bits).
    Rounding is monotone and symmetric, so max|round(y)| = round(max|y|): the tile's max
    is taken in fp32 and only that one value rounded (no second [BM, BN] tile)."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    bits = tl.where(mask, tl.abs(y).to(tl.int32, bitcast=True), 0)
    top = tl.max(tl.max(bits, axis=1), axis=0)  # [BM, BN] -> []: a NaN's bits win
    top = top.to(tl.float32, bitcast=True).to(out_dtype).to(tl.float32)
    tl.atomic_max(amax_ptr, top.to(tl.int32, bitcast=True))


@triton.jit
def _epilogue(acc, offs_m, offs_n, M, N, scale, bias_ptr, stride_bias, res_ptr, stride_rm,
              stride_rn, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """(y, act'(z)) of the fp32 accumulator: z = scale * acc + bias, y = act(z) + residual
    (act' is 1 without an activation; the compiler drops it unless it is stored)."""
    z = acc
    if HAS_SCALE:
        z = z * scale
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n.to(tl.int64) * stride_bias, mask=offs_n < N, other=0.0)
        z = z + bias.to(tl.float32)[None, :]
    if ACTIVATION == "none":
        y = z
        dact = tl.full(z.shape, 1.0, tl.float32)
    else:
        y, dact = _glu_activation(z, ACTIVATION)
    if HAS_RESIDUAL:
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        res = tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm
                      + offs_n.to(tl.int64)[None, :] * stride_rn, mask=mask, other=0.0)
        y = y + res.to(tl.float32)
    return y, dact


@triton.jit
def _store_tile(desc, ptr, value, off_m, off_n, M, N, stride_m, stride_n,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr):
    """Store a [BLOCK_M, BLOCK_N] tile of a [M, N] output at (off_m, off_n): by its
    descriptor (TMA clips the tile at the edges) or by masked pointers."""
    value = value.to(ptr.dtype.element_ty)
    if TMA:
        desc.store([off_m, off_n], value)
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        tl.store(ptr + offs_m.to(tl.int64)[:, None] * stride_m
                 + offs_n.to(tl.int64)[None, :] * stride_n, value, mask=mask)


@triton.jit
def _matmul_tiles(a_ptr, b_ptr, c_ptr, dact_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                  amax_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                  stride_cn, stride_bias, stride_rm, stride_rn, stride_sa, stride_sb, scale,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, TMA: tl.constexpr, A_KMAJOR: tl.constexpr,
                  B_KMAJOR: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                  STORE_DACT: tl.constexpr, PRECISION: tl.constexpr,
                  DEQUANTIZE: tl.constexpr, SCALE_A_ROWS: tl.constexpr,
                  SCALE_B_COLS: tl.constexpr, STORE_AMAX: tl.constexpr):
    """The body of _matmul_kernel and _matmul_fp8_kernel (their docstrings say what it
    computes); DEQUANTIZE: the fp8 scales, read by _matmul_fp8_kernel alone."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    if TMA:
        a_desc = _operand_desc(a_ptr, M, K, stride_am, stride_ak, BLOCK_M, BLOCK_K, A_KMAJOR)
        # b [K, N] tiles [BK, BN]: as [N, K] tiles [BN, BK] when its K stride is 1
        b_desc = _operand_desc(b_ptr, K, N, stride_bk, stride_bn, BLOCK_K, BLOCK_N,
                               not B_KMAJOR)
        c_desc = _operand_desc(c_ptr, M, N, stride_cm, 1, BLOCK_M, BLOCK_N, True)
        if STORE_DACT:
            d_desc = _operand_desc(dact_ptr, M, N, stride_cm, 1, BLOCK_M, BLOCK_N, True)
        else:
            d_desc = c_desc
    else:
        a_desc = a_ptr
        b_desc = b_ptr
        c_desc = c_ptr
        d_desc = dact_ptr
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            a = _load_operand(a_desc, a_ptr, off_m, off_k, M, K, stride_am, stride_ak,
                              BLOCK_M, BLOCK_K, TMA, A_KMAJOR)
            b = _load_operand(b_desc, b_ptr, off_k, off_n, K, N, stride_bk, stride_bn,
                              BLOCK_K, BLOCK_N, TMA, not B_KMAJOR)
            # [BM, BK] @ [BK, BN] -> [BM, BN]
            if DEQUANTIZE:
                # fp8 wgmma accumulates with fewer than fp32's bits: promote the partial
                # sums into the fp32 accumulator after every BLOCK_K products
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            else:
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if DEQUANTIZE:
            acc = _dequantize(acc, offs_m, offs_n, M, N, scale_a_ptr, stride_sa, scale_b_ptr,
                              stride_sb, SCALE_A_ROWS, SCALE_B_COLS)
        y, dact = _epilogue(acc, offs_m, offs_n, M, N, scale, bias_ptr, stride_bias, res_ptr,
                            stride_rm, stride_rn, HAS_SCALE, HAS_BIAS, ACTIVATION,
                            HAS_RESIDUAL)
        if STORE_AMAX:
            _fold_amax(amax_ptr, y, offs_m, offs_n, M, N, c_ptr.dtype.element_ty)
        _store_tile(c_desc, c_ptr, y, off_m, off_n, M, N, stride_cm, stride_cn, BLOCK_M,
                    BLOCK_N, TMA)
        if STORE_DACT:
            _store_tile(d_desc, dact_ptr, dact, off_m, off_n, M, N, stride_cm, stride_cn,
                        BLOCK_M, BLOCK_N, TMA)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, dact_ptr, bias_ptr, res_ptr, amax_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   stride_bias, stride_rm, stride_rn, scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, TMA: tl.constexpr, A_KMAJOR: tl.constexpr,
                   B_KMAJOR: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                   STORE_DACT: tl.constexpr, PRECISION: tl.constexpr,
                   STORE_AMAX: tl.constexpr):
    """c = act(scale * (a @ b) + bias) + residual, dact = act'(scale * (a @ b) + bias),
    and amax = max |c|: the GEMM of fp32, fp16 and bf16 operands.

    a_ptr [M, K], b_ptr [K, N] (any strides; with TMA, A_KMAJOR says a's K stride is 1,
    else its M stride is; B_KMAJOR says b's K stride is 1, else its N stride is);
    c_ptr [M, N] (contiguous with TMA); dact_ptr [M, N] like c (STORE_DACT, for the
    backward: written in c's dtype); bias_ptr [N]; res_ptr [M, N] (own strides); scale a
    float (HAS_SCALE); amax_ptr one int32, the bits of an fp32 max |c| (zero before the
    launch; STORE_AMAX). Accumulates in fp32.
    Constexprs: the tile BLOCK_M x BLOCK_N x BLOCK_K and GROUP_M (grouped order); TMA the
    operand path; HAS_* / ACTIVATION / STORE_DACT / STORE_AMAX the epilogue pieces
    compiled in; PRECISION tl.dot's input_precision for fp32 operands ("tf32" or "ieee").
    """
    _matmul_tiles(a_ptr, b_ptr, c_ptr, dact_ptr, bias_ptr, res_ptr, c_ptr, c_ptr, amax_ptr,
                  M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  stride_bias, stride_rm, stride_rn, 0, 0, scale, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, TMA, A_KMAJOR, B_KMAJOR, HAS_SCALE, HAS_BIAS, ACTIVATION,
                  HAS_RESIDUAL, STORE_DACT, PRECISION, False, False, False, STORE_AMAX)


@triton.jit
def _matmul_fp8_kernel(a_ptr, b_ptr, c_ptr, dact_ptr, bias_ptr, res_ptr, scale_a_ptr,
                       scale_b_ptr, amax_ptr, M, N, K,
                       stride_am, stride_bn, stride_cm, stride_cn,
                       stride_bias, stride_rm, stride_rn, stride_sa, stride_sb, scale,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, TMA: tl.constexpr, HAS_SCALE: tl.constexpr,
                       HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                       HAS_RESIDUAL: tl.constexpr, STORE_DACT: tl.constexpr,
                       SCALE_A_ROWS: tl.constexpr, SCALE_B_COLS: tl.constexpr,
                       STORE_AMAX: tl.constexpr):
    """c = act(scale * (sa * sb * (a @ b)) + bias) + residual, dact = act'(that z), and
    amax = max |c|: the GEMM of float8_e4m3fn operands, dequantized in the epilogue.

    a_ptr [M, K] K-major (row stride stride_am), b_ptr [K, N] K-major (b = W^T of a
    row-major W [N, K], column stride stride_bn): both as TMA and fp8 wgmma take them (the
    launcher checks the 16-byte alignment); c_ptr, dact_ptr, bias_ptr, res_ptr, scale and
    amax_ptr as _matmul_kernel's; scale_a_ptr fp32, one value or [M] stride_sa apart
    (SCALE_A_ROWS); scale_b_ptr fp32, one value or [N] stride_sb apart (SCALE_B_COLS).
    Accumulates in fp32 (BLOCK_K 128: 128-byte rows).
    Constexprs: as _matmul_kernel's, with SCALE_A_ROWS / SCALE_B_COLS the scales' kind.
    """
    _matmul_tiles(a_ptr, b_ptr, c_ptr, dact_ptr, bias_ptr, res_ptr, scale_a_ptr, scale_b_ptr,
                  amax_ptr, M, N, K, stride_am, 1, 1, stride_bn, stride_cm, stride_cn,
                  stride_bias, stride_rm, stride_rn, stride_sa, stride_sb, scale, BLOCK_M,
                  BLOCK_N, BLOCK_K, GROUP_M, TMA, True, True, HAS_SCALE, HAS_BIAS,
                  ACTIVATION, HAS_RESIDUAL, STORE_DACT, "ieee", True, SCALE_A_ROWS,
                  SCALE_B_COLS, STORE_AMAX)


@triton.jit
def _gated_matmul_kernel(x_ptr, wg_ptr, wu_ptr, out_ptr, h1_ptr, h2_ptr, M, N, K,
                         stride_xm, stride_xk, stride_wgn, stride_wgk, stride_wun, stride_wuk,
                         stride_om, stride_hm,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, TMA: tl.constexpr, X_KMAJOR: tl.constexpr,
                         W_KMAJOR: tl.constexpr, ACTIVATION: tl.constexpr,
                         STORE_H: tl.constexpr, PRECISION: tl.constexpr):
    """out = act(g) * u with g = x @ wg^T, u = x @ wu^T, both of a tile in one program.

    For the backward (STORE_H) the forward also writes g and u (rounded to out's dtype, as
    the two projections of an unfused MLP are), from which dg = dout * u * act'(g) and
    du = dout * act(g) are computed in fp32 with one rounding each.
    x_ptr [M, K]; wg_ptr, wu_ptr [N, K] (nn.Linear's layout, any strides; with TMA both K
    strides are 1 when W_KMAJOR, else both N strides are); wu_ptr may point into wg's own
    buffer (rows N..2N of a [2N, K] gate_up weight); out_ptr [M, N] contiguous; h1_ptr,
    h2_ptr [M, N] with row stride stride_hm (two halves of one [M, 2N] buffer), in out's
    dtype. Constexprs as _matmul_kernel's; ACTIVATION silu, gelu_tanh or gelu.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    if TMA:
        x_desc = _operand_desc(x_ptr, M, K, stride_xm, stride_xk, BLOCK_M, BLOCK_K, X_KMAJOR)
        # w^T [K, N] tiles [BK, BN]: as [N, K] tiles [BN, BK] when its K stride is 1
        wg_desc = _operand_desc(wg_ptr, K, N, stride_wgk, stride_wgn, BLOCK_K, BLOCK_N,
                                not W_KMAJOR)
        wu_desc = _operand_desc(wu_ptr, K, N, stride_wuk, stride_wun, BLOCK_K, BLOCK_N,
                                not W_KMAJOR)
        o_desc = _operand_desc(out_ptr, M, N, stride_om, 1, BLOCK_M, BLOCK_N, True)
        if STORE_H:
            h1_desc = _operand_desc(h1_ptr, M, N, stride_hm, 1, BLOCK_M, BLOCK_N, True)
            h2_desc = _operand_desc(h2_ptr, M, N, stride_hm, 1, BLOCK_M, BLOCK_N, True)
        else:
            h1_desc = o_desc
            h2_desc = o_desc
    else:
        x_desc = x_ptr
        wg_desc = wg_ptr
        wu_desc = wu_ptr
        o_desc = out_ptr
        h1_desc = h1_ptr
        h2_desc = h2_ptr
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            x = _load_operand(x_desc, x_ptr, off_m, off_k, M, K, stride_xm, stride_xk,
                              BLOCK_M, BLOCK_K, TMA, X_KMAJOR)
            wg = _load_operand(wg_desc, wg_ptr, off_k, off_n, K, N, stride_wgk, stride_wgn,
                               BLOCK_K, BLOCK_N, TMA, not W_KMAJOR)
            wu = _load_operand(wu_desc, wu_ptr, off_k, off_n, K, N, stride_wuk, stride_wun,
                               BLOCK_K, BLOCK_N, TMA, not W_KMAJOR)
            # [BM, BK] @ [BK, BN] -> [BM, BN], twice on one x tile
            acc_g = tl.dot(x, wg, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(x, wu, acc_u, input_precision=PRECISION)
        act, _ = _glu_activation(acc_g, ACTIVATION)
        _store_tile(o_desc, out_ptr, act * acc_u, off_m, off_n, M, N, stride_om, 1,
                    BLOCK_M, BLOCK_N, TMA)
        if STORE_H:
            _store_tile(h1_desc, h1_ptr, acc_g, off_m, off_n, M, N, stride_hm, 1,
                        BLOCK_M, BLOCK_N, TMA)
            _store_tile(h2_desc, h2_ptr, acc_u, off_m, off_n, M, N, stride_hm, 1,
                        BLOCK_M, BLOCK_N, TMA)
