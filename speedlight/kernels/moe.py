"""Triton kernels of speedlight's mixture-of-experts block (ops/moe_experts.py) around its
two grouped GEMMs (kernels/moe_gate_up.py, whose epilogue applies the gate unit _moe_gate,
and kernels/grouped_matmul.py):

  _moe_gate_bwd_kernel   recomputes h from z and, from g = dout_pair @ w_down[e] (the down
                         projection's input gradient before the routing weight), writes
                         w_pair * h (the down weight gradient's operand), dz = d(gate
                         unit) of w_pair * g, and the routing weight's gradient <g, h> per
                         pair (fp32, over the whole row).
  _moe_combine_kernel    out[t] = sum over j of y[pos[t, j]] (rows already weighted by the
                         down GEMM's epilogue): each token sums its k rows in slot order
                         in fp32, rounded once (no atomics, the same bits on every run); a
                         pair whose expert index is outside [0, E) (an expert-parallel
                         sentinel) adds nothing.
  _moe_dx_kernel         dhidden's part from one router slot: a grouped GEMM over that
                         slot's pairs in expert order, dz's rows gathered by index and each
                         row's result added to its token's row of an fp32 sum (one launch
                         per slot, in slot order: every token appears once in a slot, so
                         no two programs write one row and no [pairs, H] tensor exists).
"""

import triton
import triton.language as tl

from speedlight.kernels.glu import _glu_activation
from speedlight.kernels.grouped_matmul import (_gathered_rows, _group_tile, _group_tiles,
                                               _load_gathered, _load_weight, _weight_desc)


@triton.jit
def _moe_gate(a, u, ACTIVATION: tl.constexpr, alpha, limit):
    """(h, dh/da, dh/du) of the gate unit at a = m_g * gate (fp32), without m_d.

    silu / gelu_tanh / gelu:  h = act(a) * u (act and act' from kernels/glu.py);
    clamped_swiglu (gpt-oss): c = min(a, limit), v = clamp(u, -limit, limit),
        h = (v + 1) * c * s(alpha c),  s the sigmoid;
        dh/da = (v + 1) * s(alpha c) * (1 + alpha c s(-alpha c)) where a <= limit, else 0;
        dh/du = c * s(alpha c) where -limit <= u <= limit, else 0 (torch.clamp's gradient).
    Comparisons are written so that a NaN stays NaN (min and clamp pass NaN through)."""
    if ACTIVATION == "clamped_swiglu":
        c = tl.where(a > limit, limit, a)
        v = tl.where(u > limit, limit, tl.where(u < -limit, -limit, u))
        s = tl.sigmoid(alpha * c)
        glu = c * s
        h = (v + 1.0) * glu
        d_a = tl.where(a > limit, 0.0, (v + 1.0) * s * (1.0 + alpha * c * tl.sigmoid(-alpha * c)))
        d_u = tl.where((u > limit) | (u < -limit), 0.0, glu)
    else:
        act, dact = _glu_activation(a, ACTIVATION)
        h = act * u
        d_a = dact * u
        d_u = act
    return h, d_a, d_u


# Backward of y_pair = w_pair * (h @ w_down[e]^T + b_down[e]), h = gate_unit(m_g gate, up) m_d,
# given g = dout_pair @ w_down[e] ([pairs, I], before the routing weight):
#   d w_pair = <dout_pair, y_pair / w_pair> = <g, h> + <dout_pair, b_down[e]>  (bias: host)
#   d w_down[e] = sum over pairs p of e of dout_p^T (w_p h_p)   (w h written here)
#   dh       = w_pair * g
#   dgate    = dh * m_d * dh/da * m_g;   dup = dh * m_d * dh/du

@triton.jit
def _moe_gate_bwd_kernel(g_ptr, gate_ptr, up_ptr, w_pair_ptr, wh_ptr, dgate_ptr, dup_ptr,
                         dw_pair_ptr, n_rows, n_cols, stride_gm, stride_zm, stride_zn,
                         stride_hm, stride_dzm, stride_dzn, gate_multiplier,
                         down_multiplier, alpha, limit, ACTIVATION: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """wh = w_pair * h (h recomputed and rounded to wh's dtype as the forward rounded it,
    times the weight in fp32, rounded once), dgate and dup (into dz's two views, dz's
    dtype) and dw_pair = <g, h> (fp32 [n_rows]).

    g_ptr [n_rows, n_cols] (row stride stride_gm, unit column stride, any float dtype);
    gate_ptr, up_ptr [n_rows, n_cols]: two views of z [pairs, 2 I] with z's row stride
    stride_zm and column stride stride_zn (1: its halves; 2: its even and odd columns);
    w_pair_ptr [n_rows] the routing weight of each sorted pair; wh_ptr [n_rows, n_cols]
    (row stride stride_hm, unit column stride); dgate_ptr, dup_ptr two views of dz
    [pairs, 2 I] (row stride stride_dzm, column stride stride_dzn). One program per
    BLOCK_M rows walks their columns BLOCK_N at a time, so each row's dot is one program's
    fp32 sum."""
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    w = tl.load(w_pair_ptr + offs_m, mask=mask_m, other=0.0).to(tl.float32)
    dot = tl.zeros([BLOCK_M], dtype=tl.float32)
    for off_n in range(0, n_cols, BLOCK_N):
        offs_n = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask = mask_m[:, None] & (offs_n < n_cols)[None, :]
        z_at = offs_m[:, None] * stride_zm + offs_n[None, :] * stride_zn
        a = tl.load(gate_ptr + z_at, mask=mask, other=0.0).to(tl.float32) * gate_multiplier
        u = tl.load(up_ptr + z_at, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        h, d_a, d_u = _moe_gate(a, u, ACTIVATION, alpha, limit)
        h = (h * down_multiplier).to(wh_ptr.dtype.element_ty).to(tl.float32)
        tl.store(wh_ptr + offs_m[:, None] * stride_hm + offs_n[None, :],
                 (h * w[:, None]).to(wh_ptr.dtype.element_ty), mask=mask)
        dot += tl.sum(tl.where(mask, g * h, 0.0), axis=1)  # [BM, BN] -> [BM]
        dh = g * w[:, None] * down_multiplier
        dz_at = offs_m[:, None] * stride_dzm + offs_n[None, :] * stride_dzn
        tl.store(dgate_ptr + dz_at, (dh * d_a * gate_multiplier).to(
            dgate_ptr.dtype.element_ty), mask=mask)
        tl.store(dup_ptr + dz_at, (dh * d_u).to(dup_ptr.dtype.element_ty), mask=mask)
    tl.store(dw_pair_ptr + offs_m, dot, mask=mask_m)


@triton.jit
def _moe_combine_kernel(y_ptr, pos_ptr, index_ptr, out_ptr, n_tokens, n_cols, n_experts,
                        stride_ym, stride_it, stride_ij, stride_om, K: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[t] = sum_{j < K} [0 <= index[t, j] < E] * y[pos[t, j]], in slot order.

    y_ptr [pairs, n_cols] (row stride stride_ym, unit column stride; the forward's rows
    already carry their routing weight, applied in the down GEMM's epilogue); pos_ptr
    [n_tokens * K] int64, the row of y holding pair (t, j); index_ptr [n_tokens, K] (own
    strides); out_ptr [n_tokens, n_cols] (row stride stride_om, unit column stride). fp32
    sums, rounded once. K (the router's top-k) is unrolled. Grid (token blocks, column
    blocks)."""
    offs_m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask_m = offs_m < n_tokens
    mask_n = offs_n < n_cols
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(K):
        e = tl.load(index_ptr + offs_m * stride_it + j * stride_ij, mask=mask_m, other=-1)
        valid = mask_m & (e >= 0) & (e < n_experts)
        row = tl.load(pos_ptr + offs_m * K + j, mask=valid, other=0)
        y = tl.load(y_ptr + row[:, None] * stride_ym + offs_n[None, :],
                    mask=valid[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        acc += tl.where(valid[:, None], y, 0.0)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# dhidden[t] = sum over slots j of dz[p(t, j)] @ gate_up_proj[e(t, j)] (dz [pairs, 2 I] in
# expert order). Slot j's pairs, one per token, sorted by expert, are a grouped GEMM whose
# rows scatter to distinct tokens: launched once per slot, each adding to the sum so far.

@triton.jit
def _moe_dx_kernel(dz_ptr, src_ptr, dst_ptr, w_ptr, sum_ptr, out_ptr, offs_ptr, M, N, K, G,
                   stride_dzm, stride_dzk, stride_wg, stride_wn, stride_wk, stride_sm,
                   stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, BLOCK_G: tl.constexpr,
                   TMA: tl.constexpr, W_KMAJOR: tl.constexpr, ACCUMULATE: tl.constexpr,
                   PRECISION: tl.constexpr):
    """out[dst[r]] = sum[dst[r]] (with ACCUMULATE) + dz[src[r]] @ w[g]^T for each row r
    of group g, and out[dst[r]] = sum[dst[r]] (or 0) for rows past the last group (a
    slot's sentinel pairs).

    dz_ptr [pairs, K] (any strides), src_ptr [M] int64 the dz row of each of this slot's
    M pairs (sorted by expert), dst_ptr [M] int64 their tokens (distinct); w_ptr [G, N, K]
    (group stride stride_wg; with TMA, W_KMAJOR says its K stride is 1, else its N stride
    is: gate_up_proj [E, 2 I, H] transposed); sum_ptr [tokens, N] fp32 (row stride
    stride_sm, unit column stride) the slots before this one; out_ptr [tokens, N] (row
    stride stride_om, unit column stride; sum itself, or dhidden for the last slot);
    offs_ptr [G] int32 the slot's cumulative expert ends. fp32 accumulator, the sum read
    and written in fp32, out rounded once. The tile walk is _grouped_matmul_kernel's.
    Constexprs: the tile BLOCK_M x BLOCK_N x BLOCK_K; GROUP_M; BLOCK_G a power of two
    above G; TMA w's path (dz's rows come by pointers); ACCUMULATE the sum read (not for
    the first slot); PRECISION tl.dot's input_precision for fp32.
    """
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gs, bounds, last_of, num_tiles = _group_tiles(offs_ptr, G, M, num_pid_n, BLOCK_M, BLOCK_G)
    if TMA:
        w_desc = _weight_desc(w_ptr, G, N, K, stride_wg, stride_wn, stride_wk, BLOCK_N,
                              BLOCK_K, W_KMAJOR)
    else:
        w_desc = w_ptr
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        g, end, off_m, off_n = _group_tile(tile, gs, bounds, last_of, num_pid_n, BLOCK_M,
                                           BLOCK_N, GROUP_M)
        in_group = g < G
        g_w = tl.minimum(g, G - 1)
        src, mask_m = _gathered_rows(src_ptr, 1, off_m, end, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for ki in range(tl.where(in_group, k_tiles, 0)):  # past the last group: zeros
            off_k = ki * BLOCK_K
            a = _load_gathered(dz_ptr, src, mask_m, off_k, K, stride_dzm, stride_dzk, BLOCK_K)
            b = _load_weight(w_desc, w_ptr, g_w, off_n, off_k, N, K, stride_wg, stride_wn,
                             stride_wk, BLOCK_N, BLOCK_K, TMA, W_KMAJOR)
            # [BM, BK] @ [BK, BN] -> [BM, BN]
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = (off_n + tl.arange(0, BLOCK_N)).to(tl.int64)
        dst = tl.load(dst_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
        mask = mask_m[:, None] & (offs_n < N)[None, :]
        if ACCUMULATE:
            acc += tl.load(sum_ptr + dst[:, None] * stride_sm + offs_n[None, :], mask=mask,
                           other=0.0)
        tl.store(out_ptr + dst[:, None] * stride_om + offs_n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
