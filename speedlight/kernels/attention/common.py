"""Pieces every attention kernel shares: where a sequence starts, which keys a query row
sees (and which rows see a key), how a loop's blocks split into boundary and interior
blocks, the exponent of a probability, and products over the visible pairs only.

Positions are aligned at the end: query row r of a sequence with seq_q queries and seq_k
keys sits at position i = r + seq_k - seq_q (as with a KV cache). Key j is visible to
query i when j < seq_k, j >= i - left (left >= 0) and j <= i + right (right >= 0); the
host turns causal into right = 0. A side of -1 is unbounded.

Masking is by selection, never by adding -inf: a pair the mask hides (a later key under
causal, a key outside the window, a row or key past its sequence's end) enters no sum. A
loop over key (or query) blocks splits them into boundary blocks, which some hidden pair
or an end crosses, and interior blocks, whose every pair is visible: those run with no
mask at all. In a boundary block the hidden pairs' scores are replaced by -inf (their
probabilities and score gradients by 0) with tl.where, and the second operand of its
accumulated products (v of p @ v, do of p^T @ do, q of ds^T @ q, k of ds @ k) enters
with its NaN and inf replaced by 0 (_finite_part), since a hidden pair's 0 times NaN is
NaN. A boundary block that met such a value raises the program's fault count; after the
loops a fault pass walks the boundary blocks again and adds those values' products at
the visible pairs only (_nonfinite_products). So nothing hidden reaches an output or a
gradient, as in the flash and cuDNN backends, NaN and inf at visible pairs propagate as
the arithmetic does (as reference.attention, which masks by selection too), and the loops
carry no fault code beyond one count per boundary block.
"""

import triton
import triton.language as tl

from speedlight.kernels.softcap import tanh_softcap

LOG2E = tl.constexpr(1.4426950408889634)
# The running maximum's start: the lowest finite fp32, so a row whose scores so far are all
# -inf (hidden, or -inf in the inputs) has exp2(-inf - FLOOR) = 0, never exp2(-inf + inf)
# = NaN, with no test in the loop; any finite score is at least FLOOR.
FLOOR = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q, total_k, VARLEN: tl.constexpr):
    """(first query row, first key row, seq_q, seq_k) of sequence pid_b: from cu_seqlens
    (int32 [batch + 1]) when VARLEN, else row 0 of a batch entry of the given lengths.

    Packed, whatever cu_seqlens hold: each sequence is clamped into the packed tensors
    (rows [0, total_q) and [0, total_k)), an end below its start is an empty sequence, and
    its length is cut at seq_q / seq_k (the launch's max_seqlen), so no program reads or
    writes outside q, k, v and their outputs."""
    if VARLEN:
        q_start = tl.minimum(tl.maximum(tl.load(cu_q_ptr + pid_b), 0), total_q)
        k_start = tl.minimum(tl.maximum(tl.load(cu_k_ptr + pid_b), 0), total_k)
        q_end = tl.minimum(tl.maximum(tl.load(cu_q_ptr + pid_b + 1), q_start), total_q)
        k_end = tl.minimum(tl.maximum(tl.load(cu_k_ptr + pid_b + 1), k_start), total_k)
        seq_q = tl.minimum(q_end - q_start, seq_q)
        seq_k = tl.minimum(k_end - k_start, seq_k)
    else:
        q_start = 0
        k_start = 0
    return q_start, k_start, seq_q, seq_k


@triton.jit
def _keys_seen(rows, seq_q, seq_k, left, right, WINDOW: tl.constexpr):
    """(lo, hi): query row `rows` (a scalar or a tensor of rows) sees the keys [lo, hi),
    none when hi <= lo. WINDOW=False compiles the window away (every key below seq_k)."""
    lo = rows * 0
    hi = rows * 0 + seq_k
    if WINDOW:
        pos = rows + (seq_k - seq_q)
        lo = tl.where(left >= 0, tl.maximum(pos - left, 0), lo)
        hi = tl.where(right >= 0, tl.minimum(pos + right + 1, seq_k), hi)
    return lo, hi


@triton.jit
def _rows_seeing(keys, seq_q, seq_k, left, right, WINDOW: tl.constexpr):
    """(lo, hi): key `keys` (a scalar or a tensor) is seen by the query rows [lo, hi),
    none when hi <= lo (a key past seq_k by none)."""
    lo = keys * 0
    hi = keys * 0 + seq_q
    if WINDOW:
        shift = seq_k - seq_q
        lo = tl.where(right >= 0, tl.maximum(keys - right - shift, 0), lo)
        hi = tl.where(left >= 0, tl.minimum(keys + left - shift + 1, seq_q), hi)
    return lo, tl.where(keys < seq_k, hi, 0)


@triton.jit
def _blocks(lo, hi, in_lo, in_hi, BLOCK: tl.constexpr):
    """How a loop over [lo, hi) in blocks of BLOCK, from lo rounded down to BLOCK, splits:
    the interior blocks lie whole inside [in_lo, in_hi) (where every pair is visible), the
    boundary blocks are the others. Returns (first, n_head, n_edge, mid_lo, mid_hi): the
    interior blocks start at mid_lo, mid_lo + BLOCK, ... below mid_hi; boundary block e
    (e < n_edge) at _edge_start(e, ...): n_head of them from `first` up to mid_lo, the
    rest from mid_hi up to hi. Nothing when hi <= lo."""
    lo = tl.maximum(lo, 0)
    hi = tl.maximum(hi, lo)
    first = lo // BLOCK * BLOCK
    mid_lo = tl.maximum((tl.maximum(in_lo, 0) + BLOCK - 1) // BLOCK * BLOCK, first)
    mid_hi = tl.maximum(tl.maximum(tl.minimum(in_hi, hi), 0) // BLOCK * BLOCK, mid_lo)
    n_head = tl.where(hi > lo, (tl.minimum(mid_lo, hi) - first + BLOCK - 1) // BLOCK, 0)
    n_tail = (tl.maximum(hi - mid_hi, 0) + BLOCK - 1) // BLOCK
    return first, n_head, n_head + n_tail, mid_lo, mid_hi


@triton.jit
def _edge_start(e, first, n_head, mid_lo, mid_hi, BLOCK: tl.constexpr):
    """The first index of boundary block e of _blocks' split: the head blocks end at mid_lo
    (when there is an interior), where the tail's start, mid_hi, takes over."""
    return first + e * BLOCK + tl.where(e >= n_head, mid_hi - mid_lo, 0)


@triton.jit
def _seen(lo, hi, cols):
    """[R, C]: whether row r sees column c, lo[r] <= cols[c] < hi[r] (a boundary block's
    mask: query rows against keys, or keys against query rows)."""
    return (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])


@triton.jit
def _nonfinite(x):
    """True where x is NaN or +-inf (x * 0 is NaN there, 0 elsewhere)."""
    return x.to(tl.float32) * 0.0 != 0.0


@triton.jit
def _guarded(b, SAFE: tl.constexpr):
    """(b, faults) of a boundary block's second operand, whose NaN or inf at a hidden pair
    a dot would turn into 0 * NaN: counted (faults) and, SAFE, replaced by 0 (the fault
    pass adds them back at the visible pairs, _nonfinite_products); else left in, the
    program's outputs then redone by the fault kernel."""
    faults = tl.sum(tl.sum(_nonfinite(b).to(tl.int32), 1), 0)
    if SAFE:
        b = tl.where(_nonfinite(b), tl.zeros_like(b), b)
    return b, faults


@triton.jit
def _nonfinite_products(acc, a, seen, b):
    """acc plus the products a[r, c] * b[c, d] at the visible pairs (seen [R, C]) whose b
    is NaN or inf: what a dot of _finite_part(b) left out, NaN or +-inf as IEEE makes them
    (NaN for a NaN b, for an inf b times a zero or NaN a, or for infs of both signs). Each
    kind is counted by a dot of 0/1 operands (exact in fp32), whose result lies as acc
    does; run only in the fault pass after a loop whose boundary blocks met such a b."""
    a32 = a.to(tl.float32)
    up, down = seen & (a32 > 0), seen & (a32 < 0)
    flat = seen & ~(a32 > 0) & ~(a32 < 0)  # a zero or NaN a at a visible pair
    b_nan, b_up, b_down = b != b, b == float("inf"), b == float("-inf")
    one = tl.float16
    # [R, C] @ [C, D] -> [R, D] counts
    n_nan = tl.dot(seen.to(one), b_nan.to(one)) + tl.dot(flat.to(one), (b_up | b_down).to(one))
    acc = tl.where(n_nan > 0, float("nan"), acc)
    n_up = tl.dot(up.to(one), b_up.to(one)) + tl.dot(down.to(one), b_down.to(one))
    acc = tl.where(n_up > 0, acc + float("inf"), acc)
    n_down = tl.dot(up.to(one), b_down.to(one)) + tl.dot(down.to(one), b_up.to(one))
    return tl.where(n_down > 0, acc - float("inf"), acc)  # +inf - inf: NaN


@triton.jit
def _capped(qk, sm_scale, softcap, SOFTCAP: tl.constexpr):
    """(x, dcap): the scores x = cap(qk * sm_scale), fp32, natural units, and d cap / d x
    (1 - tanh^2) with a softcap, else qk (unused)."""
    if SOFTCAP:
        return tanh_softcap(qk * sm_scale, softcap)
    return qk * sm_scale, qk


@triton.jit
def _exponent(qk, lse2, sm_scale, softcap, SOFTCAP: tl.constexpr):
    """(e, dcap) of a backward tile: p = exp2(e), e = x * log2(e) - lse2 with x the score
    (_capped) and lse2 the base-2 log-sum-exp broadcast to the tile: one FFMA per score
    without a softcap, qk * (scale * log2 e) - lse2, for a scale of either sign."""
    if SOFTCAP:
        x, dcap = _capped(qk, sm_scale, softcap, SOFTCAP)
        return x * LOG2E - lse2, dcap
    return qk * (sm_scale * LOG2E) - lse2, qk


@triton.jit
def _block(start, end, BLOCK: tl.constexpr):
    """(offs, mask) of one block: the indices start + [0, BLOCK) and which are below end."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < end


@triton.jit
def _program(pid, n_blocks, heads, DESCENDING: tl.constexpr):
    """(block, batch entry, head) of flat program id pid over n_blocks x batch x heads,
    blocks major: every (batch, head) takes its block i before any takes block i + 1
    (DESCENDING: i - 1), so the heaviest blocks start first and the grid ends on light
    ones; heads fastest, so the q heads of one GQA group run side by side on its K/V."""
    n_bh = tl.num_programs(0) // n_blocks
    blk = pid // n_bh
    if DESCENDING:
        blk = n_blocks - 1 - blk
    pid_bh = pid % n_bh
    return blk, pid_bh // heads, pid_bh % heads


@triton.jit
def _load_rows(ptr, pid_b, pid_h, rows, offs_d, mask, stride_b, stride_h, stride_row,
               UPCAST: tl.constexpr):
    """The [len(rows), BLOCK_D] tile of head pid_h of batch entry pid_b at int64 row
    indices `rows` (last dim contiguous), masked positions 0; fp32 when UPCAST."""
    x = tl.load(ptr + pid_b.to(tl.int64) * stride_b + pid_h.to(tl.int64) * stride_h
                + rows[:, None] * stride_row + offs_d[None, :], mask=mask, other=0.0)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _operand(x, dtype, UPCAST: tl.constexpr):
    """x rounded to `dtype`, as the GPU's tl.dot sees it; back in fp32 when UPCAST (the
    interpreter's bf16 dot is wrong, and products of bf16 are exact in fp32)."""
    x = x.to(dtype)
    if UPCAST:
        x = x.to(tl.float32)
    return x
