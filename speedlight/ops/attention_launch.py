"""Attention's host side: launch sizing and the forward and backward launchers (usable
without autograd). The argument checks and packed lengths are in ops/attention_checks.py,
`speedlight.attention` and the op's registration in ops/attention.py, its cases and cost
in ops/attention_cases.py.

Layouts: q [batch, heads_q, seq_q, dim] and k, v [batch, heads_kv, seq_k, dim] (Hugging
Face's order) with any strides whose last dim is contiguous, so a [batch, seq, heads, dim]
tensor's .transpose(1, 2) view is read in place; or packed [total, heads, dim] with int32
cu_seqlens_q/k [batch + 1] (variable length). The log-sum-exp is fp32 [batch, heads_q,
seq_q], [heads_q, total_q] packed. Naming: `left`/`right` are the window's sides (-1
unbounded); causal is right = 0.
"""

from __future__ import annotations

import torch
import triton

from speedlight.kernels.attention import (_attention_bwd_delta_kernel,
                                          _attention_bwd_dkdv_kernel, _attention_bwd_dq_kernel,
                                          _attention_bwd_faults_kernel, _attention_combine_kernel,
                                          _attention_fwd_faults_kernel, _attention_fwd_kernel)
from speedlight import launch, tuning
from speedlight.launch import planned_amd_arch, planned_arch, planned_sm_count
from speedlight.ops._gemm import AMD_RULE, amd_space, ensure_allocator
from speedlight.ops.attention_checks import check_arguments, packed_lengths
from speedlight.runtime import check_runtime, is_interpreted
from speedlight.spec import dtype_name


# --- launch sizing ----------------------------------------------------------------------------

def _blocks(direction: str, head_dim: int, seq_q: int, dtype: torch.dtype,
            device: torch.device) -> dict:
    """Block sizes, warps and stages of one kernel: `fwd`, `dkdv` or `dq`.

    On a GPU (or the launch context's target): FlashAttention-2's shapes for Hopper, the
    forward's 128-row blocks against 128 keys at head dim <= 128 (its boundary blocks
    read in halves, kernels/attention/fwd.py, so neither loop spills; 64 keys halve the
    work per step for the same per-step overhead), smaller tiles for head dim 256 and for
    fp32 (whose IEEE products run on FMA units) so no kernel spills; a forward of few
    queries (decode) takes 16-row blocks. On an AMD
    target (launch.planned_amd_arch) the smaller tiles on every dtype, the forward on one
    stage fewer (two at head dim 128: one K/V buffer in LDS) and the dk/dv pass on one: on
    gfx942 the forward's three stages need 80 KB of LDS at head dim 128 (a workgroup may
    have 64 KB), and the dk/dv pass spills at two stages (712 bytes of scratch with 64-key
    tiles, 1.5 KB with 128), none at one (250 VGPRs). Under the
    interpreter every program costs milliseconds: the largest tiles that stay cheap.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    few = max(16, triton.next_power_of_2(max(seq_q, 1)))
    if planned_sm_count(device) is None:
        bm = min(64, few) if direction != "dkdv" else 32
        return dict(BLOCK_M=bm, BLOCK_N=64 if block_d <= 128 else 32, BLOCK_D=block_d,
                    num_warps=4)
    amd = planned_amd_arch(device) is not None
    wide = block_d > 128 or dtype == torch.float32 or amd
    if direction == "fwd":
        bm = min(128 if not wide else 64, few)
        stages = (3 if block_d <= 128 else 2) - (1 if amd else 0)
        block_n = 32 if block_d > 128 else 128 if bm >= 128 else 64
        return dict(BLOCK_M=bm, BLOCK_N=block_n, BLOCK_D=block_d,
                    num_warps=8 if bm >= 128 else 4, num_stages=stages)
    if direction == "dkdv":
        return dict(BLOCK_M=32, BLOCK_N=128 if not wide else 64, BLOCK_D=block_d,
                    num_warps=8, num_stages=2 if block_d <= 128 and not amd else 1)
    return dict(BLOCK_M=128 if not wide else 64, BLOCK_N=32, BLOCK_D=block_d, num_warps=8,
                num_stages=2 if block_d <= 128 else 1)


# The forward's configuration space: none on an NVIDIA GPU (its tiles are the rule's,
# _blocks), Triton's HIP knobs on an AMD target (the GEMMs', ops/_gemm.amd_space), at
# their defaults by rule; a tuned entry per head-dim block and dtype.
ATTENTION_CONFIGS = tuning.Configs(
    "attention", space={}, default=lambda key: dict(AMD_RULE),
    bucket=lambda key: f"d{key[0]}-{dtype_name(key[1])}", amd=amd_space)


def _fwd_knobs(block_d: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The forward's HIP knobs on an AMD target (launch.config: forced, tuned or the rule's
    defaults); none elsewhere (a CUDA launch refuses them)."""
    if planned_amd_arch(device) is None:
        return {}
    return dict(launch.config(ATTENTION_CONFIGS, (block_d, dtype), device))


def _split_plan(n_programs: int, seq_k: int, block_n: int, device: torch.device,
                num_splits: int | None) -> tuple[int, int]:
    """(splits, keys per split) of the forward: num_splits when given; on a GPU, enough
    splits of >= 512 keys to give every SM two programs when the query blocks alone are
    too few (decode); else 1."""
    if num_splits is None:
        sms = planned_sm_count(device)
        if sms is None or n_programs >= sms or seq_k < 1024:
            return 1, max(seq_k, 1)
        num_splits = min(triton.cdiv(2 * sms, n_programs), triton.cdiv(seq_k, 512))
    num_splits = max(1, min(int(num_splits), triton.cdiv(max(seq_k, 1), block_n)))
    span = triton.cdiv(triton.cdiv(max(seq_k, 1), num_splits), block_n) * block_n
    return triton.cdiv(max(seq_k, 1), span), span


def _tma(pb: Problem, *tensors: torch.Tensor) -> bool:
    """Whether the loop tiles come through tensor descriptors (TMA): on Hopper and later
    (sm_90+, the launch context's target or the GPU's own), when every descriptor is legal
    (each base and row, head and batch stride 16-byte aligned). The forward reads K and V
    so, the dk/dv pass q and do, the dq pass K and V; the descriptors are made on the
    device per sequence (rows past it read as zeros). Elsewhere (sm_80, AMD, the
    interpreter's default) the pointer path (cp.async)."""
    arch = planned_arch(tensors[0].device)
    if arch is None or arch < 90:
        return False
    return all(t.data_ptr() % 16 == 0
               and all(s * t.element_size() % 16 == 0 for s in pb.strides(t))
               for t in tensors)


def _precision(dtype: torch.dtype) -> str:
    return "ieee"  # fp32 products exact (no TF32); ignored for fp16/bf16 operands


def _upcast(kernel, t: torch.Tensor) -> bool:
    """Whether to turn bf16 tiles to fp32 before tl.dot: under the interpreter only, whose
    bf16 dot is wrong (products of bf16 values are exact in fp32), and not when launches
    are sized for a GPU (launch.for_target: inspect captures there the kernel a GPU runs, whose
    bf16 dots must compile to tensor-core instructions)."""
    return (t.dtype == torch.bfloat16 and is_interpreted(kernel)
            and planned_sm_count(t.device) is None)


class Problem:
    """The sizes and strides of one call, dense or packed, as the kernels take them.
    Packed: seq_q / seq_k are the launch's bounds (packed_lengths); `exact` says whether
    the sequences are known to tile the packed rows exactly (checked), else every output
    starts as zeros (lse -inf: a row in no sequence sees no key), since rows past
    cu_seqlens[-1] or past max_seqlen are in no program's sequence."""

    def __init__(self, q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k, checked: bool,
                 read: bool | None = None):
        """checked: the cu_seqlens are (or were, by the forward) checked; read: read them
        now (packed_lengths' check), by default when checked."""
        self.varlen = cu_q is not None
        self.exact = True
        if self.varlen:
            self.batch = cu_q.shape[0] - 1
            self.heads_q, self.heads_kv, self.head_dim = q.shape[1], k.shape[1], q.shape[2]
            self.total_q, self.total_k = q.shape[0], k.shape[0]
            self.seq_q, self.seq_k = packed_lengths(
                cu_q, cu_k, self.total_q, self.total_k, max_seqlen_q, max_seqlen_k,
                checked if read is None else read)
            self.exact = checked
            self.lse_shape = (self.heads_q, self.total_q)
        else:
            self.batch, self.heads_q, self.seq_q, self.head_dim = q.shape
            self.heads_kv, self.seq_k = k.shape[1], k.shape[2]
            self.total_q, self.total_k = self.seq_q, self.seq_k
            self.lse_shape = (self.batch, self.heads_q, self.seq_q)
        self.group = self.heads_q // self.heads_kv
        self.cu_q = cu_q.contiguous() if self.varlen else q  # unread placeholders when dense
        self.cu_k = cu_k.contiguous() if self.varlen else q

    def sides(self, left: int, right: int) -> tuple[int, int]:
        """The window's sides with a bounded side past every position cut to seq_q + seq_k
        (the same mask), so the kernels' int32 positions plus a side cannot overflow."""
        bound = self.seq_q + self.seq_k
        return tuple(-1 if side < 0 else min(side, bound) for side in (left, right))

    def sizes(self) -> tuple[int, int, int, int]:
        """(seq_q, seq_k, total_q, total_k), as every kernel takes them."""
        return self.seq_q, self.seq_k, self.total_q, self.total_k

    def new_like(self, t: torch.Tensor) -> torch.Tensor:
        """An output of t's shape, dtype and strides: zeros unless every row is written."""
        out = torch.empty_like(t)
        return out if self.exact else out.zero_()

    def new(self, shape, like: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """An fp32 buffer of `shape` on like's device: `fill` unless every row is written."""
        out = torch.empty(shape, dtype=torch.float32, device=like.device)
        return out if self.exact else out.fill_(fill)

    def strides(self, t: torch.Tensor) -> tuple[int, int, int]:
        """(batch, head, row) strides of q/k/v/o-like t; packed: batch 0."""
        if self.varlen:
            return 0, t.stride(1), t.stride(0)
        return t.stride(0), t.stride(1), t.stride(2)

    def lse_strides(self, t: torch.Tensor) -> tuple[int, int, int]:
        if self.varlen:
            return 0, t.stride(0), t.stride(1)
        return t.stride(0), t.stride(1), t.stride(2)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dim is contiguous (any other strides are followed), else a
    contiguous copy (the kernels read 16-byte vectors along the head dim)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


# --- launchers ----------------------------------------------------------------------------

def attention_fwd(q, k, v, *, causal: bool = False, scale: float | None = None,
                  window=None, softcap: float | None = None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q: int | None = None,
                  max_seqlen_k: int | None = None, num_splits: int | None = None,
                  check_seqlens: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): the attention output in q's shape and dtype, and the fp32 log-sum-exp.
    Usable without autograd; checks every input before any launch. num_splits forces the
    key range to be split across that many programs per query block (decode), the
    partials then combined; None picks it for the GPU."""
    left, right = check_arguments(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, num_splits=num_splits, check_seqlens=check_seqlens)
    return launch_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap, left, right,
                      max_seqlen_q, max_seqlen_k, num_splits, check_seqlens)


def launch_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, softcap, left, right,
               max_seqlen_q, max_seqlen_k, num_splits, check_seqlens):
    """attention_fwd on checked arguments (the window as its sides)."""
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    pb = Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_seqlens)
    scale = pb.head_dim ** -0.5 if scale is None else float(scale)
    left, right = pb.sides(left, right)
    o = pb.new_like(q)
    lse = pb.new(pb.lse_shape, q, float("-inf"))
    if q.numel() == 0:
        return o, lse
    if k.numel() == 0 or pb.seq_k == 0 and not pb.varlen:
        return o.zero_(), lse.fill_(float("-inf"))
    check_runtime(q, _attention_fwd_kernel)
    blocks = _blocks("fwd", pb.head_dim, pb.seq_q, q.dtype, q.device)
    m_blocks = triton.cdiv(pb.seq_q, blocks["BLOCK_M"])
    splits, span = _split_plan(m_blocks * pb.batch * pb.heads_q, pb.seq_k, blocks["BLOCK_N"],
                               q.device, num_splits)
    grid = (m_blocks * pb.batch * pb.heads_q, splits)
    flags = dict(_fwd_flags(pb, q, k, v, scale, softcap, left, right), SPLIT=splits > 1)
    if flags["TMA"]:
        ensure_allocator()  # the descriptors are made on the device, in Triton's scratch
    blocks = {**blocks, **_fwd_knobs(blocks["BLOCK_D"], q.dtype, q.device)}
    common = (pb.cu_q, pb.cu_k, m_blocks, *pb.sizes(), pb.heads_q, pb.group,
              pb.head_dim, scale, float(softcap or 1.0), left, right, span,
              *pb.strides(q), *pb.strides(k), *pb.strides(v))
    faults = torch.empty((pb.batch, pb.heads_q, m_blocks, splits), dtype=torch.int32,
                         device=q.device)
    if splits == 1:
        _attention_fwd_kernel[grid](q, k, v, o, lse, faults, *common, *pb.strides(o), 0,
                                    *pb.lse_strides(lse), 0, **flags, **blocks)
    else:  # normalised fp32 partials per split, then one combine per query row
        part_o = pb.new((splits, *o.shape), q)
        part_lse = pb.new((splits, *lse.shape), q, float("-inf"))
        _attention_fwd_kernel[grid](q, k, v, part_o, part_lse, faults, *common,
                                    *pb.strides(part_o[0]), part_o.stride(0),
                                    *pb.lse_strides(part_lse[0]), part_lse.stride(0),
                                    **flags, **blocks)
        rows_q = pb.total_q if pb.varlen else pb.seq_q
        batch = 1 if pb.varlen else pb.batch
        _attention_combine_kernel[(batch * pb.heads_q * rows_q,)](
            part_o, part_lse, o, lse, rows_q, pb.heads_q, rows_q, pb.head_dim, splits,
            *pb.strides(part_o[0]), part_o.stride(0), *pb.lse_strides(part_lse[0]),
            part_lse.stride(0), *pb.strides(o), *pb.lse_strides(lse),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=blocks["BLOCK_D"], num_warps=1)
    # the query blocks whose boundary blocks met a NaN or inf of v, redone exactly
    launch_fwd_faults(pb, q, k, v, o, lse, faults, blocks["BLOCK_M"], blocks["BLOCK_N"], scale,
                      softcap, left, right, flags)
    return o, lse


def _fwd_flags(pb: Problem, q, k, v, scale: float, softcap, left: int, right: int) -> dict:
    """The constexprs the forward and its fault kernel share."""
    return dict(VARLEN=pb.varlen, WINDOW=left >= 0 or right >= 0, SOFTCAP=softcap is not None,
                FOLD=softcap is None and scale > 0, UPCAST=_upcast(_attention_fwd_kernel, q),
                PRECISION=_precision(q.dtype), TMA=_tma(pb, k, v))


def launch_fwd_faults(pb: Problem, q, k, v, o, lse, faults, block_m: int, block_n: int,
                      scale: float, softcap, left: int, right: int,
                      flags: dict | None = None) -> None:
    """The forward's fault pass, after a forward kernel (this module's or the Gluon one,
    ops/attention_gluon.py) whose programs wrote one count per block of block_m query rows
    into faults int32 [batch, heads_q, blocks, splits] (blocks * block_m >= pb.seq_q):
    one wave of _attention_fwd_faults_kernel reads them and redoes each counted block of
    o and lse exactly, on tiles of at most 32 x 32 (block_n: the forward's keys a block).
    On finite inputs every count is 0 and nothing is written. flags: the forward's
    constexprs when it has them (_fwd_flags)."""
    flags = flags or _fwd_flags(pb, q, k, v, scale, softcap, left, right)
    tiles = _fault_tiles(block_m, block_n, max(16, triton.next_power_of_2(pb.head_dim)))
    fault_blocks = triton.cdiv(pb.seq_q, tiles["BLOCK_M"])
    _attention_fwd_faults_kernel[_one_wave(fault_blocks * pb.batch * pb.heads_q, q.device)](
        q, k, v, o, lse, faults, pb.cu_q, pb.cu_k, fault_blocks, faults.shape[3], block_m,
        faults.shape[2], *pb.sizes(), pb.batch, pb.heads_q, pb.group, pb.head_dim, scale,
        float(softcap or 1.0), left, right, *pb.strides(q), *pb.strides(k), *pb.strides(v),
        *pb.strides(o), *pb.lse_strides(lse),
        **{n: flags[n] for n in ("VARLEN", "WINDOW", "SOFTCAP", "FOLD", "UPCAST", "PRECISION",
                                 "TMA")}, **tiles, num_warps=8)


def _fault_tiles(block_m: int, block_n: int, block_d: int) -> dict:
    """The fault kernels' tiles: the main kernels', at most 32 x 32 (each divides the main
    one), so the exact path's extra tiles fit in registers."""
    return dict(BLOCK_M=min(block_m, 32), BLOCK_N=min(block_n, 32), BLOCK_D=block_d)


def _one_wave(work: int, device: torch.device) -> tuple[int]:
    """The grid of a fault kernel: at most one program per SM (a few under the
    interpreter), each walking the work items pid, pid + grid, ..."""
    return (max(1, min(work, planned_sm_count(device) or 4)),)


def attention_bwd(do, q, k, v, o, lse, *, dlse=None, causal: bool = False,
                  scale: float | None = None, window=None, softcap: float | None = None,
                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int | None = None,
                  max_seqlen_k: int | None = None, check_seqlens: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_fwd's (o, lse) under upstream do (and dlse when the
    log-sum-exp was used too); each in its input's shape and dtype."""
    left, right = check_arguments(
        q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, num_splits=None, check_seqlens=check_seqlens)
    return launch_bwd(do, dlse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, scale, softcap,
                      left, right, max_seqlen_q, max_seqlen_k, check_seqlens)


# The query rows per program of the delta kernel.
DELTA_ROWS = 64


def launch_bwd(do, dlse, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, scale, softcap, left,
               right, max_seqlen_q, max_seqlen_k, check_seqlens):
    """attention_bwd on checked arguments. The cu_seqlens were checked by the forward, so
    they are read again only when a max_seqlen is None and the check is on."""
    q, k, v, o, do = (_last_dim_contiguous(t) for t in (q, k, v, o, do))
    read = check_seqlens and (max_seqlen_q is None or max_seqlen_k is None)
    pb = Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, check_seqlens,
                 read)
    scale = pb.head_dim ** -0.5 if scale is None else float(scale)
    dq, dk, dv = pb.new_like(q), pb.new_like(k), pb.new_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    check_runtime(q, _attention_bwd_dq_kernel)
    left, right = pb.sides(left, right)
    delta, lse2 = pb.new(pb.lse_shape, q), pb.new(pb.lse_shape, q)
    lse = lse.contiguous()
    if dlse is not None:  # the lse's layout, which delta shares
        dlse = dlse.to(torch.float32).expand(pb.lse_shape).contiguous()
    d_blocks = _blocks("dq", pb.head_dim, pb.seq_q, q.dtype, q.device)
    pre_blocks = triton.cdiv(pb.seq_q, DELTA_ROWS)
    _attention_bwd_delta_kernel[(pre_blocks * pb.batch * pb.heads_q,)](
        o, do, lse, dlse if dlse is not None else delta, delta, lse2, pb.cu_q, pre_blocks,
        pb.seq_q, pb.total_q, pb.heads_q, pb.head_dim, *pb.strides(o), *pb.strides(do),
        *pb.lse_strides(delta), VARLEN=pb.varlen, HAS_DLSE=dlse is not None,
        BLOCK_M=DELTA_ROWS, BLOCK_D=d_blocks["BLOCK_D"], num_warps=4)
    flags = dict(VARLEN=pb.varlen, WINDOW=left >= 0 or right >= 0, SOFTCAP=softcap is not None,
                 UPCAST=_upcast(_attention_bwd_dq_kernel, q),
                 PRECISION=_precision(q.dtype), TMA=_tma(pb, q, k, v, do))
    if flags["TMA"]:
        ensure_allocator()
    common = (*pb.sizes(), None, pb.group, pb.head_dim, scale, float(softcap or 1.0),
              left, right, *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(do),
              *pb.lse_strides(lse2))
    kv_blocks = _blocks("dkdv", pb.head_dim, pb.seq_q, q.dtype, q.device)
    n_blocks = triton.cdiv(pb.seq_k, kv_blocks["BLOCK_N"])
    kv_faults = torch.empty((pb.batch, pb.heads_kv, n_blocks), dtype=torch.int32,
                            device=q.device)
    _attention_bwd_dkdv_kernel[(n_blocks * pb.batch * pb.heads_kv,)](
        q, k, v, do, lse2, delta, dk, dv, kv_faults, pb.cu_q, pb.cu_k, n_blocks,
        *_with_heads(common, pb.heads_kv),
        *pb.strides(dk), *pb.strides(dv), **flags, **kv_blocks)
    m_blocks = triton.cdiv(pb.seq_q, d_blocks["BLOCK_M"])
    q_faults = torch.empty((pb.batch, pb.heads_q, m_blocks), dtype=torch.int32, device=q.device)
    _attention_bwd_dq_kernel[(m_blocks * pb.batch * pb.heads_q,)](
        q, k, v, do, lse2, delta, dq, q_faults, pb.cu_q, pb.cu_k, m_blocks,
        *_with_heads(common, pb.heads_q),
        *pb.strides(dq), **flags, **d_blocks)
    # the blocks whose boundary blocks met a NaN or inf of q, do or k, redone exactly
    tiles = _fault_tiles(d_blocks["BLOCK_M"], kv_blocks["BLOCK_N"], d_blocks["BLOCK_D"])
    fault_kv = triton.cdiv(pb.seq_k, tiles["BLOCK_N"])
    fault_q = triton.cdiv(pb.seq_q, tiles["BLOCK_M"])
    work = (fault_kv * pb.heads_kv + fault_q * pb.heads_q) * pb.batch
    _attention_bwd_faults_kernel[_one_wave(work, q.device)](
        q, k, v, do, lse2, delta, dq, dk, dv, kv_faults, q_faults, pb.cu_q, pb.cu_k, fault_kv,
        kv_blocks["BLOCK_N"], fault_q, d_blocks["BLOCK_M"], *pb.sizes(), pb.batch,
        pb.heads_kv, pb.group, pb.head_dim, scale, float(softcap or 1.0), left, right,
        *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(do),
        *pb.lse_strides(lse2), *pb.strides(dq), *pb.strides(dk), *pb.strides(dv), **flags,
        **tiles, num_warps=8)
    return dq, dk, dv


def _with_heads(common: tuple, heads: int) -> tuple:
    """common with the heads of the kernel's grid in its place (after the four sizes)."""
    return common[:4] + (heads,) + common[5:]
