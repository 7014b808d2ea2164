"""Triton kernels of speedlight's grouped GEMM, the matmuls of a mixture of experts:
out[rows of group g] = act(x[rows of g] @ w[g]^T + bias[g]), and the weight gradient
dw[g] = dy[rows of g]^T @ x[rows of g].

Rows of x arrive grouped: group g owns rows [offs[g-1], offs[g]) (offs[-1] taken as 0),
from int32 cumulative ends read on the device, so nothing is known of the groups on the
host. Both kernels are persistent (about one program per SM walks tiles p, p + P, ...):

  _grouped_matmul_kernel  the tiles of every group in turn, each group's rows cut into
                          BLOCK_M-row tiles from its own first row (no padding of x; a
                          group's last tile stops at its last row), and after the last
                          group the rows no group owns (offs[G-1]..M), written as zeros.
                          Every program scans the G cumulative ends once, counting the
                          tiles of the groups before its next tile, so there is one launch
                          whatever the routing.
  _grouped_matmul_dw_kernel  a static G x (P / BLOCK_P) x (Q / BLOCK_Q) tiles of
                          c[g] = a[rows of g]^T @ b[rows of g], each reducing over its
                          group's rows in fp32 (an empty group's tile is zeros), the
                          groups walked heaviest first (a rank the launcher sorts on the
                          device): a tile's cost is its group's rows.

Either kernel may read one operand's rows through an index (GATHER, GATHER_OF): row r is
the source's row rows[r] // rows_div, loaded by pointers, so a mixture of experts reads
its tokens in expert order without a gathered copy.

Operands (constexpr TMA): device-side tensor descriptors made per group, whose row count
is the group's end, so TMA zero-fills rows past the group on loads and clips them on
stores (a group's tile never writes its neighbour's rows); or masked pointer loads with
any strides. Offsets are clamped into [previous end, M] as they are read: whatever they
hold, no access falls outside x, w or out (the public function checks their values).

Under the Triton interpreter bf16 tiles are upcast before tl.dot (kernels/matmul.py's
_load_operand does it, see there).
"""

import triton
import triton.language as tl

from speedlight.kernels.glu import _glu_activation
from speedlight.kernels.matmul import (INTERPRETED, _load_operand, _operand_desc, _store_tile,
                                       _tile_coords)


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _group_bounds(offs_ptr, G, M, BLOCK_G: tl.constexpr):
    """[starts, ends) of every group ([BLOCK_G] lanes, BLOCK_G > G): lane G is the rows
    past the last group (ending at M), lanes past it are empty at M. Ends are clamped into
    [0, M] and made non-decreasing (a running max): whatever the offsets hold, the groups
    cut [0, M) into disjoint row ranges, every row in exactly one."""
    gs = tl.arange(0, BLOCK_G)
    raw_end = tl.load(offs_ptr + gs, mask=gs < G, other=0)
    raw_end = tl.where(gs < G, raw_end, M)
    raw_start = tl.load(offs_ptr + gs - 1, mask=(gs >= 1) & (gs <= G), other=0)
    raw_start = tl.where(gs <= G, raw_start, M)
    ends = tl.associative_scan(tl.maximum(tl.minimum(raw_end, M), 0), 0, _max_combine)
    starts = tl.associative_scan(tl.maximum(tl.minimum(raw_start, M), 0), 0, _max_combine)
    return gs, starts, ends


@triton.jit
def _group_tiles(offs_ptr, G, M, num_pid_n, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """What a program needs to find any tile's group: the lanes gs, each group's rows as
    one int64 (start in the high half, end in the low), one past each group's last tile,
    and the number of tiles (every group's row tiles times num_pid_n, the rows past the
    last group's last)."""
    gs, starts, ends = _group_bounds(offs_ptr, G, M, BLOCK_G)
    tiles = tl.cdiv(ends - starts, BLOCK_M) * num_pid_n
    last_of = tl.cumsum(tiles, 0)  # one past each group's last tile
    bounds = (starts.to(tl.int64) << 32) | ends.to(tl.int64)
    return gs, bounds, last_of, tl.sum(tiles, 0)


@triton.jit
def _group_tile(tile, gs, bounds, last_of, num_pid_n, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(g, end, off_m, off_n) of tile `tile`: its group (G past the last), the group's end
    row, the tile's first row and column. Three lane reductions; row tiles start at the
    group's first row, GROUP_M of them sharing a column of w's tiles."""
    g = tl.sum((last_of <= tile).to(tl.int32), 0)  # the group holding the tile
    span = tl.sum(tl.where(gs == g, bounds, 0), 0)
    start = (span >> 32).to(tl.int32)
    end = (span & 0xFFFFFFFF).to(tl.int32)
    m_tiles = tl.cdiv(end - start, BLOCK_M)
    g_first = tl.sum(tl.where(gs == g, last_of, 0), 0) - m_tiles * num_pid_n
    pid_m, pid_n = _tile_coords(tile - g_first, m_tiles, num_pid_n, GROUP_M)
    return g, end, start + pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _weight_desc(w_ptr, G, N, K, stride_wg, stride_wn, stride_wk, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, W_KMAJOR: tl.constexpr):
    """One 3-D descriptor over every group's weight: [G, N, K] tiles [1, BN, BK] when its
    K stride is 1, else over its [G, K, N] memory, tiles [1, BK, BN]."""
    if W_KMAJOR:
        return tl.make_tensor_descriptor(w_ptr, shape=[G, N, K], strides=[stride_wg, stride_wn, 1],
                                         block_shape=[1, BLOCK_N, BLOCK_K])
    else:
        return tl.make_tensor_descriptor(w_ptr, shape=[G, K, N], strides=[stride_wg, stride_wk, 1],
                                         block_shape=[1, BLOCK_K, BLOCK_N])


@triton.jit
def _load_weight(w_desc, w_ptr, g, off_n, off_k, N, K, stride_wg, stride_wn, stride_wk,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr,
                 W_KMAJOR: tl.constexpr):
    """The [BLOCK_K, BLOCK_N] tile of w[g]^T at (off_k, off_n), zero past N and K (w[g]'s
    own edges: a tail never reads the next group's weights; by TMA, or masked pointers)."""
    if TMA:
        if W_KMAJOR:
            b = tl.trans(w_desc.load([g, off_n, off_k]).reshape(BLOCK_N, BLOCK_K))
        else:
            b = w_desc.load([g, off_k, off_n]).reshape(BLOCK_K, BLOCK_N)
        if INTERPRETED and b.dtype == tl.bfloat16:
            b = b.to(tl.float32)
    else:
        w_g = w_ptr + g.to(tl.int64) * stride_wg
        b = _load_operand(w_g, w_g, off_k, off_n, K, N, stride_wk, stride_wn, BLOCK_K,
                          BLOCK_N, False, False)
    return b


@triton.jit
def _gathered_rows(rows_ptr, rows_div, off_m, end, BLOCK_M: tl.constexpr):
    """(src, mask_m): the source rows (int64 [BLOCK_M]) of a tile's rows off_m.. of a
    gathered operand, rows[r] // rows_div (a router's sort order over (token, slot) pairs
    divided by k gives each pair's token), and which of them lie before the group's end
    (src 0 past it)."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    src = tl.load(rows_ptr + offs_m, mask=mask_m, other=0)
    return src.to(tl.int64) // rows_div, mask_m


@triton.jit
def _load_gathered(x_ptr, src, mask_m, off_k, K, stride_xm, stride_xk, BLOCK_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] tile of rows src of x at column off_k, zero past K and on
    rows outside mask_m, by pointers: the gather happens in the GEMM's operand load, never
    as a copy of x."""
    offs_k = off_k + tl.arange(0, BLOCK_K)
    a = tl.load(x_ptr + src[:, None] * stride_xm + offs_k.to(tl.int64)[None, :] * stride_xk,
                mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
    if INTERPRETED and a.dtype == tl.bfloat16:
        a = a.to(tl.float32)
    return a


@triton.jit
def _grouped_matmul_kernel(x_ptr, rows_ptr, w_ptr, out_ptr, dact_ptr, bias_ptr, scale_ptr,
                           offs_ptr, M, N, K, G, rows_div, stride_xm, stride_xk, stride_wg,
                           stride_wn, stride_wk, stride_om, stride_bg, stride_bn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           BLOCK_G: tl.constexpr, TMA: tl.constexpr,
                           X_KMAJOR: tl.constexpr, W_KMAJOR: tl.constexpr,
                           GATHER: tl.constexpr, HAS_BIAS: tl.constexpr,
                           ACTIVATION: tl.constexpr, STORE_DACT: tl.constexpr,
                           ROW_SCALE: tl.constexpr, PRECISION: tl.constexpr):
    """out = act(z) (times scale[row] with ROW_SCALE), z = x @ w[g]^T + bias[g] on the rows
    of each group g; zeros on rows past the last group; dact = act'(z) (STORE_DACT, for
    the backward; never scaled).

    x_ptr [M, K] (any strides; with TMA, X_KMAJOR says its K stride is 1, else its M
    stride is), or with GATHER the source rows [*, K] whose row rows[r] // rows_div is row
    r's (rows_ptr [M] int64, e.g. a router's sort order over (token, slot) pairs with
    rows_div its k: a mixture of experts' tokens read in expert order by the A loads, no
    gathered copy); w_ptr [G, N, K] (group stride stride_wg; with TMA, W_KMAJOR says its K
    stride is 1, else its N stride is: a [G, K, N] tensor transposed); out_ptr, dact_ptr
    [M, N] with row stride stride_om, unit column stride, dact in out's dtype; bias_ptr
    [G, N]; scale_ptr [M] (fp32 or any float: a mixture of experts' routing weight of
    each sorted pair); offs_ptr [G] int32 cumulative group ends. Accumulates in fp32.
    Tiles are numbered group by group (row tiles from each group's first row, GROUP_M of
    them sharing a column of w's tiles in L2), the rows past the last group last. Each
    program reads every group's bounds once ([BLOCK_G] lanes, one scan for the tile
    counts); a tile finds its group with three lane reductions. Stores are masked at the
    group's last row (a TMA store clips only at the tensor's edge).
    Constexprs: the tile BLOCK_M x BLOCK_N x BLOCK_K; GROUP_M; BLOCK_G a power of two
    above G; TMA the operand path (w's; x's too unless GATHER, whose rows come by
    pointers); GATHER x's rows by index; HAS_BIAS, ACTIVATION (none, silu, gelu_tanh,
    gelu), STORE_DACT, ROW_SCALE the epilogue compiled in; PRECISION tl.dot's
    input_precision for fp32.
    """
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gs, bounds, last_of, num_tiles = _group_tiles(offs_ptr, G, M, num_pid_n, BLOCK_M, BLOCK_G)
    if TMA and not GATHER:
        x_desc = _operand_desc(x_ptr, M, K, stride_xm, stride_xk, BLOCK_M, BLOCK_K, X_KMAJOR)
    else:
        x_desc = x_ptr
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
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
            b = _load_weight(w_desc, w_ptr, g_w, off_n, off_k, N, K, stride_wg, stride_wn,
                             stride_wk, BLOCK_N, BLOCK_K, TMA, W_KMAJOR)
            # [BM, BK] @ [BK, BN] -> [BM, BN]
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + g_w.to(tl.int64) * stride_bg
                           + offs_n.to(tl.int64) * stride_bn,
                           mask=(offs_n < N) & in_group, other=0.0)
            acc = acc + bias.to(tl.float32)[None, :]
        if ACTIVATION == "none":
            y = acc
            dact = tl.full(acc.shape, 1.0, tl.float32)
        else:
            y, dact = _glu_activation(acc, ACTIVATION)
        if ROW_SCALE:
            offs_m = off_m + tl.arange(0, BLOCK_M)
            scale = tl.load(scale_ptr + offs_m, mask=offs_m < end, other=0.0)
            y = y * scale.to(tl.float32)[:, None]
        # masked at the group's last row: the next group's rows are another tile's
        _store_tile(out_ptr, out_ptr, y, off_m, off_n, end, N, stride_om, 1, BLOCK_M,
                    BLOCK_N, False)
        if STORE_DACT:
            _store_tile(dact_ptr, dact_ptr, dact, off_m, off_n, end, N, stride_om, 1,
                        BLOCK_M, BLOCK_N, False)


@triton.jit
def _grouped_matmul_dw_kernel(a_ptr, b_ptr, rows_ptr, c_ptr, dbias_ptr, offs_ptr, rank_ptr, M,
                              P, Q, G, rows_div, stride_am, stride_ap, stride_bm, stride_bq,
                              stride_cg, stride_cp, stride_cq, stride_dg,
                              BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr,
                              BLOCK_M: tl.constexpr, TMA: tl.constexpr,
                              A_PMAJOR: tl.constexpr, B_QMAJOR: tl.constexpr,
                              GATHER_OF: tl.constexpr, BIAS_OF: tl.constexpr,
                              PRECISION: tl.constexpr):
    """c[g] = a[rows of g]^T @ b[rows of g] for every group g (zeros for an empty one), and
    dbias[g] = the column sums of a's (BIAS_OF "a") or b's (BIAS_OF "b") rows of g.

    The weight gradient of out = x @ w[g]^T: dw[g] = dy_g^T @ x_g (a = dy, b = x), or its
    transpose x_g^T @ dy_g (a = x, b = dy) when w lies as [G, K, N]; dbias[g] the sum of
    dy_g's rows. a_ptr [M, P], b_ptr [M, Q] (any strides; with TMA, A_PMAJOR / B_QMAJOR say
    the P / Q stride is 1, else the M stride is); with GATHER_OF "a" (or "b") that operand
    is the source rows [*, P] whose row rows[r] // rows_div is row r's (rows_ptr [M] int64:
    a mixture of experts' tokens read in expert order by the reduction's loads, by
    pointers, no gathered copy); c_ptr [G, P, Q] (own strides, c's dtype); dbias_ptr [G, P
    or Q] (row stride stride_dg, unit column stride); offs_ptr [G] int32 cumulative group
    ends; rank_ptr [G] int32 the groups heaviest first (a permutation of [0, G): the
    schedule walks the groups in that order, so the longest reductions start first and a
    skewed routing's hot expert does not finish last). Each tile reduces over its group's
    rows BLOCK_M at a time in fp32, rounded once. Constexprs: the tile BLOCK_P x BLOCK_Q,
    the reduction step BLOCK_M, TMA the operand path (a gathered operand's loads are
    pointers whatever TMA says), GATHER_OF "" / "a" / "b", BIAS_OF "" (no bias) / "a" /
    "b", PRECISION as _grouped_matmul_kernel's.
    """
    A_TMA: tl.constexpr = TMA and GATHER_OF != "a"
    B_TMA: tl.constexpr = TMA and GATHER_OF != "b"
    num_pid_p = tl.cdiv(P, BLOCK_P)
    num_pid_q = tl.cdiv(Q, BLOCK_Q)
    per_group = num_pid_p * num_pid_q
    for tile in tl.range(tl.program_id(0), G * per_group, tl.num_programs(0)):
        g = tl.load(rank_ptr + tile // per_group)
        g = tl.minimum(tl.maximum(g, 0), G - 1)
        pid_p = (tile % per_group) % num_pid_p  # consecutive tiles share b's column tile
        pid_q = (tile % per_group) // num_pid_p
        off_p = pid_p * BLOCK_P
        off_q = pid_q * BLOCK_Q
        start = tl.load(offs_ptr + tl.maximum(g - 1, 0), mask=g > 0, other=0)
        start = tl.minimum(tl.maximum(start, 0), M)
        end = tl.minimum(tl.maximum(tl.load(offs_ptr + g), start), M)
        # the group's rows only: TMA zero-fills those past its end
        if A_TMA:
            a_desc = _operand_desc(a_ptr, end, P, stride_am, stride_ap, BLOCK_M, BLOCK_P,
                                   A_PMAJOR)
        else:
            a_desc = a_ptr
        if B_TMA:
            b_desc = _operand_desc(b_ptr, end, Q, stride_bm, stride_bq, BLOCK_M, BLOCK_Q,
                                   B_QMAJOR)
        else:
            b_desc = b_ptr
        acc = tl.zeros([BLOCK_P, BLOCK_Q], dtype=tl.float32)
        if BIAS_OF == "a":
            col_sum = tl.zeros([BLOCK_P], dtype=tl.float32)
        else:
            col_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
        # a gathered operand's row indices one step ahead: its loads' addresses then come
        # from the loop's carried values, not a load of the same step, and pipeline
        src_next, mask_next = _gathered_rows(rows_ptr, rows_div, start, end, BLOCK_M)
        for off_m in range(start, end, BLOCK_M):
            src, mask_src = src_next, mask_next
            if GATHER_OF != "":
                src_next, mask_next = _gathered_rows(rows_ptr, rows_div, off_m + BLOCK_M, end,
                                                     BLOCK_M)
            if GATHER_OF == "a":
                a = _load_gathered(a_ptr, src, mask_src, off_p, P, stride_am, stride_ap,
                                   BLOCK_P)
            else:
                a = _load_operand(a_desc, a_ptr, off_m, off_p, end, P, stride_am, stride_ap,
                                  BLOCK_M, BLOCK_P, A_TMA, A_PMAJOR)
            if GATHER_OF == "b":
                b = _load_gathered(b_ptr, src, mask_src, off_q, Q, stride_bm, stride_bq,
                                   BLOCK_Q)
            else:
                b = _load_operand(b_desc, b_ptr, off_m, off_q, end, Q, stride_bm, stride_bq,
                                  BLOCK_M, BLOCK_Q, B_TMA, B_QMAJOR)
            # [BP, BM] @ [BM, BQ] -> [BP, BQ]
            acc = tl.dot(tl.trans(a), b, acc, input_precision=PRECISION)
            if BIAS_OF == "a":
                col_sum += tl.sum(a.to(tl.float32), axis=0)  # [BM, BP] -> [BP]
            elif BIAS_OF == "b":
                col_sum += tl.sum(b.to(tl.float32), axis=0)  # [BM, BQ] -> [BQ]
        offs_p = off_p + tl.arange(0, BLOCK_P)
        offs_q = off_q + tl.arange(0, BLOCK_Q)
        c_g = c_ptr + g.to(tl.int64) * stride_cg
        mask = (offs_p < P)[:, None] & (offs_q < Q)[None, :]
        tl.store(c_g + offs_p.to(tl.int64)[:, None] * stride_cp
                 + offs_q.to(tl.int64)[None, :] * stride_cq,
                 acc.to(c_ptr.dtype.element_ty), mask=mask)
        if BIAS_OF == "a":
            tl.store(dbias_ptr + g.to(tl.int64) * stride_dg + offs_p, col_sum.to(
                dbias_ptr.dtype.element_ty), mask=(offs_p < P) & (pid_q == 0))
        elif BIAS_OF == "b":
            tl.store(dbias_ptr + g.to(tl.int64) * stride_dg + offs_q, col_sum.to(
                dbias_ptr.dtype.element_ty), mask=(offs_q < Q) & (pid_p == 0))
