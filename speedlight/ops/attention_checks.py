"""Attention's argument checks: every check that needs no tensor's values (types, shapes,
dtypes, devices, the window), run once by the public function or launcher, and the one
host read of packed cu_seqlens (`packed_lengths`) that check_seqlens=False skips. The
launchers are in ops/attention_launch.py.
"""

from __future__ import annotations

import math
import numbers

import torch

from speedlight.ops._checks import check_bool, check_same_device, check_same_dtype, check_tensor
from speedlight.runtime import describe

MAX_HEAD_DIM = 256
# The largest window side: int32, as the kernels' positions (a longer side is unbounded in
# effect, since cu_seqlens are int32 too).
MAX_WINDOW = 2 ** 31 - 1


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _is_int(v) -> bool:
    """An int (a SymInt too: a shape under torch.compile's dynamic shapes), not a bool."""
    return isinstance(v, (numbers.Integral, torch.SymInt)) and not isinstance(v, bool)


def window_sides(causal: bool, window) -> tuple[int, int]:
    """(left, right) of the mask, -1 for an unbounded side; causal makes right 0."""
    if window is None:
        left, right = -1, -1
    else:
        if (not isinstance(window, (tuple, list)) or len(window) != 2
                or not all(_is_int(w) for w in window)):
            raise TypeError(f"window must be a (left, right) pair of ints, got {window!r}")
        left, right = int(window[0]), int(window[1])
        if not (-1 <= left <= MAX_WINDOW and -1 <= right <= MAX_WINDOW):
            raise ValueError(f"window sides must be >= -1 (-1 = unbounded) and <= {MAX_WINDOW}, "
                             f"got {window!r}")
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def check_arguments(q, k, v, *, causal, scale, window, softcap, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q, max_seqlen_k, num_splits, check_seqlens) -> tuple[int, int]:
    """Every check that needs no tensor's values (so it runs under torch.compile): types,
    shapes, dtypes and devices; returns the window's (left, right). The values of packed
    cu_seqlens are checked where the kernels launch (packed_lengths)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    check_same_dtype(q=q, k=k, v=v)
    check_bool("causal", causal)
    check_bool("check_seqlens", check_seqlens)
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
    check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if n is None:
            continue
        if not _is_int(n):
            raise TypeError(f"{name} must be an int or None, got {n!r}")
        if n < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
        if not varlen:
            raise ValueError(f"{name} applies to packed inputs (cu_seqlens given) only")
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
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"kv heads ({heads_kv}, k {describe(k)}) must divide q heads "
                         f"({heads_q}, q {describe(q)})")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch, got q {describe(q)} and "
                         f"k {describe(k)}")
    if scale is not None and not (_is_real(scale) and math.isfinite(scale)):
        raise TypeError(f"scale must be a finite float or None, got {scale!r}")
    if softcap is not None and not (_is_real(softcap) and 0 < softcap < math.inf):
        raise ValueError(f"softcap must be a positive finite float or None, got {softcap!r}")
    if num_splits is not None and (not _is_int(num_splits) or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    return window_sides(causal, window)


def packed_lengths(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                   max_seqlen_q: int | None, max_seqlen_k: int | None, check: bool
                   ) -> tuple[int, int]:
    """The longest query and key sequence the launch covers (its max_seqlen), packed.

    check: read both cu_seqlens on the host (one sync) and raise ValueError unless each
    starts at 0, never decreases and ends at the packed length, and a given max_seqlen is
    at least the longest sequence; the bound is then the longest. Without the check
    nothing is read: the bound is max_seqlen, or the packed length when it is None. Either
    way the kernels clamp every sequence into the tensors, and a bound past the packed
    length is the packed length."""
    given = (max_seqlen_q, max_seqlen_k)
    totals = (total_q, total_k)
    if not check:
        return tuple(t if n is None else min(n, t) for n, t in zip(given, totals))
    out = []
    values = torch.stack([cu_q, cu_k]).tolist()  # the one host sync
    for side, vals, total, n in zip("qk", values, totals, given):
        lengths = [b - a for a, b in zip(vals, vals[1:])]
        if vals[0] != 0 or min(lengths) < 0 or vals[-1] != total:
            raise ValueError(f"cu_seqlens_{side} must start at 0, never decrease and end at "
                             f"the packed length {total} ({side}'s first dim), got {vals} "
                             f"(check_seqlens=False skips this read, e.g. for CUDA graphs)")
        if n is not None and n < max(lengths):
            raise ValueError(f"max_seqlen_{side} ({n}) is below the longest sequence of "
                             f"cu_seqlens_{side} ({max(lengths)})")
        out.append(max(lengths))
    return out[0], out[1]
