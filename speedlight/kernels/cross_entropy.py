"""Triton kernels of cross-entropy over logits [rows, vocab] with integer targets.

Per row, with c = softcap * tanh(x / softcap) (or c = x), lse = logsumexp(c), p = softmax(c),
label smoothing eps over V classes, z-loss weight z and class weights w (all 1 without
them; W = sum_j w_j), torch's weighted, smoothed cross-entropy plus a weighted z-loss:
    loss = w_t * ((1 - eps) * (lse - c[t]) + z * lse^2) + eps / V * sum_j w_j * (lse - c_j)
    dloss/dc_j = p_j * A - w_t * (1 - eps) * [j == t] - eps * w_j / V,
                 A = w_t * (1 - eps + 2 * z * lse) + eps * W / V
    dloss/dx_j = dloss/dc_j * (1 - tanh^2(x_j / softcap))        (1 without softcap)
Unweighted, A = 1 + 2 * z * lse and the loss is lse - (1 - eps) c[t] - eps mean(c) + z lse^2.
The forward computes each row's loss and, in the same pass, its gradient; the backward
only multiplies that by the upstream gradient (times 1 / #non-ignored rows for a mean, a
scalar the host folds in). All arithmetic is fp32 whatever the logits dtype.

Rows are addressed as [batch, seq] (row r = b * seq + s), so a [batch, seq, vocab] view
that is not expressible as [rows, vocab], such as logits[:, :-1], needs no copy.

Kernels:
  fwd          tiles of BLOCK_M rows, vocab <= BLOCK_N, over persistent programs (the
               tile loop pipelined on NVIDIA): the row tile stays in registers, logits are
               read once and each one's exp serves the loss and the gradient.
  fwd looped   longer rows, in two loops over the row (kernels/cross_entropy_long.py).
  split pair   few long rows cut into spans, one program per span: a stats kernel and a
               finish kernel (kernels/cross_entropy_long.py).
  bwd          grad = dlogits * grad_output (one scalar, or one per row), in place or not.

EXTRAS (fwd and fwd looped): each row's z-loss term w_t * z * lse^2, whether its argmax is
its target, and its argmax (over the logits as given; the first index among equal maxima
and a NaN counted as the largest, as torch.argmax), tracked in the same pass.

Targets: t == ignore_index gives loss 0 and a zero gradient row. A target outside
[0, vocab) that is not ignore_index is never used as an address: its row gets a NaN loss
and a NaN gradient row (the host normally rejects such targets before launching).
"""

import triton
import triton.language as tl

from speedlight.kernels.softcap import tanh_softcap

@triton.jit
def _load_logits(x_rows, cols, mask, stride_v, softcap, HAS_SOFTCAP: tl.constexpr):
    """(x, c, dc/dx): a [BM, BN] tile of logits as given, capped, and the cap's derivative,
    fp32; masked lanes hold -inf in x and c."""
    x = tl.load(x_rows[:, None] + cols[None, :].to(tl.int64) * stride_v, mask=mask,
                other=float("-inf")).to(tl.float32)
    if HAS_SOFTCAP:
        c, dc = tanh_softcap(x, softcap)
        return x, tl.where(mask, c, float("-inf")), dc
    return x, x, x  # dc is unused without a softcap


@triton.jit
def _load_class_weights(weight_ptr, cols, n_cols, HAS_WEIGHT: tl.constexpr):
    """w_j over columns cols ([BN] fp32, 0 past n_cols); 1.0 (a scalar) without weights."""
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    else:
        w = 1.0
    return w


@triton.jit
def _weighted_sum(c, w, mask, HAS_WEIGHT: tl.constexpr):
    """sum_j w_j * c_j per row of a [BM, BN] tile (masked lanes add 0)."""
    # [BM, BN] -> [BM]
    if HAS_WEIGHT:
        s = tl.sum(tl.where(mask, c * w[None, :], 0.0), axis=1)
    else:
        s = tl.sum(tl.where(mask, c, 0.0), axis=1)
    return s


@triton.jit
def _merge_argmax(best, best_idx, nan_idx, x, cols, mask):
    """Fold a [BM, BN] tile of logits x into a running first-index argmax per row ([BM]
    each): best, the largest non-NaN value so far, best_idx its first column (2^31 - 1
    before any column), nan_idx the first NaN's column (2^31 - 1 if none). The argmax is
    nan_idx when a row has a NaN (torch.argmax takes NaN as the largest), else best_idx."""
    none = 2147483647
    cols2 = cols[None, :] + tl.zeros(x.shape, tl.int32)
    is_nan = (x != x) & mask
    # [BM, BN] -> [BM]
    nan_idx = tl.minimum(nan_idx, tl.min(tl.where(is_nan, cols2, none), axis=1))
    xv = tl.where(is_nan | (mask == 0), float("-inf"), x)
    tile_max = tl.max(xv, axis=1)
    tile_idx = tl.min(tl.where((xv == tile_max[:, None]) & mask, cols2, none), axis=1)
    take = (tile_max > best) | (best_idx == none)
    return tl.where(take, tile_max, best), tl.where(take, tile_idx, best_idx), nan_idx


@triton.jit
def _store_extras(best_idx, nan_idx, t, valid, z_row, z_ptr, correct_ptr, pred_ptr, offs_m,
                  mask_m):
    """Write each row's z-loss term, whether its argmax is its target, and its argmax."""
    pred = tl.where(nan_idx != 2147483647, nan_idx, best_idx).to(tl.int64)
    tl.store(pred_ptr + offs_m, pred, mask=mask_m)
    tl.store(correct_ptr + offs_m, tl.where(valid & (pred == t), 1.0, 0.0), mask=mask_m)
    tl.store(z_ptr + offs_m, z_row, mask=mask_m)


@triton.jit
def _merge_stats(m, d, d_rest, sc, c, w, cols, t, mask, HAS_WEIGHT: tl.constexpr):
    """Fold a [BM, BN] tile c (columns cols, class weights w) into the running per-row max
    m, sum of exp(c - m) d, the same sum without the target column t d_rest, and sum of
    w_j * c_j sc ([BM] each). A row that has seen only -inf keeps m = -inf and d = 0."""
    # [BM, BN] -> [BM]
    m_new = tl.maximum(m, tl.max(c, axis=1))
    dead = m_new == float("-inf")
    alpha = tl.where(dead, 1.0, tl.exp(m - m_new))
    e = tl.where(dead[:, None], 0.0, tl.exp(c - m_new[:, None]))
    d = d * alpha + tl.sum(e, axis=1)
    d_rest = d_rest * alpha + tl.sum(tl.where(cols[None, :] == t[:, None], 0.0, e), axis=1)
    sc = sc + _weighted_sum(c, w, mask, HAS_WEIGHT)
    return m_new, d, d_rest, sc


@triton.jit
def _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index):
    """(t, valid, bad) per row: valid rows have a target in [0, n_cols); bad rows have a
    target that is neither in range nor ignore_index. t is clamped to 0 where not valid,
    so it is always a safe address."""
    t = tl.load(target_ptr + offs_m.to(tl.int64) * stride_t, mask=mask_m,
                other=ignore_index).to(tl.int64)
    ignored = t == ignore_index
    in_range = (t >= 0) & (t < n_cols)
    valid = mask_m & in_range & (ignored == 0)
    bad = mask_m & (in_range == 0) & (ignored == 0)
    return tl.where(valid, t, 0), valid, bad


@triton.jit
def _target_logit(x_rows, t, valid, stride_v, softcap, HAS_SOFTCAP: tl.constexpr):
    """c[t] per row ([BM] fp32; 0 where not valid): one gathered load per row."""
    x_t = tl.load(x_rows + t * stride_v, mask=valid, other=0.0).to(tl.float32)
    if HAS_SOFTCAP:
        x_t, _ = tanh_softcap(x_t, softcap)
    return x_t


@triton.jit
def _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing, z_loss, w_t, w_sum,
              HAS_WEIGHT: tl.constexpr):
    """(loss, log_d, coef, z_row) per row from its statistics, target logit x_t and target
    weight w_t; coef = A scales p in the gradient; z_row is the loss's z-loss term."""
    log_d = tl.log(d)
    lse = m + log_d
    coef = tl.full(m.shape, 1.0, tl.float32)
    z_row = tl.zeros(m.shape, tl.float32)
    if HAS_WEIGHT:
        # w_t (1 - eps) (lse - c_t) + eps / V (W lse - sum_j w_j c_j), grouped around m
        a = w_t * (1.0 - label_smoothing)
        coef = a
        if label_smoothing > 0:  # eps = 0 must not turn an inf weight elsewhere into NaN
            coef += label_smoothing * w_sum / n_cols
        loss = a * (m - x_t) + coef * log_d
        if label_smoothing > 0:  # eps = 0 must not turn a -inf logit elsewhere into NaN
            loss += label_smoothing / n_cols * (w_sum * m - sc)
    else:
        # lse - (1 - eps) c_t - eps * mean(c), grouped around m so that a row whose target
        # takes almost all the mass keeps its small loss.
        loss = (1.0 - label_smoothing) * (m - x_t) + log_d
        if label_smoothing > 0:
            loss += label_smoothing * (m - sc / n_cols)
    if z_loss > 0:
        z_row = w_t * z_loss * lse * lse
        loss += z_row
        coef += 2.0 * z_loss * w_t * lse
    nan_or_0 = tl.where(bad, float("nan"), 0.0)
    loss = tl.where(valid, loss, nan_or_0)
    return loss, log_d, coef, tl.where(valid, z_row, nan_or_0)


@triton.jit
def _grad_tile(c, dc, w, cols, t, valid, bad, m, log_d, p_t_minus_1, coef, w_t, gscale,
               n_cols, label_smoothing, HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """dloss/dx over a [BM, BN] tile (class weights w), with p = exp((c - m) - log_d) (c - m
    is exact near the max, and m's size never enters the rounding). At the target, p - 1
    cancels when the model is confident; it is taken as p_t_minus_1 = -d_rest / d instead:
        g_t = (p_t - 1) + p_t * (coef - 1) + eps * (1 - 1/V)                   (unweighted)
        g_t = w_t (1 - eps) (p_t - 1) + p_t * (coef - w_t (1 - eps)) - eps w_t / V
    The result is scaled by gscale ([BM, 1]: each row's upstream gradient, a mean's
    1 / divisor folded in; or 1). Ignored rows (valid and
    bad both False there) get exactly 0 whatever their logits; bad rows get NaN."""
    p = tl.exp((c - m[:, None]) - log_d[:, None])
    smooth = label_smoothing / n_cols
    if HAS_WEIGHT:
        a = w_t * (1.0 - label_smoothing)
        g = tl.where(cols[None, :] == t[:, None],
                     (a * p_t_minus_1 - smooth * w_t)[:, None] + p * (coef - a)[:, None],
                     p * coef[:, None] - smooth * w[None, :])
    else:
        g = tl.where(cols[None, :] == t[:, None],
                     p_t_minus_1[:, None] + p * (coef[:, None] - 1.0)
                     + (label_smoothing - smooth),
                     p * coef[:, None] - smooth)
    if HAS_SOFTCAP:
        g = g * dc
    g = g * gscale
    return tl.where(valid[:, None], g, tl.where(bad[:, None], float("nan"), 0.0))


@triton.jit
def _grad_scale(grad_scale_ptr, offs_m, mask_m, stride_gs, GRAD_SCALE: tl.constexpr):
    """What each row's gradient is multiplied by, [BM, 1] in fp32: grad_scale_ptr[row *
    stride_gs] (stride 0: one scalar for every row), or 1."""
    if GRAD_SCALE:
        g = tl.load(grad_scale_ptr + offs_m.to(tl.int64) * stride_gs, mask=mask_m, other=0.0)
        g = g.to(tl.float32)[:, None]
    else:
        g = 1.0
    return g


@triton.jit
def _row_offsets(offs_m, seq, stride_b, stride_s):
    """Element offset of the start of each row r = b * seq + s (int64; the division in
    int32, as rows < 2^31, where int64's costs several times its instructions)."""
    b = offs_m // seq
    return b.to(tl.int64) * stride_b + (offs_m - b * seq).to(tl.int64) * stride_s


@triton.jit
def _target_weight(weight_ptr, w_sum_ptr, t, valid, HAS_WEIGHT: tl.constexpr):
    """(w_t per row, W = sum of the class weights): (1, V, unused) without weights."""
    if HAS_WEIGHT:
        w_t = tl.load(weight_ptr + t, mask=valid, other=0.0).to(tl.float32)
        w_sum = tl.load(w_sum_ptr).to(tl.float32)
    else:
        w_t = tl.full(t.shape, 1.0, tl.float32)
        w_sum = 0.0
    return w_t, w_sum


@triton.jit
def _store_row_loss(x_rows, t, valid, bad, m, d, sc, w_t, w_sum, loss_ptr, offs_m, mask_m,
                    n_cols, stride_xv, label_smoothing, z_loss, softcap,
                    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """Write loss[offs_m] from the rows' statistics and their target logits (read here,
    before an in-place gradient overwrites them); return (log_d, coef, z_row) for the
    gradient and the extras."""
    x_t = _target_logit(x_rows, t, valid, stride_xv, softcap, HAS_SOFTCAP)
    loss, log_d, coef, z_row = _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing,
                                         z_loss, w_t, w_sum, HAS_WEIGHT)
    tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=mask_m)
    return log_d, coef, z_row


@triton.jit
def _tile_stats(c, c_t, w, cols, t, mask, HAS_WEIGHT: tl.constexpr, SMOOTHING: tl.constexpr):
    """(m, e, d, d_rest, sc) of a [BM, BN] tile of whole rows c (class weights w, target
    columns t as int32, target logits c_t): the max m, e = exp(c - m) (0 in a row of only
    -inf), the sum of e without the target's d_rest and with it d = d_rest + exp(c_t - m),
    and with SMOOTHING the sum of w_j c_j sc (0 without). Two reductions (the max, then
    d_rest), a third for sc."""
    # [BM, BN] -> [BM]
    m = tl.max(c, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # a row of only -inf: e = exp(-inf) = 0
    e = tl.exp(c - m_safe[:, None])
    # [BM, BN] -> [BM]
    d_rest = tl.sum(tl.where(cols[None, :] == t[:, None], 0.0, e), axis=1)
    d = d_rest + tl.exp(c_t - m_safe)
    sc = tl.zeros(m.shape, tl.float32)
    if SMOOTHING:
        sc = _weighted_sum(c, w, mask, HAS_WEIGHT)
    return m, e, d, d_rest, sc


@triton.jit
def _grad_from_exp(e, dc, w, cols, t, valid, bad, r, p_t_minus_1, coef, w_t, gscale, n_cols,
                   label_smoothing, HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """_grad_tile's dloss/dx from e = exp(c - m) (t: int32 target columns; gscale [BM]; r =
    gscale / d, d the row sum of e): p = e / d, so a logit's gradient is e times a factor
    per row plus a term per row (per column with class weights), the upstream scale folded
    into both: one exp per logit (the statistics') and a multiply-add."""
    smooth = label_smoothing / n_cols
    is_t = cols[None, :] == t[:, None]
    if HAS_WEIGHT:
        a = w_t * (1.0 - label_smoothing)
        k_t = r * (coef - a)
        b_t = (a * p_t_minus_1 - smooth * w_t) * gscale
        g = tl.where(is_t, e * k_t[:, None] + b_t[:, None],
                     e * (r * coef)[:, None] + w[None, :] * (-smooth * gscale)[:, None])
    else:
        k_t = r * (coef - 1.0)
        b_t = (p_t_minus_1 + (label_smoothing - smooth)) * gscale
        g = tl.where(is_t, e * k_t[:, None] + b_t[:, None],
                     e * (r * coef)[:, None] + (-smooth * gscale)[:, None])
    if HAS_SOFTCAP:
        g = g * dc
    return tl.where(valid[:, None], g, tl.where(bad[:, None], float("nan"), 0.0))


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr, weight_ptr, w_sum_ptr, z_ptr, correct_ptr, pred_ptr,
    grad_scale_ptr, n_rows, n_cols, seq,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv, stride_gs,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_WEIGHT: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    EXTRAS: tl.constexpr, GRAD_SCALE: tl.constexpr, SMOOTHING: tl.constexpr,
    BATCHED: tl.constexpr, EVEN_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
):
    """loss[r] and dx[r, :] = dloss[r]/dx[r, :] over tiles of BLOCK_M rows, each row held
    whole (n_cols <= BLOCK_N): the tile read for the statistics is reused for the gradient,
    so logits are read once, and each logit's exp serves both.

    x_ptr [batch, seq, n_cols] (strides stride_xb, stride_xs, stride_xv); target_ptr [rows]
    (stride_t); loss_ptr [rows] (fp32, or the logits dtype for reduction none); dx_ptr like
    x_ptr with its own strides (x_ptr itself for the in-place gradient); weight_ptr
    [n_cols] class weights and w_sum_ptr [] their sum (fp32); z_ptr, correct_ptr [rows]
    fp32 and pred_ptr [rows] int64, the extras; grad_scale_ptr [rows] (stride stride_gs, 0
    for one scalar) each row's factor of the gradient (a chunked loss's upstream gradient,
    a mean's 1 / divisor folded in). Persistent: program p takes the tiles p, p + P, ...
    (P programs), its tile loop pipelined STAGES deep (on NVIDIA, cp.async copies into
    STAGES - 1 shared-memory buffers: the next tiles' logits load while one is reduced; 1
    is a plain loop). The target logit is read (one gathered load per row) before the
    row's reductions, whose barriers order it before any lane's in-place gradient store.
    HAS_SOFTCAP: cap the logits. HAS_WEIGHT: class weights (else weight_ptr, w_sum_ptr are
    unused). COMPUTE_GRAD=False (no gradient wanted) writes no dx. EXTRAS=False writes no
    z, correct, pred and tracks no argmax. GRAD_SCALE=False: grad_scale_ptr unused (1).
    SMOOTHING=False (label_smoothing == 0) removes the sum of the logits. BATCHED=False:
    one stride addresses every row (seq >= n_rows), no division of the row index.
    EVEN_N: n_cols == BLOCK_N, no column mask.
    """
    offs_n = tl.arange(0, BLOCK_N)
    if EVEN_N:  # no column mask: nothing to select past the row's end
        mask_n = tl.full([BLOCK_N], 1, tl.int1)
    else:
        mask_n = offs_n < n_cols
    w = _load_class_weights(weight_ptr, offs_n, n_cols, HAS_WEIGHT)
    for tile in tl.range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0),
                         num_stages=STAGES):
        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        if BLOCK_M == 1:  # every tile the loop reaches is a row
            mask_m = tl.full([BLOCK_M], 1, tl.int1)
        else:
            mask_m = offs_m < n_rows
        if BATCHED:  # row r = b * seq + s
            x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
            dx_rows = dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds)
        else:
            x_rows = x_ptr + offs_m.to(tl.int64) * stride_xs
            dx_rows = dx_ptr + offs_m.to(tl.int64) * stride_ds
        t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols,
                                     ignore_index)
        w_t, w_sum = _target_weight(weight_ptr, w_sum_ptr, t, valid, HAS_WEIGHT)
        c_t = _target_logit(x_rows, t, valid, stride_xv, softcap, HAS_SOFTCAP)
        mask = mask_m[:, None] & mask_n[None, :]
        x, c, dc = _load_logits(x_rows, offs_n, mask, stride_xv, softcap, HAS_SOFTCAP)
        t32 = t.to(tl.int32)  # in [0, n_cols): int32 compares against the columns
        m, e, d, d_rest, sc = _tile_stats(c, c_t, w, offs_n, t32, mask, HAS_WEIGHT, SMOOTHING)
        loss, log_d, coef, z_row = _row_loss(c_t, valid, bad, m, d, sc, n_cols,
                                             label_smoothing, z_loss, w_t, w_sum, HAS_WEIGHT)
        tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=mask_m)
        if EXTRAS:
            none = tl.full([BLOCK_M], 2147483647, tl.int32)
            _, best_idx, nan_idx = _merge_argmax(tl.full([BLOCK_M], float("-inf"), tl.float32),
                                                 none, none, x, offs_n, mask)
            _store_extras(best_idx, nan_idx, t, valid, z_row, z_ptr, correct_ptr, pred_ptr,
                          offs_m, mask_m)
        if COMPUTE_GRAD:
            if GRAD_SCALE:
                gscale = tl.load(grad_scale_ptr + offs_m.to(tl.int64) * stride_gs, mask=mask_m,
                                 other=0.0).to(tl.float32)
            else:
                gscale = tl.full([BLOCK_M], 1.0, tl.float32)
            inv_d = 1.0 / d
            g = _grad_from_exp(e, dc, w, offs_n, t32, valid, bad, gscale * inv_d,
                               -d_rest * inv_d, coef, w_t, gscale, n_cols, label_smoothing,
                               HAS_SOFTCAP, HAS_WEIGHT)
            tl.store(dx_rows[:, None] + offs_n[None, :].to(tl.int64) * stride_dv,
                     g.to(dx_ptr.dtype.element_ty), mask=mask)


# Backward. The forward already wrote dx[r] = dloss[r]/dx[r]; with g the upstream gradient
# of each row's loss (one scalar for sum, that scalar / #non-ignored rows for mean:
# stride_g = 0; one value per row for none):
#   grad[r, j] = dx[r, j] * g[r]

@triton.jit
def _cross_entropy_bwd_kernel(
    dx_ptr, g_ptr, grad_ptr, n_rows, n_cols, seq,
    stride_db, stride_ds, stride_dv, stride_g, stride_ob, stride_os, stride_ov,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """grad = dx * g[row] over a [BLOCK_M, BLOCK_N] tile; the grid is
    (cdiv(rows, BLOCK_M), cdiv(n_cols, BLOCK_N)). dx_ptr and grad_ptr [batch, seq, n_cols]
    with their own strides (the same buffer when scaling in place); g_ptr [rows]."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < n_rows
    mask = mask_m[:, None] & (offs_n < n_cols)[None, :]
    cols = offs_n.to(tl.int64)
    g = tl.load(g_ptr + offs_m.to(tl.int64) * stride_g, mask=mask_m, other=0.0).to(tl.float32)
    dx_rows = dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds)
    dx = tl.load(dx_rows[:, None] + cols[None, :] * stride_dv, mask=mask, other=0.0).to(tl.float32)
    out_rows = grad_ptr + _row_offsets(offs_m, seq, stride_ob, stride_os)
    tl.store(out_rows[:, None] + cols[None, :] * stride_ov,
             (dx * g[:, None]).to(grad_ptr.dtype.element_ty), mask=mask)
