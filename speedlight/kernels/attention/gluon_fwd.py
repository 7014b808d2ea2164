"""Attention forward in Gluon, warp-specialized (FlashAttention-3's schedule), sm_90a.

    o = softmax(cap(q k^T * scale)) v,   lse = log(sum_j exp(cap(q k^T * scale)_j))

per query row over the keys it sees, as kernels/attention/fwd.py computes it (online
softmax in base 2, fp32 statistics; a row that sees no key gets o = 0 and lse = -inf).

One program takes BLOCK_M = 2 x 64 query rows of one (batch, q head) and runs three roles
(`gl.warp_specialize`), each with its own register budget (setmaxnreg):
  producer   1 warp: makes the tensor descriptors of this program's sequence and heads
             and loads Q once and the K and V tiles by TMA into a STAGES-deep ring of
             shared memory, each stage guarded by a ready and an empty mbarrier;
  consumer 0 the kernel's own 4 warps (a warpgroup): rows [0, 64) of the block;
  consumer 1 4 more warps: rows [64, 128).
The consumers take turns (ping-pong, two mbarriers): a consumer issues its QK^T of key
block j and its PV of block j - 1 (async wgmma), hands the turn over, and runs its softmax
of block j while the other's wgmmas keep the tensor cores busy. P stays in registers as
the PV wgmma's A operand. A key block is masked only where a boundary crosses it for the
consumer's rows (the diagonal, the window's sides, the end of the keys); the interior
blocks skip the mask.

Layouts as kernels/attention: q, o [batch, heads_q, seq_q, head_dim] and k, v [batch,
heads_kv, seq_k, head_dim] by their strides, packed [total, heads, head_dim] with VARLEN
(batch strides 0, rows offset by cu_seqlens); lse fp32 [batch, heads_q, seq_q] (packed
[heads_q, total_q]). Every tile moves by TMA through descriptors made on the device over
one sequence's rows of one head, so rows past the sequence read as zeros and are never
written. The launcher (ops/attention_gluon.py) checks what TMA needs (16-byte aligned
bases and row strides) before choosing this kernel.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from speedlight.kernels.attention.gluon_api import tma_load, tma_store

from speedlight.kernels.attention.gluon_common import (FLOOR, LOG2E, _block_split,
                                                       _keys_seen, _program, _sequence,
                                                       _softcap)

# Rows per consumer warpgroup (wgmma's M per warpgroup is 64) and consumers per program.
ROWS = gl.constexpr(64)
CONSUMERS = gl.constexpr(2)


@gluon.jit
def _descriptor(base, rows, head_dim, stride_row, BLOCK_R: gl.constexpr, BLOCK_D: gl.constexpr):
    """A TMA descriptor over `rows` rows (at least one) of head_dim columns from `base`,
    tiles [BLOCK_R, BLOCK_D] in the NVMMA shared layout wgmma reads."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_R, BLOCK_D],
                                                                base.dtype.element_ty)
    return tma.make_tensor_descriptor(base, [gl.maximum(rows, 1), head_dim], [stride_row, 1],
                                      [BLOCK_R, BLOCK_D], layout)


@gluon.jit
def _producer(q_ptr, k_ptr, v_ptr, shared, row0, q_first, k_first, seq_q, seq_k, head_dim, pid_b, pid_h, pid_kv,
              n_iter, first, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              STAGES: gl.constexpr):
    """The load warp: Q once, then K and V of each key block into the ring (K before V, so
    the QK^T of a block can start while its V is in flight)."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = shared
    q_desc = _descriptor(q_ptr + pid_b.to(gl.int64) * stride_qb + pid_h.to(gl.int64) * stride_qh
                         + q_first.to(gl.int64) * stride_qm, seq_q, head_dim, stride_qm,
                         ROWS, BLOCK_D)
    k_desc = _descriptor(k_ptr + pid_b.to(gl.int64) * stride_kb + pid_kv.to(gl.int64) * stride_kh
                         + k_first.to(gl.int64) * stride_kn, seq_k, head_dim, stride_kn,
                         BLOCK_N, BLOCK_D)
    v_desc = _descriptor(v_ptr + pid_b.to(gl.int64) * stride_vb + pid_kv.to(gl.int64) * stride_vh
                         + k_first.to(gl.int64) * stride_vn, seq_k, head_dim, stride_vn,
                         BLOCK_N, BLOCK_D)
    has_rows = row0 < seq_q
    mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes, pred=has_rows)
    mbarrier.arrive(q_bar, count=1, pred=row0 >= seq_q)  # nothing to load: release at once
    for c in gl.static_range(CONSUMERS):
        tma_load(q_desc, [row0 + c * ROWS, 0], q_bar, q_smem.index(c),
                                        pred=has_rows)
    for j in range(n_iter):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        start = first + j * BLOCK_N
        mbarrier.wait(k_empty.index(stage), phase ^ 1)  # a fresh barrier passes parity 1
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, [start, 0], k_ready.index(stage),
                                        k_smem.index(stage))
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, [start, 0], v_ready.index(stage),
                                        v_smem.index(stage))


@gluon.jit
def _softmax_step(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale, sm_scale, softcap,
                  s_layout: gl.constexpr, FOLD: gl.constexpr, SOFTCAP: gl.constexpr,
                  BLOCK_N: gl.constexpr):
    """(p, m, l, alpha) after key block [start, start + BLOCK_N) of the score tile s = q k^T
    [ROWS, BLOCK_N] (fp32): the running max m and sum l in base 2, alpha = exp2(m_old - m)
    the factor on what was summed before. masked (a scalar): the block is a boundary block
    for these rows (row r sees keys [lo_r, hi_r)), hidden scores -inf; an interior block
    skips the test. FOLD: one FFMA per score, s * qk_scale - m, the max taken over s and
    scaled once per row (a positive scale, no softcap); else the base-2 scores first."""
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
def _consumer(o_ptr, lse_ptr, shared, turn, row0, q_first, seq_q, seq_k, head_dim, pid_b, pid_h, n_iter, first, left,
              right, qk_scale, sm_scale, softcap, stride_ob, stride_oh, stride_om, stride_lb,
              stride_lh, stride_lm, WG: gl.constexpr, WINDOW: gl.constexpr,
              FOLD: gl.constexpr, SOFTCAP: gl.constexpr, BLOCK_N: gl.constexpr,
              BLOCK_D: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup WG: rows row0 + WG * ROWS + [0, ROWS) against the program's key
    blocks, then o by TMA (through its Q buffer) and lse by pointer."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = shared
    dtype: gl.constexpr = o_ptr.dtype.element_ty
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    my_row0 = row0 + WG * ROWS
    rows = my_row0 + gl.arange(0, ROWS, layout=row_layout)
    lo_r, hi_r = _keys_seen(rows, seq_q, seq_k, left, right, WINDOW)
    # the keys every row of this warpgroup sees (its last valid row's lo, first row's hi)
    last = gl.minimum(my_row0 + ROWS, seq_q) - 1
    in_lo, _ = _keys_seen(last, seq_q, seq_k, left, right, WINDOW)
    _, in_hi = _keys_seen(my_row0, seq_q, seq_k, left, right, WINDOW)
    q_tile = q_smem.index(WG)
    other = turn.index(1 - WG)
    mine = turn.index(WG)

    m_i = gl.full([ROWS], FLOOR, gl.float32, layout=row_layout)
    l_i = gl.zeros([ROWS], gl.float32, layout=row_layout)
    acc = gl.zeros([ROWS, BLOCK_D], gl.float32, layout=o_layout)
    s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    if n_iter > 0:
        # key block 0: S only (no P yet)
        mbarrier.wait(k_ready.index(0), 0)
        mbarrier.wait(mine, (1 - WG) & 1)  # consumer 0 goes first
        s_tok = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s, use_acc=False,
                              is_async=True)  # [ROWS, D] @ [D, BN] -> [ROWS, BN]
        mbarrier.arrive(other, count=1)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(0), count=1)
        start = first
        masked = (start < in_lo) | (start + BLOCK_N > in_hi)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale,
                                           sm_scale, softcap, s_layout, FOLD, SOFTCAP, BLOCK_N)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_iter):
            stage = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
            mbarrier.wait(mine, (j + 1 - WG) & 1)
            s_tok = warpgroup_mma(q_tile, k_smem.index(stage).permute((1, 0)), s, use_acc=False,
                                  is_async=True)  # [ROWS, D] @ [D, BN] -> [ROWS, BN]
            acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc,
                                    is_async=True)  # [ROWS, BN] @ [BN, D] -> [ROWS, D]
            mbarrier.arrive(other, count=1)
            s = warpgroup_mma_wait(1, deps=(s_tok,))
            mbarrier.arrive(k_empty.index(stage), count=1)
            start = first + j * BLOCK_N
            masked = (start < in_lo) | (start + BLOCK_N > in_hi)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale,
                                               sm_scale, softcap, s_layout, FOLD, SOFTCAP,
                                               BLOCK_N)
            acc = warpgroup_mma_wait(0, deps=(acc_tok,))
            mbarrier.arrive(v_empty.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, orow_layout)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)
        last_stage = (n_iter - 1) % STAGES
        mbarrier.wait(v_ready.index(last_stage), ((n_iter - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(last_stage), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
        mbarrier.arrive(v_empty.index(last_stage), count=1)

    # epilogue: o = acc / l (0 for a row that saw no key), lse in natural log
    l_o = gl.convert_layout(l_i, orow_layout)
    none = l_o == 0.0  # a NaN l (a NaN softmax) is not none
    o = acc / gl.where(none, 1.0, l_o)[:, None]
    none_r = l_i == 0.0
    lse = gl.where(none_r, float("-inf"),
                   gl.where(m_i == float("inf"), float("inf"),
                            (m_i + gl.log2(gl.where(none_r, 1.0, l_i))) / LOG2E))
    lse_rows = lse_ptr + pid_b.to(gl.int64) * stride_lb + pid_h.to(gl.int64) * stride_lh
    gl.store(lse_rows + (q_first + rows).to(gl.int64) * stride_lm, lse, mask=rows < seq_q)
    o_desc = _descriptor(o_ptr + pid_b.to(gl.int64) * stride_ob + pid_h.to(gl.int64) * stride_oh
                         + q_first.to(gl.int64) * stride_om, seq_q, head_dim, stride_om,
                         ROWS, BLOCK_D)
    if my_row0 < seq_q:  # (a descriptor has at least one row: none for an empty sequence)
        q_tile.store(o.to(dtype))  # Q's buffer is free: its last wgmma has completed
        fence_async_shared()
        tma_store(o_desc, [my_row0, 0], q_tile)  # rows past seq_q clipped
        tma.store_wait(0)


@gluon.jit
def _attention_fwd_gluon_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
    seq_q, seq_k, total_q, total_k, heads_q, group, head_dim, sm_scale, softcap, left, right,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    stride_lb, stride_lh, stride_lm,
    VARLEN: gl.constexpr, WINDOW: gl.constexpr, SOFTCAP: gl.constexpr, FOLD: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):
    """One block of 2 x ROWS query rows of one (batch, q head) against its visible keys
    (see the module's docstring for the roles).

    grid (m_blocks * batch * heads_q,), query blocks major in descending order (the
    causal mask's heaviest first), heads fastest (a GQA group's q heads side by side on
    its K/V); launched with num_warps=4 (consumer 0) and maxnreg=168: 3 warpgroups share
    the register file, setmaxnreg moves PRODUCER_REGS to the producer and CONSUMER_REGS
    to consumer 1 (consumer 0 keeps the rest). q head h reads kv head h // group.
    Constexprs: VARLEN reads cu_seqlens (int32 [batch + 1]; each sequence clamped into
    the packed rows and cut at seq_q / seq_k); WINDOW compiles the window tests in (causal
    is right = 0); SOFTCAP applies softcap * tanh(s / softcap); FOLD folds the scale into
    the exponent's FFMA (a positive scale, no softcap); BLOCK_N keys per block; BLOCK_D
    head_dim rounded up to a power of two (TMA zero-fills the columns past it); STAGES the
    depth of the K/V ring.
    """
    pid_m, pid_b, pid_h = _program(gl.program_id(0), m_blocks, heads_q)
    q_first, k_first, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k,
                                               total_q, total_k, VARLEN)
    row0 = pid_m * (CONSUMERS * ROWS)
    pid_kv = pid_h // group
    # a program past its sequence's end (packed, a short sequence) loads and writes nothing
    first, n_iter = _block_split(row0, gl.minimum(row0 + CONSUMERS * ROWS, seq_q) - 1, seq_q,
                                 seq_k, left, right, WINDOW, BLOCK_N)
    n_iter = gl.where(row0 < seq_q, n_iter, 0)
    qk_scale = sm_scale * LOG2E

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_D], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, BLOCK_D], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turn.index(i), count=1)

    shared = (q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty)
    gl.warp_specialize([
        (_consumer, (o_ptr, lse_ptr, shared, turn, row0, q_first, seq_q, seq_k, head_dim, pid_b,
                     pid_h, n_iter, first, left, right, qk_scale, sm_scale, softcap, stride_ob,
                     stride_oh, stride_om, stride_lb, stride_lh, stride_lm, 0, WINDOW, FOLD,
                     SOFTCAP, BLOCK_N, BLOCK_D, STAGES)),
        (_consumer, (o_ptr, lse_ptr, shared, turn, row0, q_first, seq_q, seq_k, head_dim, pid_b,
                     pid_h, n_iter, first, left, right, qk_scale, sm_scale, softcap, stride_ob,
                     stride_oh, stride_om, stride_lb, stride_lh, stride_lm, 1, WINDOW, FOLD,
                     SOFTCAP, BLOCK_N, BLOCK_D, STAGES)),
        (_producer, (q_ptr, k_ptr, v_ptr, shared, row0, q_first, k_first, seq_q, seq_k,
                     head_dim, pid_b, pid_h, pid_kv, n_iter, first, stride_qb, stride_qh,
                     stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh,
                     stride_vn, BLOCK_N, BLOCK_D, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
