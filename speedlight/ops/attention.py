"""Flash attention: forward and backward launchers, input checks, the custom op and
`speedlight.attention`, and the op's SPEC (at the bottom).

Layouts: q [batch, heads_q, seq_q, dim] and k, v [batch, heads_kv, seq_k, dim] (Hugging
Face's order) with any strides whose last dim is contiguous, so a [batch, seq, heads, dim]
tensor's .transpose(1, 2) view is read in place; or packed [total, heads, dim] with int32
cu_seqlens_q/k [batch + 1] (variable length). The log-sum-exp is fp32 [batch, heads_q,
seq_q], [heads_q, total_q] packed. Naming: `left`/`right` are the window's sides (-1
unbounded); causal is right = 0.
"""

from __future__ import annotations

import collections
import itertools
import math

import torch
import triton

from speedlight import shapes

from speedlight.kernels.attention import (_attention_bwd_delta_kernel, _attention_bwd_dkdv_kernel,
                                          _attention_bwd_dq_kernel, _attention_combine_kernel,
                                          _attention_fwd_kernel)
from speedlight.launch import planned_sm_count
from speedlight.ops._checks import check_same_device, check_same_dtype, check_tensor
from speedlight.ops._suites import is_call_of
from speedlight.ops.registration import register_op
from speedlight.runtime import check_runtime, describe, is_interpreted
from speedlight.spec import Case, Cost, KernelDesign, OpSpec, rand_tensor

MAX_HEAD_DIM = 256


# --- checks ------------------------------------------------------------------------------

def _window_sides(causal: bool, window) -> tuple[int, int]:
    """(left, right) of the mask, -1 for an unbounded side; causal makes right 0."""
    if window is None:
        left, right = -1, -1
    else:
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
            raise TypeError(f"window must be a (left, right) pair of ints, got {window!r}")
        left, right = int(window[0]), int(window[1])
        if left < -1 or right < -1:
            raise ValueError(f"window sides must be >= -1 (-1 = unbounded), got {window!r}")
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def _check_inputs(q, k, v, scale, softcap, cu_seqlens_q, cu_seqlens_k) -> None:
    """Shape, dtype and device checks that need no data (they run under torch.compile)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    check_same_dtype(q=q, k=k, v=v)
    check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen:
        if cu_seqlens_q is None or cu_seqlens_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together (packed "
                             "variable-length inputs)")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            check_tensor(name, cu, dtypes=(torch.int32,), expected="int32")
            if cu.dim() != 1 or cu.shape[0] < 2:
                raise ValueError(f"{name} must be 1-D [batch + 1] with batch >= 1, got "
                                 f"{describe(cu)}")
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise ValueError(f"cu_seqlens_q ({describe(cu_seqlens_q)}) and cu_seqlens_k "
                             f"({describe(cu_seqlens_k)}) must have the same length")
    want = 3 if varlen else 4
    layout = ("packed [total, heads, dim] (cu_seqlens given)" if varlen else
              "[batch, heads, seq, dim]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want:
            raise ValueError(f"{name} must be {layout}, got {describe(t)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {describe(k)} and "
                         f"v {describe(v)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim, got q {describe(q)} and "
                         f"k {describe(k)}")
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be 1 to {MAX_HEAD_DIM}, got q {describe(q)}")
    h_dim = 1 if varlen else 1
    heads_q, heads_kv = q.shape[h_dim], k.shape[h_dim]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"kv heads ({heads_kv}, k {describe(k)}) must divide q heads "
                         f"({heads_q}, q {describe(q)})")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch, got q {describe(q)} and "
                         f"k {describe(k)}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0
                                    and math.isfinite(softcap)):
        raise ValueError(f"softcap must be a positive finite float or None, got {softcap!r}")


def _check_cu_seqlens(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int
                      ) -> tuple[int, int]:
    """(max seq_q, max seq_k) of packed inputs; ValueError unless both cu_seqlens start at
    0, never decrease and end within the packed tensors (reads them on the host)."""
    out = []
    for name, cu, total in (("cu_seqlens_q", cu_q, total_q), ("cu_seqlens_k", cu_k, total_k)):
        values = cu.tolist()
        lengths = [b - a for a, b in zip(values, values[1:])]
        if values[0] != 0 or min(lengths) < 0 or values[-1] > total:
            raise ValueError(f"{name} must start at 0, never decrease and end at most at the "
                             f"packed length {total}, got {values}")
        out.append(max(lengths))
    return out[0], out[1]


# --- launch sizing ----------------------------------------------------------------------------

def _blocks(direction: str, head_dim: int, seq_q: int, dtype: torch.dtype,
            device: torch.device) -> dict:
    """Block sizes, warps and stages of one kernel: `fwd`, `dkdv` or `dq`.

    On a GPU (or the one spec.sized_for names): FlashAttention-2's shapes for Hopper,
    smaller tiles for head dim 256 and for fp32 (whose IEEE products run on FMA units) so
    no kernel spills; a forward of few queries (decode) takes 16-row blocks. Under the
    interpreter every program costs milliseconds: the largest tiles that stay cheap.
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    few = max(16, triton.next_power_of_2(max(seq_q, 1)))
    if planned_sm_count(device) is None:
        bm = min(64, few) if direction != "dkdv" else 32
        return dict(BLOCK_M=bm, BLOCK_N=64 if block_d <= 128 else 32, BLOCK_D=block_d,
                    num_warps=4)
    wide = block_d > 128 or dtype == torch.float32
    if direction == "fwd":
        bm = min(128 if not wide else 64, few)
        return dict(BLOCK_M=bm, BLOCK_N=64 if block_d <= 128 else 32, BLOCK_D=block_d,
                    num_warps=8 if bm >= 128 else 4, num_stages=3 if block_d <= 128 else 2)
    if direction == "dkdv":
        return dict(BLOCK_M=32, BLOCK_N=128 if not wide else 64, BLOCK_D=block_d,
                    num_warps=8, num_stages=2 if block_d <= 128 else 1)
    return dict(BLOCK_M=128 if not wide else 64, BLOCK_N=32, BLOCK_D=block_d, num_warps=8,
                num_stages=2 if block_d <= 128 else 1)


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


def _precision(dtype: torch.dtype) -> str:
    return "ieee"  # fp32 products exact (no TF32); ignored for fp16/bf16 operands


def _upcast(kernel, t: torch.Tensor) -> bool:
    """Whether to turn bf16 tiles to fp32 before tl.dot: under the interpreter only, whose
    bf16 dot is wrong (products of bf16 values are exact in fp32), and not when launches
    are sized for a GPU (spec.sized_for: inspect captures there the kernel a GPU runs, whose
    bf16 dots must compile to tensor-core instructions)."""
    return (t.dtype == torch.bfloat16 and is_interpreted(kernel)
            and planned_sm_count(t.device) is None)


class _Problem:
    """The sizes and strides of one call, dense or packed, as the kernels take them."""

    def __init__(self, q, k, cu_q, cu_k, max_seqlen_q, max_seqlen_k):
        self.varlen = cu_q is not None
        if self.varlen:
            self.batch = cu_q.shape[0] - 1
            self.heads_q, self.heads_kv, self.head_dim = q.shape[1], k.shape[1], q.shape[2]
            self.total_q, self.total_k = q.shape[0], k.shape[0]
            if max_seqlen_q is None or max_seqlen_q < 0 or max_seqlen_k is None or max_seqlen_k < 0:
                max_seqlen_q, max_seqlen_k = _check_cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0])
            self.seq_q, self.seq_k = int(max_seqlen_q), int(max_seqlen_k)
            self.lse_shape = (self.heads_q, self.total_q)
        else:
            self.batch, self.heads_q, self.seq_q, self.head_dim = q.shape
            self.heads_kv, self.seq_k = k.shape[1], k.shape[2]
            self.lse_shape = (self.batch, self.heads_q, self.seq_q)
        self.group = self.heads_q // self.heads_kv
        self.cu_q = cu_q if self.varlen else q  # unread placeholders when dense
        self.cu_k = cu_k if self.varlen else q

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
                  max_seqlen_k: int | None = None, num_splits: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): the attention output in q's shape and dtype, and the fp32 log-sum-exp.
    Usable without autograd; checks every input before any launch. num_splits forces the
    key range to be split across that many programs per query block (decode), the
    partials then combined; None picks it for the GPU."""
    _check_inputs(q, k, v, scale, softcap, cu_seqlens_q, cu_seqlens_k)
    left, right = _window_sides(causal, window)
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    pb = _Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = pb.head_dim ** -0.5 if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty(pb.lse_shape, dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return o, lse
    if k.numel() == 0 or pb.seq_k == 0 and not pb.varlen:
        o.zero_()
        lse.fill_(float("-inf"))
        return o, lse
    check_runtime(q, _attention_fwd_kernel)
    blocks = _blocks("fwd", pb.head_dim, pb.seq_q, q.dtype, q.device)
    m_blocks = triton.cdiv(pb.seq_q, blocks["BLOCK_M"])
    splits, span = _split_plan(m_blocks * pb.batch * pb.heads_q, pb.seq_k, blocks["BLOCK_N"],
                               q.device, num_splits)
    grid = (m_blocks * pb.batch * pb.heads_q, splits)
    flags = dict(VARLEN=pb.varlen, WINDOW=left >= 0 or right >= 0, SOFTCAP=softcap is not None,
                 SPLIT=splits > 1, UPCAST=_upcast(_attention_fwd_kernel, q),
                 PRECISION=_precision(q.dtype))
    common = (pb.cu_q, pb.cu_k, m_blocks, pb.seq_q, pb.seq_k, pb.heads_q, pb.group,
              pb.head_dim, scale, float(softcap or 1.0), left, right, span,
              *pb.strides(q), *pb.strides(k), *pb.strides(v))
    if splits == 1:
        _attention_fwd_kernel[grid](q, k, v, o, lse, *common, *pb.strides(o), 0,
                                    *pb.lse_strides(lse), 0, **flags, **blocks)
        return o, lse
    # split key range: normalised fp32 partials per split, then one combine per query row
    part_o = torch.empty((splits, *o.shape), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((splits, *lse.shape), dtype=torch.float32, device=q.device)
    _attention_fwd_kernel[grid](q, k, v, part_o, part_lse, *common,
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
    return o, lse


def attention_bwd(do, q, k, v, o, lse, *, dlse=None, causal: bool = False,
                  scale: float | None = None, window=None, softcap: float | None = None,
                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int | None = None,
                  max_seqlen_k: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_fwd's (o, lse) under upstream do (and dlse when the
    log-sum-exp was used too); each in its input's shape and dtype."""
    _check_inputs(q, k, v, scale, softcap, cu_seqlens_q, cu_seqlens_k)
    left, right = _window_sides(causal, window)
    q, k, v, o, do = (_last_dim_contiguous(t) for t in (q, k, v, o, do))
    pb = _Problem(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    scale = pb.head_dim ** -0.5 if scale is None else float(scale)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    check_runtime(q, _attention_bwd_dq_kernel)
    delta = torch.empty(pb.lse_shape, dtype=torch.float32, device=q.device)
    d_blocks = _blocks("dq", pb.head_dim, pb.seq_q, q.dtype, q.device)
    pre_m = 64
    lse = lse.contiguous()
    if dlse is not None:  # the lse's layout, which delta shares
        dlse = dlse.to(torch.float32).expand(pb.lse_shape).contiguous()
    pre_blocks = triton.cdiv(pb.seq_q, pre_m)
    _attention_bwd_delta_kernel[(pre_blocks * pb.batch * pb.heads_q,)](
        o, do, dlse if dlse is not None else delta, delta, pb.cu_q, pre_blocks, pb.seq_q,
        pb.heads_q, pb.head_dim, *pb.strides(o), *pb.strides(do), *pb.lse_strides(delta),
        VARLEN=pb.varlen, HAS_DLSE=dlse is not None, BLOCK_M=pre_m,
        BLOCK_D=d_blocks["BLOCK_D"], num_warps=4)
    flags = dict(VARLEN=pb.varlen, WINDOW=left >= 0 or right >= 0, SOFTCAP=softcap is not None,
                 UPCAST=_upcast(_attention_bwd_dq_kernel, q),
                 PRECISION=_precision(q.dtype))
    common = (pb.seq_q, pb.seq_k, None, pb.group, pb.head_dim, scale, float(softcap or 1.0),
              left, right, *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(do),
              *pb.lse_strides(lse))
    kv_blocks = _blocks("dkdv", pb.head_dim, pb.seq_q, q.dtype, q.device)
    n_blocks = triton.cdiv(pb.seq_k, kv_blocks["BLOCK_N"])
    _attention_bwd_dkdv_kernel[(n_blocks * pb.batch * pb.heads_kv,)](
        q, k, v, do, lse, delta, dk, dv, pb.cu_q, pb.cu_k, n_blocks,
        *_with_heads(common, pb.heads_kv),
        *pb.strides(dk), *pb.strides(dv), **flags, **kv_blocks)
    m_blocks = triton.cdiv(pb.seq_q, d_blocks["BLOCK_M"])
    _attention_bwd_dq_kernel[(m_blocks * pb.batch * pb.heads_q,)](
        q, k, v, do, lse, delta, dq, pb.cu_q, pb.cu_k, m_blocks,
        *_with_heads(common, pb.heads_q),
        *pb.strides(dq), **flags, **d_blocks)
    return dq, dk, dv


def _with_heads(common: tuple, heads: int) -> tuple:
    return common[:2] + (heads,) + common[3:]


# --- registration: custom ops, fakes and autograd -----------------------------------------
# The ops take plain values: softcap 0.0 = none, window sides -1 = unbounded (causal folded
# in), max_seqlen -1 = read from cu_seqlens, num_splits 0 = the launcher's choice.

def _opt(value, none_value):
    return None if value == none_value else value


def _registered_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                    scale: float, softcap: float, left: int, right: int, max_seqlen_q: int,
                    max_seqlen_k: int, num_splits: int):
    return attention_fwd(q, k, v, scale=scale, window=(left, right), softcap=_opt(softcap, 0.0),
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=_opt(max_seqlen_q, -1), max_seqlen_k=_opt(max_seqlen_k, -1),
                         num_splits=_opt(num_splits, 0))


def _registered_bwd(do: torch.Tensor | None, dlse: torch.Tensor | None, q: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                    cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                    scale: float, softcap: float, left: int, right: int, max_seqlen_q: int,
                    max_seqlen_k: int):
    return attention_bwd(torch.zeros_like(o) if do is None else do, q, k, v, o, lse, dlse=dlse,
                         scale=scale, window=(left, right), softcap=_opt(softcap, 0.0),
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                         max_seqlen_q=_opt(max_seqlen_q, -1), max_seqlen_k=_opt(max_seqlen_k, -1))


def _fake(q, k, v, cu_seqlens_q, cu_seqlens_k, *_):
    """o with q's strides (the launcher's empty_like), and the fp32 lse."""
    lse_shape = (q.shape[1], q.shape[0]) if cu_seqlens_q is not None else tuple(q.shape[:3])
    return torch.empty_like(q), q.new_empty(lse_shape, dtype=torch.float32)


ATTENTION = register_op(
    "attention",
    forward=_registered_fwd,
    outputs=("o", "lse"),
    fake=_fake,
    backward=_registered_bwd,
    backward_fake=lambda do, dlse, q, k, v, *_: (torch.empty_like(q), torch.empty_like(k),
                                                 torch.empty_like(v)),
    grads=("q", "k", "v"),
    optional_grads=True,  # the lse is often unused: dlse None, not zeros
)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, window: tuple[int, int] | None = None,
              softcap: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, return_lse: bool = False,
              num_splits: int | None = None):
    """softmax(cap(q k^T * scale) + mask) v by flash attention (fp32 softmax statistics).

    q [batch, heads_q, seq_q, dim], k and v [batch, heads_kv, seq_k, dim] (heads_kv
    dividing heads_q: GQA/MQA without copies), any strides with the last dim contiguous;
    or packed [total, heads, dim] with int32 cu_seqlens_q/k [batch + 1] (max_seqlen_q/k
    spare a host read of them). Positions are aligned at the end (query row r at
    r + seq_k - seq_q): `causal` hides later keys, `window=(left, right)` keeps keys in
    [i - left, i + right] (-1 unbounded), `softcap=c` applies c * tanh(s / c) to the
    scaled scores; scale defaults to dim ** -0.5. A query that sees no key gets zeros.
    Returns o in q's shape and dtype, and with return_lse=True also the fp32 log-sum-exp
    [batch, heads_q, seq_q] ([heads_q, total] packed; -inf where no key is seen).
    num_splits forces the key range of each query block to be split across that many
    programs and combined (decode; None picks it for the GPU).
    Differentiable in q, k and v (and through the lse); works under torch.compile(fullgraph=True).
    """
    _check_inputs(q, k, v, scale, softcap, cu_seqlens_q, cu_seqlens_k)
    left, right = _window_sides(causal, window)
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    o, lse = ATTENTION(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, float(softcap or 0.0), left,
                       right, -1 if max_seqlen_q is None else int(max_seqlen_q),
                       -1 if max_seqlen_k is None else int(max_seqlen_k), num_splits or 0)
    return (o, lse) if return_lse else o


# --- OpSpec --------------------------------------------------------------------------------

# The query block and key block the cost model counts re-reads by (the GPU forward's and
# dk/dv kernel's tiles).
COST_BLOCK = 128
# A case with more (query, key) pairs per head than this runs for minutes or more under
# the interpreter: the GPU's cases.
CPU_MAX_PAIRS = 2 ** 16


def _lengths(case: Case) -> tuple[list[int], list[int]]:
    """Per-sequence (seq_q, seq_k) of a case: its packed lengths, else batch copies."""
    if case.flag("lens_q") is not None:
        return ([int(x) for x in str(case.flag("lens_q")).split("_")],
                [int(x) for x in str(case.flag("lens_k")).split("_")])
    return [case["seq_q"]] * case["batch"], [case["seq_k"]] * case["batch"]


def _case_window(case: Case) -> tuple[int, int]:
    left = case.flag("left")
    right = case.flag("right")
    window = None if left is None and right is None else (
        -1 if left is None else left, -1 if right is None else right)
    return _window_sides(bool(case.flag("causal")), window)


def _visible_ranges(seq_q: int, seq_k: int, left: int, right: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """[lo, hi) of the keys each query row sees (int64 [seq_q] each; hi <= lo: none)."""
    pos = torch.arange(seq_q, dtype=torch.int64) + (seq_k - seq_q)
    lo = (pos - left).clamp(min=0) if left >= 0 else torch.zeros_like(pos)
    hi = (pos + right + 1).clamp(max=seq_k) if right >= 0 else torch.full_like(pos, seq_k)
    return lo, hi


def _visible_counts(seq_q: int, seq_k: int, left: int, right: int) -> torch.Tensor:
    """Keys each query row sees (int64 [seq_q])."""
    lo, hi = _visible_ranges(seq_q, seq_k, left, right)
    return (hi - lo).clamp(min=0)


def _block_reads(seq_q: int, seq_k: int, left: int, right: int, block: int) -> int:
    """Keys read by the blocks of `block` query rows: each block reads from its rows'
    first visible key to their last (rows see contiguous key ranges)."""
    lo, hi = _visible_ranges(seq_q, seq_k, left, right)
    total = 0
    for b0 in range(0, seq_q, block):
        l, h = lo[b0:b0 + block], hi[b0:b0 + block]
        seen = h > l
        if bool(seen.any()):
            total += int(h[seen].max() - l[seen].min())
    return total


def _cost(case: Case, mode: str) -> Cost:
    """FLOPs over the visible (query, key) pairs only (causal counts about half): 2 matmuls
    forward, 5 backward (the scores recomputed, dv, dp, dq, dk).

    Bytes are what the flash kernels must move, L2 aside, not only each tensor once: k and
    v are read once per block of 128 query rows that sees them, per q head (forward, and
    the dq pass backward), q, do, lse and delta once per block of 128 keys per q head (the
    dk/dv pass). Forward: read q; write o, lse. Backward: read o, do (delta), q, do, lse,
    delta (dq pass), k, v (dk/dv pass); write delta, dq, dk, dv."""
    e, d = case.dtype.itemsize, case["dim"]
    heads, kv_heads = case["heads"], case["kv_heads"]
    left, right = _case_window(case)
    pairs = kv_reads = q_reads = tokens_q = tokens_k = 0
    for (sq, sk), n in collections.Counter(zip(*_lengths(case))).items():
        pairs += n * int(_visible_counts(sq, sk, left, right).sum())
        kv_reads += n * _block_reads(sq, sk, left, right, COST_BLOCK)
        q_reads += n * _block_reads(sk, sq, right, left, COST_BLOCK)  # query rows per key block
        tokens_q, tokens_k = tokens_q + n * sq, tokens_k + n * sk
    q_bytes = tokens_q * heads * d * e
    kv_bytes = tokens_k * kv_heads * d * e
    kv_block_bytes = kv_reads * heads * 2 * d * e
    if mode == "fwd":
        return Cost(flops=4 * pairs * d * heads,
                    bytes=2 * q_bytes + kv_block_bytes + 4 * tokens_q * heads)
    return Cost(flops=10 * pairs * d * heads,
                bytes=(5 * q_bytes + 4 * kv_bytes + kv_block_bytes
                       + q_reads * heads * (2 * d * e + 8) + 12 * tokens_q * heads))


def _make_inputs(case: Case, device) -> dict:
    b, h, hkv, d = case["batch"], case["heads"], case["kv_heads"], case["dim"]
    lens_q, lens_k = _lengths(case)
    left, right = _case_window(case)
    flags = dict(causal=bool(case.flag("causal")), softcap=case.flag("softcap"),
                 window=None if left < 0 and right < 0 else (left, right),
                 return_lse=bool(case.flag("lse")), num_splits=case.flag("splits"))
    if flags["causal"] and flags["window"] == (-1, 0):
        flags["window"] = None
    if case.flag("lens_q") is not None:
        cu = lambda lens: torch.tensor([0] + list(itertools.accumulate(lens)),  # noqa: E731
                                       dtype=torch.int32, device=device)
        shapes_ = {"q": (sum(lens_q), h, d), "k": (sum(lens_k), hkv, d), "v": (sum(lens_k), hkv, d)}
        layout = "strided" if case.layout == "strided" else "contiguous"
        tensors = {n: rand_tensor(s, case, device, layout=layout, salt=i)
                   for i, (n, s) in enumerate(shapes_.items())}
        return {**tensors, **flags, "cu_seqlens_q": cu(lens_q), "cu_seqlens_k": cu(lens_k),
                "max_seqlen_q": max(lens_q), "max_seqlen_k": max(lens_k)}
    sq, sk = case["seq_q"], case["seq_k"]
    shapes_ = {"q": (b, h, sq, d), "k": (b, hkv, sk, d), "v": (b, hkv, sk, d)}
    tensors = {}
    for i, (n, (bb, hh, ss, dd)) in enumerate(shapes_.items()):
        if case.layout == "transposed":  # a [batch, seq, heads, dim] tensor's transpose view
            t = rand_tensor((bb, ss, hh, dd), case, device, layout="contiguous", salt=i)
            tensors[n] = t.transpose(1, 2)
        else:
            tensors[n] = rand_tensor((bb, hh, ss, dd), case, device, salt=i)
    return {**tensors, **flags}


def _cases(suite: str) -> list[Case]:
    def case(b, h, hkv, sq, sk, d, layout="contiguous", model=None, **flags):
        return Case("attention", (("batch", b), ("heads", h), ("kv_heads", hkv), ("seq_q", sq),
                                  ("seq_k", sk), ("dim", d)),
                    layout=layout, flags=flags, model=model)

    def packed(h, hkv, d, lens_q, lens_k, **flags):
        return case(len(lens_q), h, hkv, sum(lens_q), sum(lens_k), d,
                    lens_q="_".join(map(str, lens_q)), lens_k="_".join(map(str, lens_k)), **flags)

    if suite == "quick":
        return [
            case(1, 2, 1, 1, 2, 64),
            case(1, 2, 1, 40, 40, 64, causal=True),
            case(2, 2, 1, 20, 33, 96),
            case(1, 2, 1, 17, 70, 80, causal=True, lse=True),
            case(1, 2, 1, 45, 12, 128, causal=True, lse=True),  # 33 rows see no key
            case(1, 2, 1, 40, 40, 112, causal=True, left=8),
            case(1, 2, 1, 20, 30, 256, causal=True, softcap=5.0),
            case(1, 2, 1, 9, 33, 40, left=4, right=6),
            case(1, 2, 1, 3, 100, 64, causal=True, splits=3, lse=True),
            case(1, 2, 1, 37, 37, 64, "transposed", causal=True),
            case(1, 2, 2, 21, 33, 64, "strided"),
            packed(2, 1, 64, [5, 1, 0, 17], [5, 1, 0, 17], causal=True, lse=True),
            packed(2, 2, 64, [1, 3], [40, 70], causal=True, splits=2),
            case(1, 2, 1, 0, 5, 64),
            case(1, 2, 1, 4, 0, 64, lse=True),
        ]
    out = []
    # seq 1 is one query against two keys: with a single key every dq and dk is exactly
    # zero, which no relative error can judge
    seqs = (1, 2, 127, 1000, 4096, 16384)
    for (h, hkv, d, cap, win), name in shapes.distinct_configs(
            ("heads", "kv_heads", "head_dim", "attn_softcap", "sliding_window")):
        extra = {"softcap": cap} if cap else {}
        for s in seqs:
            out.append(case(1, h, hkv, s, max(s, 2), d, model=name, causal=True, **extra))
        if win:
            out.append(case(1, h, hkv, 16384, 16384, d, model=name, causal=True, left=win - 1,
                            **extra))
        out.append(case(1, h, hkv, 1, 131072, d, model=name, causal=True, **extra))  # decode
    # the headline of scripts/gpu-check.sh: 8K tokens at head dim 128, causal and not
    out += [case(2, 32, 8, 8192, 8192, 128, model="llama-3-8b", causal=c) for c in (True, False)]
    if suite == "full":
        out += [
            case(3, 5, 5, 1021, 1021, 72, causal=True),
            case(2, 8, 2, 1000, 3001, 128, causal=True, lse=True),
            case(2, 8, 1, 4096, 4096, 128, "transposed", causal=True),
            case(1, 4, 4, 2047, 2047, 64, "strided", left=300, right=100),
            case(1, 8, 8, 4096, 4096, 256, causal=True, softcap=50.0),
            case(4, 32, 8, 16, 32768, 128, causal=True, lse=True),  # speculative decode
            packed(8, 2, 128, [1, 4096, 0, 777, 2, 3000], [1, 4096, 0, 777, 2, 3000],
                   causal=True, lse=True),
            packed(8, 8, 64, [1, 16, 3], [10000, 100, 65536], causal=True),
            case(1, 2, 1, 0, 4096, 128), case(1, 2, 1, 4096, 0, 128),
            # 64-bit offsets: q and o past 2^31 elements, and batch x heads past CUDA's
            # 65535 on a grid's second axis (the kernels take one flat first axis)
            case(65537, 32, 8, 8, 8, 128, causal=True, huge=True),
        ]
    return out


def _for_model(cfg, batch: int, seq: int) -> list[Case]:
    """The model's causal self-attention over batch x seq tokens (its softcap, and its
    sliding window as a second case where it has one)."""
    if not cfg.heads:
        return []
    params = (("batch", batch), ("heads", cfg.heads), ("kv_heads", cfg.kv_heads),
              ("seq_q", seq), ("seq_k", seq), ("dim", cfg.head_dim))
    flags = {"causal": True}
    if getattr(cfg, "attn_softcap", None):
        flags["softcap"] = cfg.attn_softcap
    out = [Case("attention", params, flags=flags, model=cfg.name)]
    window = getattr(cfg, "sliding_window", None)
    if window and window < seq:
        out.append(Case("attention", params, flags={**flags, "left": window - 1},
                        model=cfg.name))
    return out


def _skip(case: Case, device) -> str | None:
    if torch.device(device).type == "cuda":
        return None
    heads = case["heads"]
    left, right = _case_window(case)
    pairs = sum(n * int(_visible_counts(sq, sk, left, right).sum())
                for (sq, sk), n in collections.Counter(zip(*_lengths(case))).items())
    if pairs * heads > CPU_MAX_PAIRS * 8:
        return (f"{pairs * heads} (query, key) pairs: minutes to hours under the Triton "
                f"interpreter (about 3 ms per program); it runs on a GPU")
    return None


def _case_of(call: str, args) -> Case | None:
    """The Case of one call of the registered ops (forward or backward), from q and k (and
    the cu_seqlens when packed, read on the host)."""
    if not is_call_of(call, "attention"):
        return None
    q, k = args["q"], args["k"]
    flags = {"left": int(args["left"]), "right": int(args["right"])}
    flags = {n: w for n, w in flags.items() if w >= 0}
    if float(args.get("softcap") or 0.0):
        flags["softcap"] = float(args["softcap"])
    cu_q, cu_k = args.get("cu_seqlens_q"), args.get("cu_seqlens_k")
    if cu_q is not None:
        try:
            lens_q = torch.diff(cu_q).tolist()
            lens_k = torch.diff(cu_k).tolist()
        except (RuntimeError, NotImplementedError):  # fake tensors: no values to read
            return None
        return Case("attention", (("batch", len(lens_q)), ("heads", q.shape[1]),
                                  ("kv_heads", k.shape[1]), ("seq_q", sum(lens_q)),
                                  ("seq_k", sum(lens_k)), ("dim", q.shape[2])), dtype=q.dtype,
                    flags={"lens_q": "_".join(map(str, lens_q)),
                           "lens_k": "_".join(map(str, lens_k)), **flags})
    return Case("attention", (("batch", q.shape[0]), ("heads", q.shape[1]),
                              ("kv_heads", k.shape[1]), ("seq_q", q.shape[2]),
                              ("seq_k", k.shape[2]), ("dim", q.shape[3])), dtype=q.dtype,
                flags=flags)


def _rows(case: Case) -> int:
    return sum(_lengths(case)[0])


# One program of 8 warps per SM (an eighth of Hopper's 64 warps) is the flash design: its
# 128 x 64 score tile, fp32 accumulator and K/V pipeline fill the registers and shared
# memory, and the tensor cores, not warp count, hide the latency.
# The shortfall sm_100a's backward records (tests/inspect/test_blackwell.py holds it to it)
_BWD_SM100 = ("a shortfall on sm_100a: Triton 3.6 lowers the dk/dv pass's dots to tcgen05 "
              "MMA with dk and dv accumulated in tensor memory (512 columns), but moving the "
              "[BLOCK_N, D] tiles between tensor memory and registers for the softmax "
              "gradient runs at the 255-register cap and spills (about 200 bytes at head dim "
              "128); the sm_90a tiles are kept until a B200 can time smaller ones")
_FLASH = ("flash tiles: one 8-warp program per SM; k and v re-read per query block (and q, "
          "do per key block backward), as the cost model counts; no access width is held: "
          "the operand tiles of the loop are copied to shared memory asynchronously "
          "(cp.async, pipelined: min_stages), and lse/delta are one fp32 per row (32-bit)")

SPEC = OpSpec(
    impl=attention,
    make_inputs=_make_inputs,
    cost=_cost,
    suites=shapes.suites(_cases),
    grad_inputs=("q", "k", "v"),
    skip=_skip,
    notes=("Flash attention, causal/window/softcap/GQA/varlen/split-KV decode. Bytes count "
           "k and v once per 128-query block per q head (and q, do once per 128-key block "
           "backward): what a flash kernel reads, L2 aside. bf16 on CPU: the interpreter's "
           "tl.dot is wrong in bf16, so loaded bf16 tiles are upcast to fp32 there (products "
           "of bf16 values are exact in fp32: the GPU's math up to summation order)."),
    family="attention",
    for_model=_for_model,
    count_rows=_rows,
    case_of=_case_of,
    fuses=("eager or SDPA attention: flash attention (scores never written to memory; causal, "
           "sliding window, softcap, GQA, variable length)"),
    patches="attention",
    kernels={
        "_attention_fwd_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", min_stages=2, vector_bits=0, why=_FLASH,
            # sm_100a: tcgen05 MMA (UTCHMMA), the scores and the output accumulated in
            # tensor memory
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", min_stages=2,
                                         vector_bits=0, why=_FLASH)),)),
        "_attention_bwd_dkdv_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", vector_bits=0, why=_FLASH,
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", vector_bits=0,
                                         spills=True, why=_BWD_SM100)),)),
        "_attention_bwd_dq_kernel": KernelDesign(
            min_occupancy=0.125, mma="HGMMA", vector_bits=0, why=_FLASH,
            per_arch=((100, KernelDesign(min_occupancy=0.125, mma="UTCHMMA", vector_bits=0,
                                         why=_FLASH)),)),
        "_attention_combine_kernel": KernelDesign(min_occupancy=0.25, vector_bits=32,
                                                  why="one query row per program: its fp32 "
                                                      "partials of one head row each"),
    },
)
