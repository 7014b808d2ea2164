"""Triton kernels of cross-entropy over logits [rows, vocab] with integer targets.

Per row, with c = softcap * tanh(x / softcap) (or c = x), lse = logsumexp(c), p = softmax(c),
label smoothing eps over V classes and z-loss weight z:
    loss = lse - (1 - eps) * c[t] - eps * mean(c) + z * lse^2
    dloss/dc_j = p_j * (1 + 2 * z * lse) - (1 - eps) * [j == t] - eps / V
    dloss/dx_j = dloss/dc_j * (1 - tanh^2(x_j / softcap))        (1 without softcap)
The forward computes each row's loss and, in the same pass, its gradient; the backward
only multiplies that by the upstream gradient (times 1 / #non-ignored rows for a mean, a
scalar the host folds in). All arithmetic is fp32 whatever the logits dtype.

Rows are addressed as [batch, seq] (row r = b * seq + s), so a [batch, seq, vocab] view
that is not expressible as [rows, vocab], such as logits[:, :-1], needs no copy.

Kernels:
  fwd          BLOCK_M rows per program, vocab <= BLOCK_N: the row tile stays in
               registers, logits are read once.
  fwd looped   longer rows: a first loop computes the online (max, sum of exp, sum of c)
               over BLOCK_N chunks, a second re-reads the row and writes the gradient.
  split pair   few long rows: each row is cut into spans, one program per span; a stats
               kernel writes each span's (max, sum exp, sum c), a finish kernel combines
               them, writes the loss (span 0) and its span of the gradient.
  bwd          grad = dlogits * grad_output (one scalar, or one per row), in place or not.

Targets: t == ignore_index gives loss 0 and a zero gradient row. A target outside
[0, vocab) that is not ignore_index is never used as an address: its row gets a NaN loss
and a NaN gradient row (the host normally rejects such targets before launching).
"""

import triton
import triton.language as tl

# tanh(y) = y * P(y^2) for |y| < _TANH_SPLIT: the Taylor series through y^17, within 3 ulp
# of tanh in fp32 there (its next term is below 2^-25 of y); above it tanh(|y|) = 1 - r
# with r = 2 / (exp(2|y|) + 1), and 1 - tanh^2 = r * (2 - r) keeps full precision as
# tanh -> 1.
_TANH_SPLIT = tl.constexpr(0.625)
_T1 = tl.constexpr(-0.3333333333333333)
_T2 = tl.constexpr(0.13333333333333333)
_T3 = tl.constexpr(-0.05396825396825397)
_T4 = tl.constexpr(0.021869488536155203)
_T5 = tl.constexpr(-0.008863235529902197)
_T6 = tl.constexpr(0.003592128036572481)
_T7 = tl.constexpr(-0.0014558343870513183)
_T8 = tl.constexpr(0.000590027440945586)


@triton.jit
def _softcap(x, softcap):
    """(c, dc/dx) = (softcap * tanh(x / softcap), 1 - tanh^2(x / softcap)), fp32.

    +-inf maps to +-softcap with derivative 0; NaN stays NaN.
    """
    y = x / softcap
    a = tl.abs(y)
    r = 2.0 / (tl.exp(2.0 * a) + 1.0)  # 1 - tanh(|y|); 0 when exp overflows
    y2 = y * y
    p = _T8 * y2 + _T7
    p = p * y2 + _T6
    p = p * y2 + _T5
    p = p * y2 + _T4
    p = p * y2 + _T3
    p = p * y2 + _T2
    p = p * y2 + _T1
    small = y * (p * y2 + 1.0)
    near_zero = a < _TANH_SPLIT
    t = tl.where(near_zero, small, tl.where(y < 0, r - 1.0, 1.0 - r))
    dt = tl.where(near_zero, 1.0 - small * small, r * (2.0 - r))
    return softcap * t, dt


@triton.jit
def _load_logits(x_rows, cols, mask, stride_v, softcap, HAS_SOFTCAP: tl.constexpr):
    """A [BM, BN] tile of (capped) logits in fp32 and dc/dx; masked lanes hold -inf."""
    x = tl.load(x_rows[:, None] + cols[None, :].to(tl.int64) * stride_v, mask=mask,
                other=float("-inf")).to(tl.float32)
    if HAS_SOFTCAP:
        c, dc = _softcap(x, softcap)
        return tl.where(mask, c, float("-inf")), dc
    return x, x  # the second value is unused without a softcap


@triton.jit
def _merge_stats(m, d, d_rest, sc, c, cols, t, mask):
    """Fold a [BM, BN] tile c (columns cols) into the running per-row max m, sum of
    exp(c - m) d, the same sum without the target column t d_rest, and sum of c sc ([BM]
    each). A row that has seen only -inf keeps m = -inf and d = 0."""
    # [BM, BN] -> [BM]
    m_new = tl.maximum(m, tl.max(c, axis=1))
    dead = m_new == float("-inf")
    alpha = tl.where(dead, 1.0, tl.exp(m - m_new))
    e = tl.where(dead[:, None], 0.0, tl.exp(c - m_new[:, None]))
    d = d * alpha + tl.sum(e, axis=1)
    d_rest = d_rest * alpha + tl.sum(tl.where(cols[None, :] == t[:, None], 0.0, e), axis=1)
    sc = sc + tl.sum(tl.where(mask, c, 0.0), axis=1)
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
        x_t, _ = _softcap(x_t, softcap)
    return x_t


@triton.jit
def _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing, z_loss):
    """(loss, log_d, coef) per row from its statistics and target logit x_t; coef =
    1 + 2 * z * lse scales p in the gradient."""
    log_d = tl.log(d)
    lse = m + log_d
    # lse - (1 - eps) c_t - eps * mean(c), grouped around m so that a row whose target
    # takes almost all the mass keeps its small loss.
    loss = (1.0 - label_smoothing) * (m - x_t) + log_d
    if label_smoothing > 0:  # eps = 0 must not turn a -inf logit elsewhere into NaN
        loss += label_smoothing * (m - sc / n_cols)
    coef = tl.full(m.shape, 1.0, tl.float32)
    if z_loss > 0:
        loss += z_loss * lse * lse
        coef += 2.0 * z_loss * lse
    loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))
    return loss, log_d, coef


@triton.jit
def _grad_tile(c, dc, cols, t, valid, bad, m, log_d, p_t_minus_1, coef, n_cols,
               label_smoothing, HAS_SOFTCAP: tl.constexpr):
    """dloss/dx over a [BM, BN] tile, with p = exp((c - m) - log_d) (c - m is exact near the
    max, and m's size never enters the rounding). At the target, p - 1 cancels when the
    model is confident; it is taken as p_t_minus_1 = -d_rest / d instead, so
        g_t = (p_t - 1) + p_t * (coef - 1) + eps * (1 - 1/V).
    Ignored rows (valid and bad both False there) get exactly 0 whatever their logits;
    bad rows get NaN."""
    p = tl.exp((c - m[:, None]) - log_d[:, None])
    smooth = label_smoothing / n_cols
    g = tl.where(cols[None, :] == t[:, None],
                 p_t_minus_1[:, None] + p * (coef[:, None] - 1.0) + (label_smoothing - smooth),
                 p * coef[:, None] - smooth)
    if HAS_SOFTCAP:
        g = g * dc
    return tl.where(valid[:, None], g, tl.where(bad[:, None], float("nan"), 0.0))


@triton.jit
def _row_offsets(offs_m, seq, stride_b, stride_s):
    """Element offset of the start of each row r = b * seq + s (int64)."""
    rows = offs_m.to(tl.int64)
    b = rows // seq
    return b * stride_b + (rows - b * seq) * stride_s


@triton.jit
def _span_stats(x_rows, mask_m, t, start, end, stride_v, softcap, HAS_SOFTCAP: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(max, sum exp(c - max), the same without column t, sum c) per row over columns
    [start, end), BLOCK_N at a time."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    d_rest = tl.zeros([BLOCK_M], tl.float32)
    sc = tl.zeros([BLOCK_M], tl.float32)
    for s in range(start, end, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        mask = mask_m[:, None] & (cols < end)[None, :]
        c, _ = _load_logits(x_rows, cols, mask, stride_v, softcap, HAS_SOFTCAP)
        m, d, d_rest, sc = _merge_stats(m, d, d_rest, sc, c, cols, t, mask)
    return m, d, d_rest, sc


@triton.jit
def _span_grad(x_rows, dx_rows, mask_m, start, end, stride_xv, stride_dv, t, valid, bad,
               m, log_d, p_t_minus_1, coef, n_cols, label_smoothing, softcap,
               HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write dloss/dx over columns [start, end), re-reading the logits BLOCK_N at a time."""
    for s in range(start, end, BLOCK_N):
        cols = s + tl.arange(0, BLOCK_N)
        mask = mask_m[:, None] & (cols < end)[None, :]
        c, dc = _load_logits(x_rows, cols, mask, stride_xv, softcap, HAS_SOFTCAP)
        g = _grad_tile(c, dc, cols, t, valid, bad, m, log_d, p_t_minus_1, coef, n_cols,
                       label_smoothing, HAS_SOFTCAP)
        tl.store(dx_rows[:, None] + cols[None, :].to(tl.int64) * stride_dv,
                 g.to(dx_rows.dtype.element_ty), mask=mask)


@triton.jit
def _store_row_loss(x_rows, t, valid, bad, m, d, sc, loss_ptr, offs_m, mask_m, n_cols,
                    stride_xv, label_smoothing, z_loss, softcap, HAS_SOFTCAP: tl.constexpr):
    """Write loss[offs_m] from the rows' statistics and their target logits (read here,
    before an in-place gradient overwrites them); return (log_d, coef) for the gradient."""
    x_t = _target_logit(x_rows, t, valid, stride_xv, softcap, HAS_SOFTCAP)
    loss, log_d, coef = _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing, z_loss)
    tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=mask_m)
    return log_d, coef


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr,
    n_rows, n_cols, seq,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """loss[r] and dx[r, :] = dloss[r]/dx[r, :] for the BLOCK_M rows of one program, each
    row held whole (n_cols <= BLOCK_N): the tile read for the statistics is reused for the
    gradient, so logits are read once.

    x_ptr [batch, seq, n_cols] (strides stride_xb, stride_xs, stride_xv); target_ptr [rows]
    (stride_t); loss_ptr [rows] (fp32, or the logits dtype for reduction none); dx_ptr like
    x_ptr with its own strides (x_ptr itself for the in-place gradient). Program pid
    covers rows [pid * BLOCK_M, (pid + 1) * BLOCK_M).
    HAS_SOFTCAP: cap the logits. COMPUTE_GRAD=False (no gradient wanted) writes the loss
    only.
    """
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    offs_n = tl.arange(0, BLOCK_N)
    mask = mask_m[:, None] & (offs_n < n_cols)[None, :]
    c, dc = _load_logits(x_rows, offs_n, mask, stride_xv, softcap, HAS_SOFTCAP)
    zero = tl.zeros([BLOCK_M], tl.float32)
    m, d, d_rest, sc = _merge_stats(zero + float("-inf"), zero, zero, zero, c, offs_n, t, mask)
    log_d, coef = _store_row_loss(x_rows, t, valid, bad, m, d, sc, loss_ptr, offs_m, mask_m,
                                  n_cols, stride_xv, label_smoothing, z_loss, softcap,
                                  HAS_SOFTCAP)
    if COMPUTE_GRAD:
        dx_rows = dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds)
        g = _grad_tile(c, dc, offs_n, t, valid, bad, m, log_d, -d_rest / d, coef, n_cols,
                       label_smoothing, HAS_SOFTCAP)
        tl.store(dx_rows[:, None] + offs_n[None, :].to(tl.int64) * stride_dv,
                 g.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cross_entropy_fwd_looped_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr,
    n_rows, n_cols, seq,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """As _cross_entropy_fwd_kernel for rows longer than BLOCK_N: a first loop computes the
    online (max, sum of exp, sum of c) over BLOCK_N chunks, a second re-reads the row and
    writes the gradient. Pointers and constexprs as there."""
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    m, d, d_rest, sc = _span_stats(x_rows, mask_m, t, 0, n_cols, stride_xv, softcap,
                                   HAS_SOFTCAP, BLOCK_M, BLOCK_N)
    log_d, coef = _store_row_loss(x_rows, t, valid, bad, m, d, sc, loss_ptr, offs_m, mask_m,
                                  n_cols, stride_xv, label_smoothing, z_loss, softcap,
                                  HAS_SOFTCAP)
    if COMPUTE_GRAD:
        _span_grad(x_rows, dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds), mask_m,
                   0, n_cols, stride_xv, stride_dv, t, valid, bad, m, log_d, -d_rest / d,
                   coef, n_cols, label_smoothing, softcap, HAS_SOFTCAP, BLOCK_N)


@triton.jit
def _cross_entropy_split_stats_kernel(
    x_ptr, target_ptr, stats_ptr, n_cols, seq, span, n_splits,
    stride_xb, stride_xs, stride_xv, stride_t, ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """(max, sum exp(c - max), the same without the target, sum c, c[t]) of span q of row
    r into stats_ptr[:, r, q] ([5, rows, n_splits] fp32; c[t] is the row's, written by
    span 0); the grid is (rows, n_splits). The target logit is read here, before the
    finish kernel may overwrite it with the in-place gradient."""
    row = tl.program_id(0)
    q = tl.program_id(1)
    offs_m = row + tl.arange(0, 1)
    mask_m = offs_m >= 0
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, _ = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)
    start = q * span
    m, d, d_rest, sc = _span_stats(x_rows, mask_m, t, start, tl.minimum(start + span, n_cols),
                                   stride_xv, softcap, HAS_SOFTCAP, 1, BLOCK_N)
    n_stats = tl.num_programs(0).to(tl.int64) * n_splits
    at = row.to(tl.int64) * n_splits + q + tl.arange(0, 1)
    tl.store(stats_ptr + at, m)
    tl.store(stats_ptr + n_stats + at, d)
    tl.store(stats_ptr + 2 * n_stats + at, d_rest)
    tl.store(stats_ptr + 3 * n_stats + at, sc)
    if q == 0:
        x_t = _target_logit(x_rows, t, valid, stride_xv, softcap, HAS_SOFTCAP)
        tl.store(stats_ptr + 4 * n_stats + at, x_t)


@triton.jit
def _cross_entropy_split_finish_kernel(
    x_ptr, target_ptr, loss_ptr, dx_ptr, stats_ptr,
    n_cols, seq, span, n_splits,
    stride_xb, stride_xs, stride_xv, stride_t, stride_db, stride_ds, stride_dv,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_SOFTCAP: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """Combine the n_splits statistics of row r; span 0 writes loss[r], span q writes
    dx[r] over its columns (when COMPUTE_GRAD). Pointers as in _cross_entropy_fwd_kernel
    plus stats_ptr [5, rows, n_splits]; the grid is (rows, n_splits or 1)."""
    row = tl.program_id(0)
    q = tl.program_id(1)
    offs_m = row + tl.arange(0, 1)
    mask_m = offs_m >= 0
    x_rows = x_ptr + _row_offsets(offs_m, seq, stride_xb, stride_xs)
    t, valid, bad = _row_targets(target_ptr, offs_m, mask_m, stride_t, n_cols, ignore_index)

    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < n_splits
    n_stats = tl.num_programs(0).to(tl.int64) * n_splits
    at = row.to(tl.int64) * n_splits + offs_s
    ms = tl.load(stats_ptr + at, mask=mask_s, other=float("-inf"))
    ds = tl.load(stats_ptr + n_stats + at, mask=mask_s, other=0.0)
    d_rests = tl.load(stats_ptr + 2 * n_stats + at, mask=mask_s, other=0.0)
    scs = tl.load(stats_ptr + 3 * n_stats + at, mask=mask_s, other=0.0)
    # [BS] -> scalars, then [1] like the row statistics of the other kernels. (Reduced from
    # a [1, BS] tile they would carry its layout, and the compiler would convert the
    # gradient tile to it through shared memory.)
    m = tl.max(ms, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    scale = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m_safe))
    one = tl.zeros([1], tl.float32)
    d = tl.sum(ds * scale, axis=0) + one
    d_rest = tl.sum(d_rests * scale, axis=0) + one
    sc = tl.sum(scs, axis=0) + one
    m = m + one
    x_t = tl.load(stats_ptr + 4 * n_stats + row.to(tl.int64) * n_splits + tl.arange(0, 1))

    loss, log_d, coef = _row_loss(x_t, valid, bad, m, d, sc, n_cols, label_smoothing, z_loss)
    tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=q == 0)

    if COMPUTE_GRAD:
        start = q * span
        _span_grad(x_rows, dx_ptr + _row_offsets(offs_m, seq, stride_db, stride_ds), mask_m,
                   start, tl.minimum(start + span, n_cols), stride_xv, stride_dv, t, valid, bad,
                   m, log_d, -d_rest / d, coef, n_cols, label_smoothing, softcap, HAS_SOFTCAP,
                   BLOCK_N)


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
