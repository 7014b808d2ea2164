"""Triton kernel of a mixture of experts' gate_up projection with its gate unit fused in the
epilogue (ops/moe_experts.py): per routed (token, slot) pair p of expert e, sorted by expert,

    z[p] = x[p] @ gate_up_proj[e]^T + gate_up_bias[e]      [pairs, 2 I], fp32, rounded once
    h[p] = gate_unit(m_g * gate(z[p]), up(z[p])) * m_d     [pairs, I]

in one persistent launch over the grouped GEMM's tiles (kernels/grouped_matmul.py: the
groups' int32 ends read on the device, rows past the last group written as zeros). A tile
of h needs its gate and up columns of z, so each program accumulates both:

  halves      (transformers' layout: gate in rows [0, I) of gate_up_proj[e], up in [I, 2I))
              two [BM, BN] accumulators, one per half, from two w tiles per k-step (two
              dots on one x tile, as the dense gated kernel does);
  interleaved (gpt-oss: gate at even rows, up at odd) one [BM, 2 BN] accumulator over
              rows [2 off_n, 2 off_n + 2 BN) of w, split into gate and up columns in the
              epilogue (a reshape to [BM, BN, 2]), so the weight tile stays one TMA box
              whichever way w lies.

The gate unit reads z as rounded to z's dtype (what the backward reads back): training
and inference give the same h, and the backward's recomputed h is the forward's bit for
bit. z is stored only for a backward (STORE_Z); inference writes h alone.
"""

import triton
import triton.language as tl

from speedlight.kernels.grouped_matmul import (_gathered_rows, _group_tile, _group_tiles,
                                               _load_gathered, _load_weight, _weight_desc)
from speedlight.kernels.matmul import _load_operand, _operand_desc, _store_tile
from speedlight.kernels.moe import _moe_gate


@triton.jit
def _moe_gate_up_kernel(x_ptr, rows_ptr, w_ptr, h_ptr, z_ptr, bias_ptr, offs_ptr, M, I, K,
                        G, rows_div, stride_xm, stride_xk, stride_wg, stride_wn, stride_wk,
                        stride_hm, stride_zm, stride_bg, stride_bn, gate_multiplier,
                        down_multiplier, alpha, limit,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, BLOCK_G: tl.constexpr, TMA: tl.constexpr,
                        X_KMAJOR: tl.constexpr, W_KMAJOR: tl.constexpr,
                        GATHER: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr,
                        ACTIVATION: tl.constexpr, STORE_Z: tl.constexpr,
                        PRECISION: tl.constexpr):
    """h = gate_unit(z) with z = x @ w[g]^T + bias[g] on the rows of each group g; zeros on
    rows past the last group (z = 0 there, and every gate unit of zeros is 0).

    x_ptr [M, K] rows in expert order (any strides; with TMA, X_KMAJOR says its K stride is
    1, else its M stride is), or with GATHER the tokens' hidden [tokens, K] whose row
    rows[r] // rows_div is row r's (rows_ptr [M] the sort order of the (token, slot)
    pairs, rows_div the router's k: the gather is the A load's, no gathered copy exists);
    w_ptr [G, 2 I, K] (group stride stride_wg; with TMA, W_KMAJOR says its K stride is 1,
    else its 2 I stride is: gpt-oss's [G, K, 2 I] tensor transposed); h_ptr [M, I] (row
    stride stride_hm), z_ptr [M, 2 I] (row stride stride_zm), both with unit column stride
    in h's dtype; bias_ptr [G, 2 I]; offs_ptr [G] int32 cumulative group ends. fp32
    accumulators; gate unit in fp32 on z as rounded.
    Constexprs: the tile BLOCK_M x BLOCK_N (of h) x BLOCK_K; GROUP_M; BLOCK_G a power of
    two above G; TMA the operand path (w's; x's too unless GATHER, whose rows come by
    pointers); GATHER x's rows by index; INTERLEAVED gate/up at even/odd rows of w (one
    [BM, 2 BN] accumulator) or its two halves (two [BM, BN] ones); HAS_BIAS; ACTIVATION
    silu, gelu_tanh, gelu or clamped_swiglu (alpha, limit read only by it); STORE_Z z
    written for a backward; PRECISION tl.dot's input_precision for fp32.
    """
    N: tl.constexpr = 2 * BLOCK_N if INTERLEAVED else BLOCK_N  # w rows per tile and dot
    num_pid_n = tl.cdiv(I, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gs, bounds, last_of, num_tiles = _group_tiles(offs_ptr, G, M, num_pid_n, BLOCK_M, BLOCK_G)
    if TMA and not GATHER:
        x_desc = _operand_desc(x_ptr, M, K, stride_xm, stride_xk, BLOCK_M, BLOCK_K, X_KMAJOR)
    else:
        x_desc = x_ptr
    if TMA:
        w_desc = _weight_desc(w_ptr, G, 2 * I, K, stride_wg, stride_wn, stride_wk, N,
                              BLOCK_K, W_KMAJOR)
    else:
        w_desc = w_ptr
    out_ty = h_ptr.dtype.element_ty
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        g, end, off_m, off_n = _group_tile(tile, gs, bounds, last_of, num_pid_n, BLOCK_M,
                                           BLOCK_N, GROUP_M)
        in_group = g < G
        g_w = tl.minimum(g, G - 1)
        # interleaved: w rows [2 off_n, +2 BN); halves: gate rows off_n.., up rows I + off_n..
        # (a gate tile running past I reads up rows into columns its stores drop)
        off_w = 2 * off_n if INTERLEAVED else off_n
        acc = tl.zeros([BLOCK_M, N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if GATHER:
            src, mask_src = _gathered_rows(rows_ptr, rows_div, off_m, end, BLOCK_M)
        for ki in range(tl.where(in_group, k_tiles, 0)):  # past the last group: zeros
            off_k = ki * BLOCK_K
            if GATHER:
                a = _load_gathered(x_ptr, src, mask_src, off_k, K, stride_xm, stride_xk,
                                   BLOCK_K)
            else:
                a = _load_operand(x_desc, x_ptr, off_m, off_k, M, K, stride_xm, stride_xk,
                                  BLOCK_M, BLOCK_K, TMA, X_KMAJOR)
            b = _load_weight(w_desc, w_ptr, g_w, off_w, off_k, 2 * I, K, stride_wg,
                             stride_wn, stride_wk, N, BLOCK_K, TMA, W_KMAJOR)
            # [BM, BK] @ [BK, N] -> [BM, N]
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            if not INTERLEAVED:
                b_u = _load_weight(w_desc, w_ptr, g_w, I + off_n, off_k, 2 * I, K, stride_wg,
                                   stride_wn, stride_wk, BLOCK_N, BLOCK_K, TMA, W_KMAJOR)
                # [BM, BK] @ [BK, BN] -> [BM, BN]
                acc_u = tl.dot(a, b_u, acc_u, input_precision=PRECISION)
        bias_g = bias_ptr + g_w.to(tl.int64) * stride_bg
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if INTERLEAVED:
            offs_w = off_w + tl.arange(0, N)  # z's columns: gate, up, gate, up, ...
            if HAS_BIAS:
                acc += tl.load(bias_g + offs_w.to(tl.int64) * stride_bn,
                               mask=(offs_w < 2 * I) & in_group, other=0.0
                               ).to(tl.float32)[None, :]
            z = acc.to(out_ty)
            if STORE_Z:
                _store_tile(z_ptr, z_ptr, z, off_m, off_w, end, 2 * I, stride_zm, 1, BLOCK_M,
                            N, False)
            gate, up = tl.split(tl.reshape(z.to(tl.float32), (BLOCK_M, BLOCK_N, 2)))
        else:
            if HAS_BIAS:
                mask_b = (offs_n < I) & in_group
                acc += tl.load(bias_g + offs_n.to(tl.int64) * stride_bn, mask=mask_b,
                               other=0.0).to(tl.float32)[None, :]
                acc_u += tl.load(bias_g + (I + offs_n).to(tl.int64) * stride_bn, mask=mask_b,
                                 other=0.0).to(tl.float32)[None, :]
            z = acc.to(out_ty)
            z_u = acc_u.to(out_ty)
            if STORE_Z:
                _store_tile(z_ptr, z_ptr, z, off_m, off_n, end, I, stride_zm, 1, BLOCK_M,
                            BLOCK_N, False)
                _store_tile(z_ptr + I, z_ptr + I, z_u, off_m, off_n, end, I, stride_zm, 1,
                            BLOCK_M, BLOCK_N, False)
            gate = z.to(tl.float32)
            up = z_u.to(tl.float32)
        h, _, _ = _moe_gate(gate * gate_multiplier, up, ACTIVATION, alpha, limit)
        # masked at the group's last row: the next group's rows are another tile's
        _store_tile(h_ptr, h_ptr, h * down_multiplier, off_m, off_n, end, I, stride_hm, 1,
                    BLOCK_M, BLOCK_N, False)
