"""What the Gluon attention kernels share (a Gluon kernel calls only Gluon functions):
where a sequence starts, which keys a query row sees, how a program's key blocks split
into boundary and interior ones, the program's tile, the softcap, a TMA descriptor over
one sequence of one head, one step of the online softmax and the lse of its statistics.

The same rules as kernels/attention/common.py: positions aligned at the end (query row r
at r + seq_k - seq_q); key j visible to query i when j < seq_k, j >= i - left (left >= 0)
and j <= i + right (right >= 0); causal is right = 0; -1 is unbounded.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from speedlight.kernels.softcap import (TANH_SPLIT, TANH_T1, TANH_T2, TANH_T3, TANH_T4,
                                        TANH_T5, TANH_T6, TANH_T7, TANH_T8)

LOG2E = gl.constexpr(1.4426950408889634)
# The running max starts here, not at -inf: exp2(-inf - FLOOR) = 0 for a hidden score (or
# a -inf in the inputs), never exp2(-inf + inf) = NaN, with no test in the loop.
FLOOR = gl.constexpr(-3.4028234663852886e38)


@gluon.jit
def _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k, total_q, total_k, VARLEN: gl.constexpr):
    """(first query row, first key row, seq_q, seq_k) of sequence pid_b: from cu_seqlens
    when VARLEN (each sequence clamped into the packed rows, an end below its start empty,
    cut at the launch's seq_q / seq_k), else row 0 of a batch entry."""
    if VARLEN:
        q_start = gl.minimum(gl.maximum(gl.load(cu_q_ptr + pid_b), 0), total_q)
        k_start = gl.minimum(gl.maximum(gl.load(cu_k_ptr + pid_b), 0), total_k)
        q_end = gl.minimum(gl.maximum(gl.load(cu_q_ptr + pid_b + 1), q_start), total_q)
        k_end = gl.minimum(gl.maximum(gl.load(cu_k_ptr + pid_b + 1), k_start), total_k)
        seq_q = gl.minimum(q_end - q_start, seq_q)
        seq_k = gl.minimum(k_end - k_start, seq_k)
    else:
        q_start = pid_b * 0
        k_start = pid_b * 0
    return q_start, k_start, seq_q, seq_k


@gluon.jit
def _keys_seen(rows, seq_q, seq_k, left, right, WINDOW: gl.constexpr):
    """(lo, hi): query row `rows` (a scalar or a tensor of rows) sees keys [lo, hi), none
    when hi <= lo. WINDOW=False compiles the window away (every key below seq_k)."""
    lo = rows * 0
    hi = rows * 0 + seq_k
    if WINDOW:
        pos = rows + (seq_k - seq_q)
        lo = gl.where(left >= 0, gl.maximum(pos - left, 0), lo)
        hi = gl.where(right >= 0, gl.minimum(pos + right + 1, seq_k), hi)
    return lo, hi


@gluon.jit
def _block_split(first_row, last_row, seq_q, seq_k, left, right, WINDOW: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """(first, n): the key blocks rows [first_row, last_row] see, from `first` (a multiple
    of BLOCK_N) n blocks on; n = 0 when they see no key. Rows see monotone key ranges, so
    the union is [lo of the first row, hi of the last)."""
    lo, _ = _keys_seen(first_row, seq_q, seq_k, left, right, WINDOW)
    _, hi = _keys_seen(last_row, seq_q, seq_k, left, right, WINDOW)
    first = lo // BLOCK_N * BLOCK_N
    n = gl.where(hi > lo, (hi - first + BLOCK_N - 1) // BLOCK_N, 0)
    return first, n


@gluon.jit
def _program(pid, n_blocks, heads):
    """(block, batch entry, head) of flat program id pid over n_blocks x batch x heads:
    blocks major and descending (the causal mask's heaviest first, the grid ending on light
    ones), heads fastest (a GQA group's q heads side by side on its K/V)."""
    n_bh = gl.num_programs(0) // n_blocks
    blk = n_blocks - 1 - pid // n_bh
    pid_bh = pid % n_bh
    return blk, pid_bh // heads, pid_bh % heads


@gluon.jit
def _softcap(x, softcap):
    """softcap * tanh(x / softcap), fp32, as kernels/softcap.tanh_softcap rounds it (the
    backward's recomputation): an odd polynomial near 0, 1 - 2 / (exp(2|y|) + 1) beyond;
    +-inf maps to +-softcap, NaN stays NaN."""
    y = x / softcap
    a = gl.abs(y)
    r = 2.0 / (gl.exp(2.0 * a) + 1.0)  # 1 - tanh(|y|); 0 when exp overflows
    y2 = y * y
    p = TANH_T8 * y2 + TANH_T7
    p = p * y2 + TANH_T6
    p = p * y2 + TANH_T5
    p = p * y2 + TANH_T4
    p = p * y2 + TANH_T3
    p = p * y2 + TANH_T2
    p = p * y2 + TANH_T1
    small = y * (p * y2 + 1.0)
    t = gl.where(a < TANH_SPLIT, small, gl.where(y < 0, r - 1.0, 1.0 - r))
    return softcap * t


@gluon.jit
def _descriptor(base, rows, head_dim, stride_row, BLOCK_R: gl.constexpr, BLOCK_D: gl.constexpr):
    """A TMA descriptor made on the device over `rows` rows (at least one) of head_dim
    columns from `base` (one sequence of one head), tiles [BLOCK_R, BLOCK_D] in the NVMMA
    shared layout the MMAs read: rows and columns past the ends read as zeros and are
    never written."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_R, BLOCK_D],
                                                                base.dtype.element_ty)
    return tma.make_tensor_descriptor(base, [gl.maximum(rows, 1), head_dim], [stride_row, 1],
                                      [BLOCK_R, BLOCK_D], layout)


@gluon.jit
def _softmax_step(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale, sm_scale, softcap,
                  s_layout: gl.constexpr, FOLD: gl.constexpr, SOFTCAP: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """(p, m, l, alpha) after key block [start, start + BLOCK_N) of the score tile s = q k^T
    [rows, BLOCK_N] (fp32, layout s_layout): the running max m and sum l in base 2, alpha =
    exp2(m_old - m) the factor on what was summed before. masked (a scalar): the block is a
    boundary block for these rows (row r sees keys [lo_r, hi_r)), hidden scores -inf; an
    interior block skips the test. FOLD: one FFMA per score, s * qk_scale - m, the max
    taken over s and scaled once per row (a positive scale, no softcap); else the base-2
    scores first."""
    if FOLD:
        e = s
    else:
        if SOFTCAP:
            e = _softcap(s * sm_scale, softcap) * LOG2E
        else:
            e = s * qk_scale
    if masked:
        cols = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        seen = (cols[None, :] >= lo_r[:, None]) & (cols[None, :] < hi_r[:, None])
        e = gl.where(seen, e, float("-inf"))
    if FOLD:
        m_new = gl.maximum(m_i, gl.max(e, 1) * qk_scale)
        e = e * qk_scale - m_new[:, None]
    else:
        m_new = gl.maximum(m_i, gl.max(e, 1))
        e = e - m_new[:, None]
    p = gl.exp2(e)
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, m_new, l_i, alpha


@gluon.jit
def _store_lse(lse_ptr, m_i, l_i, rows, q_first, seq_q, pid_b, pid_h, stride_lb, stride_lh,
               stride_lm):
    """lse = (m + log2 l) / log2(e) of rows < seq_q: -inf for a row that saw no key (l 0),
    +inf for a +inf score (m +inf), NaN for a NaN softmax (l NaN)."""
    none = l_i == 0.0  # a NaN l (a NaN softmax) is not none
    lse = gl.where(none, float("-inf"),
                   gl.where(m_i == float("inf"), float("inf"),
                            (m_i + gl.log2(gl.where(none, 1.0, l_i))) / LOG2E))
    base = lse_ptr + pid_b.to(gl.int64) * stride_lb + pid_h.to(gl.int64) * stride_lh
    gl.store(base + (q_first + rows).to(gl.int64) * stride_lm, lse, mask=rows < seq_q)
