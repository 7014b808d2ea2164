"""Triton kernels only linear_cross_entropy uses: the vocab-major schedule's row statistics
and gradient blocks, and the backward's scaling that skips an upstream gradient of 1.

The cross-entropy math is cross_entropy's (kernels/cross_entropy.py's docstring): with
c = softcap * tanh(x / softcap) (or x), per row m = max c, d = sum_j exp(c_j - m),
lse = m + log d, p = exp(c - lse), and
    dloss/dc_j = p_j * A - w_t * (1 - eps) * [j == t] - eps * w_j / V
    A = w_t * (1 - eps + 2 * z * lse) + eps * W / V     (w = 1, W = V without weights)
At the target p_t - 1 cancels when the model is confident; it is taken as -d_rest / d,
d_rest the sum without the target's column, as cross_entropy's kernels take it.

The vocab-major schedule keeps (m, log d, p_t - 1) per token from its token pass
(`_lce_row_stats_kernel`, over each chunk's logits before the cross-entropy kernel writes
their gradient over them) and later writes the gradient of one block of vocabulary
columns for every token from them (`_lce_grad_block_kernel`), the block's logits computed
again by a GEMM. All arithmetic is fp32 whatever the logits' dtype.
"""

import triton
import triton.language as tl

from speedlight.kernels.softcap import tanh_softcap


@triton.jit
def _lce_row_stats_kernel(x_ptr, target_ptr, stats_ptr, n_rows, n_cols, stride_xm,
                          stride_t, stride_s, ignore_index, softcap,
                          HAS_SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """stats[0, r] = m, stats[1, r] = log d, stats[2, r] = p_t - 1 = -d_rest / d of each
    row r of logits x (capped first with HAS_SOFTCAP), in one loop over its columns.

    x_ptr [n_rows, n_cols] (row stride stride_xm, columns contiguous); target_ptr [n_rows]
    (stride_t); stats_ptr [3, n_rows] fp32 (row stride stride_s). A row whose target is
    ignored or out of range gets p_t - 1 = -1 (never read for it). BLOCK_M rows per program,
    BLOCK_N columns per step.
    """
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    t = tl.load(target_ptr + offs_m.to(tl.int64) * stride_t, mask=mask_m,
                other=ignore_index).to(tl.int64)
    rows = x_ptr + offs_m.to(tl.int64) * stride_xm
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    d_rest = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = mask_m[:, None] & (cols < n_cols)[None, :]
        c = tl.load(rows[:, None] + cols[None, :], mask=mask,
                    other=float("-inf")).to(tl.float32)
        if HAS_SOFTCAP:
            c, _ = tanh_softcap(c, softcap)
            c = tl.where(mask, c, float("-inf"))
        # [BM, BN] -> [BM]
        m_new = tl.maximum(m, tl.max(c, axis=1))
        dead = m_new == float("-inf")
        alpha = tl.where(dead, 1.0, tl.exp(m - m_new))
        e = tl.where(dead[:, None], 0.0, tl.exp(c - m_new[:, None]))
        d = d * alpha + tl.sum(e, axis=1)
        d_rest = d_rest * alpha + tl.sum(tl.where(cols[None, :] == t[:, None], 0.0, e), axis=1)
        m = m_new
    out = stats_ptr + offs_m.to(tl.int64)
    tl.store(out, m, mask=mask_m)
    tl.store(out + stride_s, tl.log(d), mask=mask_m)
    tl.store(out + 2 * stride_s, -d_rest / d, mask=mask_m)


@triton.jit
def _lce_grad_block_kernel(x_ptr, target_ptr, stats_ptr, weight_ptr, w_sum_ptr,
                           grad_scale_ptr, n_rows, n_block, col0, vocab, stride_xm,
                           stride_t, stride_s, stride_gs, ignore_index, label_smoothing,
                           z_loss, softcap, HAS_SOFTCAP: tl.constexpr,
                           HAS_WEIGHT: tl.constexpr, GRAD_SCALE: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """x[r, j] <- dloss_r / dx[r, col0 + j] * g_r, in place, over a [BLOCK_M, BLOCK_N] tile
    of one vocabulary block's logits (columns col0 .. col0 + n_block of the vocab).

    x_ptr [n_rows, n_block] (row stride stride_xm, columns contiguous); target_ptr [n_rows]
    (stride_t); stats_ptr [3, n_rows] fp32 from _lce_row_stats_kernel (row stride
    stride_s); weight_ptr [vocab] class weights and w_sum_ptr [] their sum (HAS_WEIGHT);
    grad_scale_ptr [n_rows] (stride stride_gs, 0 for one scalar; GRAD_SCALE) each row's
    upstream gradient, a mean's 1 / divisor folded in. Grid (cdiv(n_rows, BLOCK_M),
    cdiv(n_block, BLOCK_N)). Ignored rows get 0, rows with a target outside [0, vocab)
    that is not ignore_index NaN, as cross_entropy's kernels give them.
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < n_rows
    mask = mask_m[:, None] & (offs_n < n_block)[None, :]
    cols = col0 + offs_n  # columns of the vocabulary
    t = tl.load(target_ptr + offs_m.to(tl.int64) * stride_t, mask=mask_m,
                other=ignore_index).to(tl.int64)
    in_range = (t >= 0) & (t < vocab)
    ignored = t == ignore_index
    valid = mask_m & in_range & (ignored == 0)
    bad = mask_m & (in_range == 0) & (ignored == 0)
    t = tl.where(valid, t, 0)
    s_rows = stats_ptr + offs_m.to(tl.int64)
    m = tl.load(s_rows, mask=mask_m, other=0.0)
    log_d = tl.load(s_rows + stride_s, mask=mask_m, other=0.0)
    p_t_minus_1 = tl.load(s_rows + 2 * stride_s, mask=mask_m, other=0.0)
    ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + offs_n[None, :]
    x = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        c, dc = tanh_softcap(x, softcap)
    else:
        c = x
        dc = x  # unused
    if HAS_WEIGHT:
        w_t = tl.load(weight_ptr + t, mask=valid, other=0.0).to(tl.float32)
        w_sum = tl.load(w_sum_ptr).to(tl.float32)
        w = tl.load(weight_ptr + cols, mask=cols < vocab, other=0.0).to(tl.float32)
        a = w_t * (1.0 - label_smoothing)
        coef = a
        if label_smoothing > 0:  # eps = 0 must not turn an inf weight elsewhere into NaN
            coef += label_smoothing * w_sum / vocab
    else:
        w_t = tl.full([BLOCK_M], 1.0, tl.float32)
        coef = tl.full([BLOCK_M], 1.0, tl.float32)
    if z_loss > 0:
        coef += 2.0 * z_loss * w_t * (m + log_d)
    p = tl.exp((c - m[:, None]) - log_d[:, None])
    smooth = label_smoothing / vocab
    at_target = cols[None, :] == t[:, None]
    if HAS_WEIGHT:
        g = tl.where(at_target,
                     (a * p_t_minus_1 - smooth * w_t)[:, None] + p * (coef - a)[:, None],
                     p * coef[:, None] - smooth * w[None, :])
    else:
        g = tl.where(at_target,
                     p_t_minus_1[:, None] + p * (coef[:, None] - 1.0)
                     + (label_smoothing - smooth),
                     p * coef[:, None] - smooth)
    if HAS_SOFTCAP:
        g = g * dc
    if GRAD_SCALE:
        gs = tl.load(grad_scale_ptr + offs_m.to(tl.int64) * stride_gs, mask=mask_m, other=0.0)
        g = g * gs.to(tl.float32)[:, None]
    g = tl.where(valid[:, None], g, tl.where(bad[:, None], float("nan"), 0.0))
    tl.store(ptrs, g.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _lce_scale_kernel(x_ptr, g_ptr, n_elements, BLOCK: tl.constexpr):
    """x <- x * g in place (fp32 product, one rounding to x's dtype), unless g == 1: then
    every program returns after one load of g, and x is neither read nor written.

    x_ptr [n_elements] contiguous; g_ptr one value (any float dtype). A persistent grid:
    each program takes the blocks pid, pid + P, pid + 2P... of BLOCK elements (64-bit
    offsets: a d_weight passes 2^31 elements).
    """
    g = tl.load(g_ptr).to(tl.float32)
    if g != 1.0:
        for block in tl.range(tl.program_id(0), tl.cdiv(n_elements, BLOCK),
                              tl.num_programs(0)):
            offs = (block + tl.zeros([BLOCK], tl.int64)) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n_elements
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(x_ptr + offs, (x.to(tl.float32) * g).to(x_ptr.dtype.element_ty),
                     mask=mask)
