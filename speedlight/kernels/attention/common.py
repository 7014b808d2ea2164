"""Pieces every attention kernel shares: where a sequence starts, which keys a query sees,
the score of a [BLOCK_M, BLOCK_N] tile and the backward's probabilities and score gradients.

Positions are aligned at the end: query row r of a sequence with seq_q queries and seq_k
keys sits at position i = r + seq_k - seq_q (as with a KV cache). Key j is visible to
query i when j < seq_k, j >= i - left (left >= 0) and j <= i + right (right >= 0); the
host turns causal into right = 0. A side of -1 is unbounded.
"""

import triton
import triton.language as tl

from speedlight.kernels.cross_entropy import _softcap

LOG2E = tl.constexpr(1.4426950408889634)


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
def _key_range(m_lo, m_hi, seq_q, seq_k, left, right, BLOCK_N: tl.constexpr):
    """[lo, hi) of the keys query rows [m_lo, m_hi) can see, lo rounded down to BLOCK_N."""
    shift = seq_k - seq_q
    lo = 0
    hi = seq_k
    if left >= 0:
        lo = tl.maximum(m_lo + shift - left, 0)
    if right >= 0:
        hi = tl.minimum(m_hi - 1 + shift + right + 1, seq_k)
    lo = (lo // BLOCK_N) * BLOCK_N
    return lo, hi


@triton.jit
def _query_range(n_lo, n_hi, seq_q, seq_k, left, right, BLOCK_M: tl.constexpr):
    """[lo, hi) of the query rows that can see some key of [n_lo, n_hi), lo rounded down
    to BLOCK_M."""
    shift = seq_k - seq_q
    lo = 0
    hi = seq_q
    if right >= 0:
        lo = tl.maximum(n_lo - right - shift, 0)
    if left >= 0:
        hi = tl.minimum(n_hi - 1 + left - shift + 1, seq_q)
    lo = (lo // BLOCK_M) * BLOCK_M
    return lo, hi


@triton.jit
def _visible(rows, keys, seq_q, seq_k, left, right, WINDOW: tl.constexpr):
    """Mask of the (query row, key) pairs that see each other, rows and keys broadcast
    against each other ([BM, 1] and [1, BN], or transposed for a [BN, BM] tile); WINDOW=False
    compiles the window tests away (only the ends of the rows and keys are checked)."""
    mask = (rows < seq_q) & (keys < seq_k)
    if WINDOW:
        pos = rows + (seq_k - seq_q)
        mask &= ((left < 0) | (keys >= pos - left)) & ((right < 0) | (keys <= pos + right))
    return mask


@triton.jit
def _hidden(rows, keys, seq_q, seq_k, left, right):
    """Mask of the pairs of a sequence's dense [seq_q, seq_k] matrix that the mask hides
    (both in range, the key outside the row's window), broadcast as in _visible."""
    inside = (rows < seq_q) & (keys < seq_k)
    return inside & ~_visible(rows, keys, seq_q, seq_k, left, right, True)


@triton.jit
def _nonfinite(x):
    """True where x is NaN or +-inf (x * 0 is NaN there, 0 elsewhere)."""
    return x.to(tl.float32) * 0.0 != 0.0


@triton.jit
def _any_per_row(x):
    """[R]: whether row r of the bool [R, C] tile x holds a True."""
    return tl.max(x.to(tl.int32), 1) > 0


@triton.jit
def _hits(hidden, bad):
    """[R, D] counts of hidden [R, C] pairs whose column c is bad at d (bad [C, D]): a
    hidden pair's zero weight times a non-finite value is NaN in the math backend's
    matmul. fp16 0/1 operands, exact counts in fp32."""
    return tl.dot(hidden.to(tl.float16), bad.to(tl.float16))


@triton.jit
def _scores(q, k_t, sm_scale, softcap, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """(s, dcap) of one tile: s = cap(q @ k^T * sm_scale) * log2(e), the base-2 scores the
    online softmax uses, fp32; dcap = d cap / d x (1 - tanh^2) with a softcap, else 1.

    q [BM, D] and k_t [D, BN] in the input dtype (fp32 under the interpreter for bf16).
    """
    qk = tl.dot(q, k_t, input_precision=PRECISION)  # [BM, D] @ [D, BN] -> [BM, BN]
    if SOFTCAP:
        c, dcap = _softcap(qk * sm_scale, softcap)
        return c * LOG2E, dcap
    return qk * (sm_scale * LOG2E), qk


@triton.jit
def _block(start, end, BLOCK: tl.constexpr):
    """(offs, mask) of one block: the indices start + [0, BLOCK) and which are below end."""
    offs = start + tl.arange(0, BLOCK)
    return offs, offs < end


@triton.jit
def _program(pid, n_blocks, heads):
    """(block, batch entry, head) of flat program id pid: the blocks of one (batch, head)
    are consecutive, so they share its K/V (or Q) in L2."""
    pid_bh = pid // n_blocks
    return pid % n_blocks, pid_bh // heads, pid_bh % heads


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
def _load_cols(base, rows, offs_d, mask, stride_row, UPCAST: tl.constexpr):
    """The transposed tile [BLOCK_D, len(rows)] of one head (base: its first element) at
    int64 row indices `rows` (last dim contiguous), masked positions 0; fp32 when UPCAST."""
    x = tl.load(base + rows[None, :] * stride_row + offs_d[:, None], mask=mask, other=0.0)
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


@triton.jit
def _probs(a, b, rows, keys, valid, lse2, seq_q, seq_k, left, right, sm_scale, softcap,
           WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """(p, dcap) of one backward tile, recomputed: p = exp2(s - lse2) where the query row
    sees the key and `valid`, else 0; s and dcap as _scores(a, b).

    a @ b is q @ k^T ([BM, BN]) or k @ q^T ([BN, BM]); rows, keys, valid and lse2 (the
    base-2 lse, +inf for a row that saw no key) are broadcast to that tile.
    """
    s, dcap = _scores(a, b, sm_scale, softcap, SOFTCAP, PRECISION)
    vis = _visible(rows, keys, seq_q, seq_k, left, right, WINDOW) & valid
    return tl.where(vis, tl.exp2(s - lse2), 0.0), dcap


@triton.jit
def _dscores(p, dp, delta, dcap, dtype, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr):
    """du = p * (dp - delta) * cap'(u) of one tile (delta broadcast to it), as the operand
    of the next tl.dot (_operand)."""
    ds = p * (dp - delta)
    if SOFTCAP:
        ds *= dcap
    return _operand(ds, dtype, UPCAST)
