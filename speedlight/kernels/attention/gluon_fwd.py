"""Attention forward in Gluon, warp-specialized: FlashAttention-3's schedule on sm_90a
(_attention_fwd_gluon_kernel) and its tcgen05 form on sm_100a
(_attention_fwd_gluon_sm100_kernel).

    o = softmax(cap(q k^T * scale)) v,   lse = log(sum_j exp(cap(q k^T * scale)_j))

per query row over the keys it sees, as kernels/attention/fwd.py computes it (online
softmax in base 2, fp32 statistics; a row that sees no key gets o = 0 and lse = -inf).

sm_90a: one program takes 2 x 64 query rows of one (batch, q head) in three roles
(`gl.warp_specialize`), each with its own register budget (setmaxnreg):
  producer   1 warp at 24 registers: makes the TMA descriptors of this program's sequence
             and heads, loads Q once and the K and V tiles into a STAGES-deep ring of
             shared memory, each stage guarded by a ready and an empty mbarrier;
  consumer 0 the kernel's own warpgroup (4 warps, 240 registers): rows [0, 64);
  consumer 1 a second warpgroup at 240: rows [64, 128).
The consumers take turns (ping-pong, two mbarriers): a consumer issues its QK^T of key
block j and its PV of block j - 1 (async wgmma), hands the turn over, and runs its softmax
of block j while the other's wgmmas keep the tensor cores busy. P stays in registers as
the PV wgmma's A operand; o leaves through the consumer's Q buffer by TMA.

sm_100a: one program takes 2 x 128 query rows; tcgen05 MMAs accumulate S and O in tensor
memory (two S tiles of BLOCK_N columns and two O tiles of BLOCK_D: 384 of its 512 columns
at head dim 128). Roles: the same producer; one MMA warp issuing every tcgen05 MMA (S of
block j + 1 for both tiles before P V of block j, so the tensor cores work while the
softmax runs); two softmax warpgroups, one per 128-row tile, each loading its S from
tensor memory (a row per thread: the row max and sum need no shuffle), rescaling its O
there by alpha in 32-column slices, and handing P (bf16) to the MMA warp through shared
memory.

Both: a key block is masked only where a boundary crosses it for the tile's rows (the
diagonal, the window's sides, the end of the keys); the interior blocks skip the mask.
Layouts as kernels/attention: q, o [batch, heads_q, seq_q, head_dim] and k, v [batch,
heads_kv, seq_k, head_dim] by their strides, packed [total, heads, head_dim] with VARLEN
(batch strides 0, rows offset by cu_seqlens); lse fp32 [batch, heads_q, seq_q] (packed
[heads_q, total_q]). Every tile is loaded by TMA through descriptors made on the device
over one sequence's rows of one head, so rows past the sequence read as zeros. The
launcher (ops/attention_gluon.py) checks what TMA needs (16-byte aligned bases and row
strides) before choosing these kernels.

Faults: a NaN or inf of v at a key a row cannot see, in a boundary block, reaches the
row's o through the MMA (its p is 0, and 0 x NaN is NaN). Rather than test v in the loop,
each consumer counts, after it, its rows whose o is not finite (the producer zeroes the
counts first): faults int32 [batch, heads_q, m_blocks * 2, 1], one count per 64 (128)
query rows, for the Triton forward's fault kernel (kernels/attention/fwd.py), which redoes
the counted rows exactly. On finite inputs o is finite (a convex combination of v's rows)
and no count moves.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.blackwell import (TensorMemoryLayout,
                                                                 allocate_tensor_memory,
                                                                 tcgen05_mma)
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                              tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from speedlight.kernels.attention.gluon_api import tma_load, tma_store, tmem_reg_layout
from speedlight.kernels.attention.gluon_common import (FLOOR, _block_split, _descriptor,
                                                       _keys_seen, _program, _sequence,
                                                       _softmax_step, _store_lse)

# Query rows per consumer: wgmma's M per warpgroup (sm_90a), tcgen05's M (sm_100a); and
# consumers per program.
ROWS = gl.constexpr(64)
ROWS_SM100 = gl.constexpr(128)
CONSUMERS = gl.constexpr(2)
# The columns of O a softmax warpgroup rescales (and writes) at a time on sm_100a: 32
# registers a thread.
O_SLICE = gl.constexpr(32)


@gluon.jit
def _producer(q_ptr, k_ptr, v_ptr, faults_ptr, heads_q, m_blocks, shared, row0, q_first,
              k_first, seq_q, seq_k, head_dim, pid_b, pid_h, pid_kv, n_iter, first,
              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn,
              ROWS_Q: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              STAGES: gl.constexpr):
    """The load warp: the consumers' Q tiles ([ROWS_Q, BLOCK_D] each) once, then K and V of
    each key block into the ring (K before V, so the QK^T of a block can start while its V
    is in flight). A program past its sequence's end loads nothing. First it zeroes the
    consumers' fault counts, which Q's barrier (release, then the consumers' acquire)
    orders before any consumer adds to them."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = shared
    q_desc = _descriptor(q_ptr + pid_b.to(gl.int64) * stride_qb + pid_h.to(gl.int64) * stride_qh
                         + q_first.to(gl.int64) * stride_qm, seq_q, head_dim, stride_qm,
                         ROWS_Q, BLOCK_D)
    k_desc = _descriptor(k_ptr + pid_b.to(gl.int64) * stride_kb + pid_kv.to(gl.int64) * stride_kh
                         + k_first.to(gl.int64) * stride_kn, seq_k, head_dim, stride_kn,
                         BLOCK_N, BLOCK_D)
    v_desc = _descriptor(v_ptr + pid_b.to(gl.int64) * stride_vb + pid_kv.to(gl.int64) * stride_vh
                         + k_first.to(gl.int64) * stride_vn, seq_k, head_dim, stride_vn,
                         BLOCK_N, BLOCK_D)
    counts = _fault_counts(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, ROWS_Q)
    for c in gl.static_range(CONSUMERS):
        gl.store(counts + c, 0)
    has_rows = row0 < seq_q
    mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes, pred=has_rows)
    mbarrier.arrive(q_bar, count=1, pred=row0 >= seq_q)  # nothing to load: released at once
    for c in gl.static_range(CONSUMERS):
        tma_load(q_desc, [row0 + c * ROWS_Q, 0], q_bar, q_smem.index(c), pred=has_rows)
    for j in range(n_iter):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        start = first + j * BLOCK_N
        mbarrier.wait(k_empty.index(stage), phase ^ 1)  # a fresh barrier passes parity 1
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma_load(k_desc, [start, 0], k_ready.index(stage), k_smem.index(stage))
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma_load(v_desc, [start, 0], v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _ring(dtype: gl.constexpr, ROWS_Q: gl.constexpr, BLOCK_N: gl.constexpr,
          BLOCK_D: gl.constexpr, STAGES: gl.constexpr):
    """The shared memory producer and consumers share, barriers initialised: the Q tiles,
    the K and V rings, and their mbarriers (Q's; ready and empty per stage, each stage
    released by both consumers)."""
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_Q, BLOCK_D], dtype)
    kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], dtype)
    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS_Q, BLOCK_D], q_layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], kv_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty


@gluon.jit
def _barriers(n: gl.constexpr, count: gl.constexpr):
    """n mbarriers of `count` arrivals, initialised."""
    bars = gl.allocate_shared_memory(gl.int64, [n, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(n):
        mbarrier.init(bars.index(i), count=count)
    return bars


@gluon.jit
def _fault_counts(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, ROWS_Q: gl.constexpr):
    """The program's first fault count in faults int32 [batch, heads_q, m_blocks *
    CONSUMERS, 1]: one per consumer, of its ROWS_Q query rows (the fault kernel's blocks)."""
    pid_m = row0 // (CONSUMERS * ROWS_Q)
    return faults_ptr + ((pid_b * heads_q + pid_h) * m_blocks + pid_m) * CONSUMERS


@gluon.jit
def _count_faults(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, row_sums, rows, seq_q,
                  WG: gl.constexpr, ROWS_Q: gl.constexpr):
    """Adds to consumer WG's fault count (zeroed by the producer) one for each of its rows
    below seq_q whose o holds a NaN or an inf (row_sums, the sums of its rows of o, NaN or
    inf then; or overflowed, which only costs a redo): on finite inputs no row, no atomic
    (a row of o is a convex combination of v's rows)."""
    counts = _fault_counts(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, ROWS_Q)
    bad = (rows < seq_q) & (row_sums * 0.0 != 0.0)
    zero = rows * 0  # a tensor in the rows' layout (Gluon broadcasts no scalar here)
    gl.atomic_add(counts + WG + zero, zero + 1, mask=bad, sem="relaxed")


# --- sm_90a: wgmma consumers in ping-pong ------------------------------------------------

@gluon.jit
def _consumer(o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, shared, turn, row0, q_first,
              seq_q, seq_k, head_dim, pid_b, pid_h, n_iter, first, left, right, qk_scale,
              sm_scale, softcap, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
              stride_lm, WG: gl.constexpr,
              WINDOW: gl.constexpr, FOLD: gl.constexpr, SOFTCAP: gl.constexpr,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr):
    """Consumer warpgroup WG: rows row0 + WG * ROWS + [0, ROWS) against the program's key
    blocks, then o by TMA (through its Q buffer), lse by pointer, and its fault count (the
    rows whose o holds a NaN or inf, which the fault kernel redoes: _count_faults)."""
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
    in_lo, _ = _keys_seen(gl.minimum(my_row0 + ROWS, seq_q) - 1, seq_q, seq_k, left, right,
                          WINDOW)
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
        masked = (first < in_lo) | (first + BLOCK_N > in_hi)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, first, lo_r, hi_r, masked, qk_scale,
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
        last = (n_iter - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_iter - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok,))
        mbarrier.arrive(v_empty.index(last), count=1)

    # epilogue: o = acc / l (0 for a row that saw no key), lse in natural log
    l_o = gl.convert_layout(l_i, orow_layout)
    o = acc / gl.where(l_o == 0.0, 1.0, l_o)[:, None]
    # a NaN or inf in o: one a row sees, or one of v at a key hidden from the row in a
    # boundary block (0 * NaN in the PV wgmma): counted, the fault kernel redoes the rows
    rows_o = my_row0 + gl.arange(0, ROWS, layout=orow_layout)
    _count_faults(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, gl.sum(o, 1), rows_o,
                  seq_q, WG, ROWS)
    _store_lse(lse_ptr, m_i, l_i, rows, q_first, seq_q, pid_b, pid_h, stride_lb, stride_lh,
               stride_lm)
    o_desc = _descriptor(o_ptr + pid_b.to(gl.int64) * stride_ob + pid_h.to(gl.int64) * stride_oh
                         + q_first.to(gl.int64) * stride_om, seq_q, head_dim, stride_om,
                         ROWS, BLOCK_D)
    if my_row0 < seq_q:  # (a descriptor has at least one row: none for an empty sequence)
        fence_async_shared()  # Q's buffer is free (its last wgmma has completed): the
        q_tile.store(o.to(dtype))  # async proxy's reads ordered before the generic writes
        fence_async_shared()
        tma_store(o_desc, [my_row0, 0], q_tile)  # rows past seq_q clipped
        tma.store_wait(0)


@gluon.jit
def _attention_fwd_gluon_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, faults_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
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
    """sm_90a: one block of 2 x ROWS query rows of one (batch, q head) against its visible
    keys (see the module's docstring for the roles).

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
    depth of the K/V ring. faults int32 [batch, heads_q, m_blocks * CONSUMERS, 1], every
    entry written: each consumer's count of its rows whose o is not finite
    (_count_faults), for _attention_fwd_faults_kernel.
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
    qk_scale = sm_scale * 1.4426950408889634

    shared = _ring(q_ptr.dtype.element_ty, ROWS, BLOCK_N, BLOCK_D, STAGES)
    turn = _barriers(CONSUMERS, 1)
    gl.warp_specialize([
        (_consumer, (o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, shared, turn, row0,
                     q_first, seq_q, seq_k, head_dim, pid_b, pid_h, n_iter, first, left, right,
                     qk_scale, sm_scale, softcap, stride_ob, stride_oh, stride_om, stride_lb,
                     stride_lh, stride_lm, 0, WINDOW, FOLD, SOFTCAP, BLOCK_N, BLOCK_D, STAGES)),
        (_consumer, (o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, shared, turn, row0,
                     q_first, seq_q, seq_k, head_dim, pid_b, pid_h, n_iter, first, left, right,
                     qk_scale, sm_scale, softcap, stride_ob, stride_oh, stride_om, stride_lb,
                     stride_lh, stride_lm, 1, WINDOW, FOLD, SOFTCAP, BLOCK_N, BLOCK_D, STAGES)),
        (_producer, (q_ptr, k_ptr, v_ptr, faults_ptr, heads_q, m_blocks, shared, row0,
                     q_first, k_first, seq_q, seq_k, head_dim, pid_b, pid_h, pid_kv, n_iter,
                     first, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, ROWS, BLOCK_N, BLOCK_D, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --- sm_100a: tcgen05 into tensor memory, one MMA warp, two softmax warpgroups -----------

@gluon.jit
def _mma_sm100(shared, s_tmem, o_tmem, p_smem, sync, n_iter, STAGES: gl.constexpr):
    """The MMA warp: S = Q K^T of each tile into tensor memory, and O += P V once its
    softmax has handed P over; S of block j + 1 goes before P V of block j, so the tensor
    cores work on one tile while the other's softmax runs. Each MMA signals through
    mbarriers (arrived when it and every earlier MMA of this warp complete): its tile's
    consumer, and the K (V) stage it read, which both tiles' MMAs release."""
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty = shared
    s_ready, s_free, p_ready, o_done = sync
    has = n_iter > 0
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0, pred=has)
    for w in gl.static_range(CONSUMERS):  # S of block 0: [128, D] @ [D, BN] -> [128, BN]
        tcgen05_mma(q_smem.index(w), k_smem.index(0).permute((1, 0)), s_tmem.index(w),
                    use_acc=False, pred=has, mbarriers=[s_ready.index(w), k_empty.index(0)],
                    mbarrier_preds=[has, has])
    for j in range(n_iter):
        more = j + 1 < n_iter
        nxt = (j + 1) % STAGES
        cur = j % STAGES
        mbarrier.wait(k_ready.index(nxt), ((j + 1) // STAGES) & 1, pred=more)
        mbarrier.wait(v_ready.index(cur), (j // STAGES) & 1)
        for w in gl.static_range(CONSUMERS):
            mbarrier.wait(s_free.index(w), j & 1)  # its softmax holds S of block j
            # [128, D] @ [D, BN] -> [128, BN], block j + 1
            tcgen05_mma(q_smem.index(w), k_smem.index(nxt).permute((1, 0)), s_tmem.index(w),
                        use_acc=False, pred=more,
                        mbarriers=[s_ready.index(w), k_empty.index(nxt)],
                        mbarrier_preds=[more, more])
            mbarrier.wait(p_ready.index(w), j & 1)
            # [128, BN] @ [BN, D] -> [128, D], block j
            tcgen05_mma(p_smem.index(w), v_smem.index(cur), o_tmem.index(w), use_acc=j > 0,
                        mbarriers=[o_done.index(w), v_empty.index(cur)])


@gluon.jit
def _softmax_sm100(o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, q_bar, s_tmem, o_tmem,
                   p_smem, sync, row0, q_first, seq_q, seq_k, head_dim, pid_b, pid_h, n_iter,
                   first, left, right, qk_scale, sm_scale, softcap, stride_ob, stride_oh,
                   stride_om, stride_lb, stride_lh, stride_lm,
                   WG: gl.constexpr, WINDOW: gl.constexpr, FOLD: gl.constexpr,
                   SOFTCAP: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr):
    """Softmax warpgroup WG: rows row0 + WG * 128 + [0, 128), a row per thread. Per key
    block: S from tensor memory (then S's columns are the MMA warp's again), the online
    softmax, O rescaled by alpha in tensor memory once the previous P V is done, P to
    shared memory for the next one. Then o = O / l by 128-bit stores, lse, and its fault
    count (_count_faults; Q's barrier, waited on first, orders the producer's zeroing of
    it before)."""
    s_ready, s_free, p_ready, o_done = sync
    dtype: gl.constexpr = o_ptr.dtype.element_ty
    s_tl: gl.constexpr = TensorMemoryLayout((ROWS_SM100, BLOCK_N), 1)
    o_tl: gl.constexpr = TensorMemoryLayout((ROWS_SM100, O_SLICE), 1)
    s_layout: gl.constexpr = tmem_reg_layout(gl.float32, [ROWS_SM100, BLOCK_N], s_tl, 4)
    o_layout: gl.constexpr = tmem_reg_layout(gl.float32, [ROWS_SM100, O_SLICE], o_tl, 4)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)

    my_row0 = row0 + WG * ROWS_SM100
    rows = my_row0 + gl.arange(0, ROWS_SM100, layout=gl.SliceLayout(1, s_layout))
    lo_r, hi_r = _keys_seen(rows, seq_q, seq_k, left, right, WINDOW)
    in_lo, _ = _keys_seen(gl.minimum(my_row0 + ROWS_SM100, seq_q) - 1, seq_q, seq_k, left,
                          right, WINDOW)
    _, in_hi = _keys_seen(my_row0, seq_q, seq_k, left, right, WINDOW)
    s_buf = s_tmem.index(WG)
    o_buf = o_tmem.index(WG)
    p_buf = p_smem.index(WG)
    m_i = gl.full([ROWS_SM100], FLOOR, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS_SM100], gl.float32, layout=gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar, 0)  # (the producer zeroed the fault counts before releasing it)
    for j in range(n_iter):
        mbarrier.wait(s_ready.index(WG), j & 1)
        s = s_buf.load(s_layout)
        mbarrier.arrive(s_free.index(WG), count=1)
        start = first + j * BLOCK_N
        masked = (start < in_lo) | (start + BLOCK_N > in_hi)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, start, lo_r, hi_r, masked, qk_scale,
                                           sm_scale, softcap, s_layout, FOLD, SOFTCAP, BLOCK_N)
        if j > 0:  # O (and P's buffer) are free once the previous P V is done
            mbarrier.wait(o_done.index(WG), (j - 1) & 1)
            alpha_o = gl.convert_layout(alpha, orow_layout)[:, None]
            for c in gl.static_range(BLOCK_D // O_SLICE):
                part = o_buf.slice(c * O_SLICE, O_SLICE)
                part.store(part.load(o_layout) * alpha_o)
        p_buf.store(p.to(dtype))
        fence_async_shared()  # the generic proxy's P before the MMA's async reads
        mbarrier.arrive(p_ready.index(WG), count=1)
    mbarrier.wait(o_done.index(WG), (n_iter - 1) & 1, pred=n_iter > 0)

    # epilogue: o = O / l (0 where no key was seen: tensor memory holds no P V there)
    _store_lse(lse_ptr, m_i, l_i, rows, q_first, seq_q, pid_b, pid_h, stride_lb, stride_lh,
               stride_lm)
    l_o = gl.convert_layout(l_i, orow_layout)[:, None]
    none = l_o == 0.0
    rows_o = my_row0 + gl.arange(0, ROWS_SM100, layout=orow_layout)
    o_rows = (o_ptr + pid_b.to(gl.int64) * stride_ob + pid_h.to(gl.int64) * stride_oh
              + (q_first + rows_o).to(gl.int64)[:, None] * stride_om)
    row_sums = gl.zeros([ROWS_SM100], gl.float32, layout=orow_layout)
    for c in gl.static_range(BLOCK_D // O_SLICE):
        cols = c * O_SLICE + gl.arange(0, O_SLICE, layout=gl.SliceLayout(0, o_layout))
        o = gl.where(none, 0.0, o_buf.slice(c * O_SLICE, O_SLICE).load(o_layout) / l_o)
        row_sums += gl.sum(o, 1)  # a row per thread: no shuffle
        gl.store(o_rows + cols[None, :], o.to(dtype),
                 mask=(rows_o < seq_q)[:, None] & (cols < head_dim)[None, :])
    # a NaN or inf in o: one a row sees, or one of v at a key hidden from the row in a
    # boundary block (0 * NaN in the PV MMA): counted, the fault kernel redoes the rows
    _count_faults(faults_ptr, heads_q, m_blocks, pid_b, pid_h, row0, row_sums, rows_o, seq_q,
                  WG, ROWS_SM100)


@gluon.jit
def _attention_fwd_gluon_sm100_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, faults_ptr, cu_q_ptr, cu_k_ptr, m_blocks,
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
    """sm_100a: one block of 2 x 128 query rows of one (batch, q head) against its visible
    keys (see the module's docstring for the roles), arguments and grid as
    _attention_fwd_gluon_kernel's; launched with num_warps=4 (softmax warpgroup 0), the
    other roles in worker partitions (softmax 1 at CONSUMER_REGS, the MMA and load warps at
    PRODUCER_REGS). BLOCK_D is at most 128: the two O tiles and two S tiles fit tensor
    memory's 512 columns then."""
    pid_m, pid_b, pid_h = _program(gl.program_id(0), m_blocks, heads_q)
    q_first, k_first, seq_q, seq_k = _sequence(cu_q_ptr, cu_k_ptr, pid_b, seq_q, seq_k,
                                               total_q, total_k, VARLEN)
    row0 = pid_m * (CONSUMERS * ROWS_SM100)
    pid_kv = pid_h // group
    first, n_iter = _block_split(row0, gl.minimum(row0 + CONSUMERS * ROWS_SM100, seq_q) - 1,
                                 seq_q, seq_k, left, right, WINDOW, BLOCK_N)
    n_iter = gl.where(row0 < seq_q, n_iter, 0)
    qk_scale = sm_scale * 1.4426950408889634

    dtype: gl.constexpr = q_ptr.dtype.element_ty
    shared = _ring(dtype, ROWS_SM100, BLOCK_N, BLOCK_D, STAGES)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS_SM100, BLOCK_N], dtype)
    p_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS_SM100, BLOCK_N], p_layout)
    s_tmem = allocate_tensor_memory(gl.float32, [CONSUMERS, ROWS_SM100, BLOCK_N],
                                    TensorMemoryLayout((ROWS_SM100, BLOCK_N), 1))
    o_tmem = allocate_tensor_memory(gl.float32, [CONSUMERS, ROWS_SM100, BLOCK_D],
                                    TensorMemoryLayout((ROWS_SM100, BLOCK_D), 1))
    sync = (_barriers(CONSUMERS, 1), _barriers(CONSUMERS, 1), _barriers(CONSUMERS, 1),
            _barriers(CONSUMERS, 1))  # s_ready, s_free, p_ready, o_done per tile
    gl.warp_specialize([
        (_softmax_sm100, (o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, shared[3], s_tmem,
                          o_tmem, p_smem, sync, row0, q_first, seq_q, seq_k, head_dim, pid_b,
                          pid_h, n_iter, first, left, right, qk_scale, sm_scale, softcap,
                          stride_ob, stride_oh, stride_om, stride_lb, stride_lh, stride_lm, 0,
                          WINDOW, FOLD, SOFTCAP, BLOCK_N, BLOCK_D)),
        (_softmax_sm100, (o_ptr, lse_ptr, faults_ptr, heads_q, m_blocks, shared[3], s_tmem,
                          o_tmem, p_smem, sync, row0, q_first, seq_q, seq_k, head_dim, pid_b,
                          pid_h, n_iter, first, left, right, qk_scale, sm_scale, softcap,
                          stride_ob, stride_oh, stride_om, stride_lb, stride_lh, stride_lm, 1,
                          WINDOW, FOLD, SOFTCAP, BLOCK_N, BLOCK_D)),
        (_mma_sm100, (shared, s_tmem, o_tmem, p_smem, sync, n_iter, STAGES)),
        (_producer, (q_ptr, k_ptr, v_ptr, faults_ptr, heads_q, m_blocks, shared, row0,
                     q_first, k_first, seq_q, seq_k, head_dim, pid_b, pid_h, pid_kv, n_iter,
                     first, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                     stride_vb, stride_vh, stride_vn, ROWS_SM100, BLOCK_N, BLOCK_D, STAGES)),
    ], [4, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
