"""Plain-PyTorch references of every speedlight op.

Each function is dtype-generic: run on float64 inputs it is the ground truth verify
compares against; run on the case's own dtype it is what a PyTorch user would otherwise
get, and its error sets how much error a speedlight kernel may have. Written the way
PyTorch and the Hugging Face models compute these ops: where they upcast half-precision
inputs to float32 internally, so does the reference.
"""

from __future__ import annotations

import torch


def _opmath(x: torch.Tensor) -> torch.dtype:
    """The dtype PyTorch computes reductions of x in: float32 for half types, else x's."""
    return torch.promote_types(x.dtype, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6,
             offset: float = 0.0, in_place: bool = False) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * (offset + w) over the last dim.

    As torch.nn.functional.rms_norm and the Hugging Face norms compute it: statistics in
    float32 for half inputs, one rounding to x's dtype at the end. in_place (where
    speedlight's backward writes dx) changes no value: the reference ignores it.
    """
    h = x.to(_opmath(x))
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * (weight.to(h.dtype) + offset)
    return y.to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x - max) / sum(exp(x - max)) along dim."""
    return torch.softmax(x, dim=dim)


def _rotate_pairs(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The partner of each element, negated for the pair's first member: Hugging Face's
    rotate_half (pairs (i, i + d/2)) or GPT-J's rotate_every_two (pairs (2i, 2i + 1))."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         position_ids: torch.Tensor | None = None, unsqueeze_dim: int = 1,
         interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding of q and k: x * cos + rotate(x) * sin on the first rot_dim
    = cos.shape[-1] dims of each head, the rest passed through.

    As Hugging Face's apply_rotary_pos_emb computes it, in the inputs' dtype (HF builds cos
    and sin in q's dtype and does not upcast): cos/sin [batch, seq, rot_dim] broadcast over
    heads at unsqueeze_dim, or with position_ids a cache [max_pos, rot_dim] indexed by them.
    interleaved=True pairs dims (2i, 2i + 1) as GPT-J does, with cos/sin repeat-interleaved.
    Results have q's (k's) dtype.
    """
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rot_dim = cos.shape[-1]

    def apply(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
        y = x_rot * cos + _rotate_pairs(x_rot, interleaved) * sin
        return torch.cat((y.to(x.dtype), x_pass), dim=-1)

    return apply(q), apply(k)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None, *, weight: torch.Tensor | None = None,
                  return_z_loss: bool = False, return_token_accuracy: bool = False,
                  return_predicted_tokens: bool = False):
    """torch.nn.functional.cross_entropy over the last dim of logits [..., vocab] (with its
    per-class weight and label smoothing), plus z_loss * logsumexp^2 per non-ignored token
    (times the target's class weight) and an optional softcap * tanh(x / softcap) on the
    logits first.

    As the Hugging Face losses compute it: half-precision logits are upcast to float32
    (`logits.float()`) before the loss, and the loss is returned in the logits' dtype.
    A mean divides by the number of non-ignored tokens, or with weights by the sum of their
    targets' weights, as torch does; a mean over nothing counted (a divisor of 0) is 0
    (torch gives NaN), as speedlight defines it. With any return_* flag: the tuple (loss,
    z_loss, token_accuracy, predicted_tokens) of speedlight.cross_entropy, None where not
    asked; z_loss is detached (a logged value).
    """
    x = logits.to(_opmath(logits))
    w = weight.to(x.dtype) if weight is not None else None
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    x = x.reshape(-1, x.shape[-1])
    t = target.reshape(-1).long()
    losses = torch.nn.functional.cross_entropy(x, t, weight=w, ignore_index=ignore_index,
                                               reduction="none",
                                               label_smoothing=label_smoothing)
    valid = t != ignore_index
    w_t = (w[torch.where(valid, t, 0)] if w is not None else torch.ones_like(losses))
    w_t = torch.where(valid, w_t, 0.0)
    z_rows = torch.zeros_like(losses)
    if z_loss:
        lse = torch.logsumexp(x, dim=-1)
        z_rows = w_t * z_loss * lse * lse
        losses = losses + z_rows
    divisor = w_t.sum() if w is not None else valid.sum()

    def reduce(rows: torch.Tensor) -> torch.Tensor:
        if reduction == "none":
            return rows.reshape(target.shape).to(logits.dtype)
        total = rows.sum()
        if reduction == "mean":
            total = torch.where(divisor != 0, total / divisor, 0.0)
        return total.to(logits.dtype)

    loss = reduce(losses)
    if not (return_z_loss or return_token_accuracy or return_predicted_tokens):
        return loss
    pred = logits.reshape(-1, logits.shape[-1]).argmax(-1)
    correct = (valid & (pred == t)).to(torch.float32)
    if reduction == "none":
        acc = correct.reshape(target.shape)
    else:
        n = valid.sum()
        acc = torch.where(n != 0, correct.sum() / n, 0.0)
    return (loss, reduce(z_rows.detach()) if return_z_loss else None,
            acc if return_token_accuracy else None,
            pred.reshape(target.shape) if return_predicted_tokens else None)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float = 1e-6, offset: float = 0.0,
                 in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual, as a Hugging Face decoder layer computes it:
    the residual add in the model's dtype, then the norm of that (rounded) h. in_place is
    ignored, as in rms_norm."""
    h = x + residual
    return rms_norm(h, weight, eps, offset), h


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * w + b over the trailing dims (biased variance).

    torch.nn.functional.layer_norm computes half inputs in float32 and rounds once; so does
    this, on any device.
    """
    h = x.to(_opmath(x))
    w = weight.to(h.dtype) if weight is not None else None
    b = bias.to(h.dtype) if bias is not None else None
    return torch.nn.functional.layer_norm(h, tuple(normalized_shape), w, b, eps).to(x.dtype)


def _glu_halves(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """gate and up, split from one [..., 2 * I] tensor (gate first, as chunk(2, -1)) when
    up is None."""
    return gate.chunk(2, dim=-1) if up is None else (gate, up)


def _glu(act, gate: torch.Tensor, up: torch.Tensor | None, gate_multiplier: float,
         down_multiplier: float) -> torch.Tensor:
    """up * act(gate * gate_multiplier), times down_multiplier: Falcon-H1's MLP computes
    `up_proj(x) * act_fn(gate_proj(x) * gate_multiplier)`, then `down_proj(y) *
    down_multiplier`, which (no bias) is down_proj(y * down_multiplier). Each step rounds
    to the dtype; a multiplier of 1 is skipped, as the models without one compute."""
    gate, up = _glu_halves(gate, up)
    if gate_multiplier != 1.0:
        gate = gate * gate_multiplier
    y = act(gate) * up
    return y * down_multiplier if down_multiplier != 1.0 else y


def swiglu(gate: torch.Tensor, up: torch.Tensor | None = None, gate_multiplier: float = 1.0,
           down_multiplier: float = 1.0) -> torch.Tensor:
    """silu(gate) * up, as LlamaMLP computes act_fn(gate_proj(x)) * up_proj(x): the
    activation rounded to the dtype, then the product; with Falcon-H1's multipliers as
    `_glu` says."""
    return _glu(torch.nn.functional.silu, gate, up, gate_multiplier, down_multiplier)


def geglu(gate: torch.Tensor, up: torch.Tensor | None = None,
          approximate: str = "tanh", gate_multiplier: float = 1.0,
          down_multiplier: float = 1.0) -> torch.Tensor:
    """gelu(gate) * up (approximate="tanh" is GemmaMLP's gelu_pytorch_tanh, "none" the exact
    erf form), the activation rounded to the dtype, then the product; multipliers as swiglu's."""
    return _glu(lambda g: torch.nn.functional.gelu(g, approximate=approximate), gate, up,
                gate_multiplier, down_multiplier)


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, residual: torch.Tensor | None = None,
           scale: float | None = None, out_dtype: torch.dtype | None = None,
           scale_a: torch.Tensor | None = None, scale_b: torch.Tensor | None = None,
           return_amax: bool = False):
    """act(scale * (a @ b) + bias) + residual, as a PyTorch user chains it: torch.matmul in
    a's dtype (fp32 accumulation, one rounding), then each epilogue step in that dtype.
    out_dtype float32 on half inputs multiplies the upcast operands (their products are
    exact in float32). On float64 inputs (the ground truth) everything stays float64.
    activation: None, "silu", "gelu_tanh" or "gelu".

    With scales (fp8): the product is (scale_a * a) @ (scale_b * b). On fp8 operands it is
    PyTorch's own fp8 GEMM, torch._scaled_mm (fp32 accumulation, one rounding to out_dtype,
    bf16 by default), then the epilogue in out_dtype; where a gradient is asked for (which
    _scaled_mm has none of) or _scaled_mm does not run, the same arithmetic by hand: the
    operands dequantized in fp32, multiplied in fp32, rounded once. On float64 operands
    (the harness's ground truth of an fp8 case) it is all float64.
    return_amax: also max |result| as a 0-d float32 (no gradient), as delayed scaling
    reads it from the output."""
    if scale_a is not None:
        y = _scaled_product(a, b, scale_a, scale_b, out_dtype)
        dtype = y.dtype
    else:
        dtype = torch.float64 if a.dtype == torch.float64 else (out_dtype or a.dtype)
        y = a.to(dtype) @ b.to(dtype) if dtype != a.dtype else a @ b
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias.to(dtype)
    if activation == "silu":
        y = torch.nn.functional.silu(y)
    elif activation in ("gelu_tanh", "gelu"):
        y = torch.nn.functional.gelu(y, approximate="tanh" if activation == "gelu_tanh" else "none")
    elif activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    if residual is not None:
        y = y + residual.to(dtype)
    if return_amax:
        return y, y.detach().abs().amax().float()
    return y


def _scaled_product(a, b, scale_a, scale_b, out_dtype):
    """(scale_a * a) @ (scale_b * b): float64 throughout on float64 operands; else
    torch._scaled_mm where it runs and no gradient is needed, else dequantized fp32 operands
    multiplied in fp32, rounded once to out_dtype (bf16 by default)."""
    if a.dtype == torch.float64:
        return (a * scale_a.to(a.dtype)) @ (b * scale_b.to(b.dtype))
    out = out_dtype or torch.bfloat16
    fp8 = a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8 and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)):
        try:
            sa = scale_a.reshape(()) if scale_a.numel() == 1 else scale_a
            sb = scale_b.reshape(()) if scale_b.numel() == 1 else scale_b
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out)
        except (RuntimeError, ValueError, NotImplementedError, AttributeError):
            pass  # this build or device has no _scaled_mm for these: the same by hand
    y = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
    return y.to(out)


def gated_matmul(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor | None = None,
                 activation: str = "silu") -> torch.Tensor:
    """act(x @ w_gate^T) * (x @ w_up^T), as Llama's MLP computes act_fn(gate_proj(x)) *
    up_proj(x) in x's dtype; with w_up None, w_gate is [2 * I, H], gate rows then up rows
    (Phi-3's gate_up_proj, split by chunk(2, -1) after the projection)."""
    if w_up is None:
        gate, up = torch.nn.functional.linear(x, w_gate).chunk(2, dim=-1)
    else:
        gate, up = torch.nn.functional.linear(x, w_gate), torch.nn.functional.linear(x, w_up)
    if activation == "silu":
        act = torch.nn.functional.silu(gate)
    elif activation in ("gelu_tanh", "gelu"):
        act = torch.nn.functional.gelu(gate, approximate="tanh" if activation == "gelu_tanh"
                                       else "none")
    else:
        raise ValueError(f"unknown activation {activation!r}")
    return act * up


# Score elements (queries x keys x heads) the attention reference holds at once: it takes
# queries in chunks, so a 128K-token case needs no [seq, seq] matrix.
ATTENTION_SCORE_BUDGET = 2 ** 24
# The most query rows of one chunk: a chunk's rows share the keys every one of them sees
# (one dense product) and gather the rest row by row, at most about two keys per row of
# the chunk under a causal or window mask.
ATTENTION_CHUNK_ROWS = 64


def attention_key_ranges(seq_q: int, seq_k: int, rows: torch.Tensor, causal: bool = False,
                         window: tuple[int, int] | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi), int64 like `rows`: query row r sees the keys [lo, hi) (none when hi ==
    lo). Positions are aligned at the end (row r at position r + seq_k - seq_q); causal
    hides keys after the query; a window (left, right) keeps keys in [i - left, i + right],
    -1 for an unbounded side."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    pos = rows.to(torch.int64) + (seq_k - seq_q)
    lo = (pos - left).clamp(0, seq_k) if left >= 0 else torch.zeros_like(pos)
    hi = (pos + right + 1).clamp(0, seq_k) if right >= 0 else torch.full_like(pos, seq_k)
    return lo, torch.maximum(lo, hi)


def _gathered(t: torch.Tensor, index: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """t [b, h, seq_k, d] at key index [c, w] per query row: [b, h, c, w, d], zeros where
    `keep` [c, w] is False (selected, so a NaN there reaches nothing, gradients included)."""
    return torch.where(keep[..., None], t[:, :, index], 0)


def _attention_rows(qc, k, v, lo, hi, scale, softcap):
    """(o, lse) of query rows qc [b, hkv, g, c, d] of which row r sees keys [lo[r], hi[r])
    of k, v [b, hkv, seq_k, d], by selection: each row's softmax and products run over its
    own keys only. The keys every row sees, [max lo, min hi), are one dense product; each
    row's other keys are gathered for it (padding selected away, never added). Its
    products are ordered per row, unlike eager attention's one product per matrix: the
    float64 path."""
    in_lo = int(lo.max())
    in_hi = max(int(hi.min()), in_lo)
    head = (torch.minimum(hi, torch.full_like(hi, in_lo)) - lo).clamp(min=0)
    tail_lo = torch.maximum(lo, torch.full_like(lo, in_hi))
    tail = (hi - tail_lo).clamp(min=0)
    width = max(1, int((head + tail).max()))
    t = torch.arange(width, device=lo.device)
    index = torch.where(t < head[:, None], lo[:, None] + t, tail_lo[:, None] + t - head[:, None])
    keep = t < (head + tail)[:, None]
    index = torch.where(keep, index, 0)
    k_edge, v_edge = _gathered(k, index, keep), _gathered(v, index, keep)
    k_in, v_in = k[:, :, in_lo:in_hi].unsqueeze(2), v[:, :, in_lo:in_hi].unsqueeze(2)
    s = torch.cat([torch.matmul(qc, k_in.transpose(-1, -2)),  # [b, hkv, g, c, keys seen by all]
                   torch.einsum("bhgcd,bhcwd->bhgcw", qc, k_edge)], dim=-1) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    seen = torch.cat([keep.new_ones(keep.shape[0], in_hi - in_lo), keep], dim=-1)
    x = torch.where(seen, s.to(_opmath(s)), float("-inf"))  # padding is no key
    return _softmax_times_v(x, [(in_hi - in_lo, v_in, False), (width, v_edge, True)], qc.dtype)


def _attention_eager_rows(qc, k, v, rows, seq_q, causal, scale, window, softcap):
    """(o, lse) of query rows `rows` (qc [b, hkv, g, c, d]) as eager attention computes
    them: dense scores against every key, the hidden ones set to -inf, the dense product
    p @ v (its rounding is what a PyTorch user gets; a NaN or inf the mask hides spreads
    through the products, which only the float64 path, by selection, defines)."""
    s = torch.matmul(qc, k.unsqueeze(2).transpose(-1, -2)) * scale  # [b, hkv, g, c, seq_k]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    lo, hi = attention_key_ranges(seq_q, k.shape[2], rows, causal, window)
    keys = torch.arange(k.shape[2], device=rows.device)
    seen = (keys >= lo[:, None]) & (keys < hi[:, None])
    return _softmax_times_v(torch.where(seen, s.to(_opmath(s)), float("-inf")),
                            [(k.shape[2], v.unsqueeze(2), False)], qc.dtype)


def _softmax_times_v(x, parts, dtype):
    """(o, lse): softmax over the last dim of x (fp32 or float64 scores, -inf where no key)
    rounded to dtype, times the values: parts is [(n, v, per_row)], the next n columns
    of x (p [b, hkv, g, c, n]) against v [b, hkv, 1, n, d] shared by the rows, or v [b,
    hkv, c, n, d] per row, in dtype, their products summed."""
    m = x.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    den = e.sum(-1, keepdim=True)
    # a +inf score (den +inf): torch's softmax, its max subtracted, is NaN at every key seen
    p = e / torch.where(den == 0, torch.ones_like(den),
                        torch.where(den == float("inf"), float("nan"), den))
    p = p.to(dtype)
    o, at = 0, 0
    for n, vp, per_row in parts:
        pp = p[..., at:at + n]
        o = o + (torch.matmul(pp.unsqueeze(-2), vp.unsqueeze(2)).squeeze(-2) if per_row
                 else torch.matmul(pp, vp))
        at += n
    # a row that saw no key (den 0, no fault): lse -inf, a constant (no NaN gradient)
    lse = torch.log(torch.where(den == 0, torch.ones_like(den), den)) + m
    return o, torch.where(den == 0, float("-inf"), lse).squeeze(-1)


def _attention_dense(q, k, v, causal, scale, window, softcap, budget):
    """(o, lse) of q [b, hq, sq, d], k/v [b, hkv, sk, d], queries taken in chunks: by
    selection in float64, as eager attention in a lower precision."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if sk == 0:  # no key: zeros, and a log-sum-exp of -inf
        return q.new_zeros(q.shape), torch.full((b, hq, sq), float("-inf"), dtype=_opmath(q),
                                                device=q.device)
    qg = q.reshape(b, hkv, hq // hkv, sq, d)
    selected = q.dtype == torch.float64
    chunk = max(1, budget // max(1, b * hq * sk))
    if selected:
        chunk = min(chunk, ATTENTION_CHUNK_ROWS)
    outs, lses = [], []
    for r0 in range(0, sq, chunk):
        rows = torch.arange(r0, min(sq, r0 + chunk), device=q.device)
        qc = qg[:, :, :, r0:r0 + len(rows)]
        if selected:
            lo, hi = attention_key_ranges(sq, sk, rows, causal, window)
            o, lse = _attention_rows(qc, k, v, lo, hi, scale, softcap)
        else:
            o, lse = _attention_eager_rows(qc, k, v, rows, sq, causal, scale, window, softcap)
        outs.append(o)
        lses.append(lse)
    o = torch.cat(outs, dim=3) if outs else q.new_zeros(b, hkv, hq // hkv, 0, d)
    lse = (torch.cat(lses, dim=3) if lses else
           torch.zeros(b, hkv, hq // hkv, 0, dtype=_opmath(q), device=q.device))
    return o.reshape(b, hq, sq, d), lse.reshape(b, hq, sq)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, window: tuple[int, int] | None = None,
              softcap: float | None = None, cu_seqlens_q: torch.Tensor | None = None,
              cu_seqlens_k: torch.Tensor | None = None, max_seqlen_q: int | None = None,
              max_seqlen_k: int | None = None, return_lse: bool = False,
              num_splits: int | None = None, check_seqlens: bool = True,
              budget: int = ATTENTION_SCORE_BUDGET):
    """softmax(cap(q k^T * scale)) v over the keys each query row sees, as Hugging Face's
    eager attention computes it:
    scores and the softcap in the inputs' dtype, the softmax in float32 (float64 for
    float64 inputs) rounded back to the dtype, then p @ v. A query that sees no key gets
    zeros and a log-sum-exp of -inf.

    q [batch, heads_q, seq_q, dim], k/v [batch, heads_kv, seq_k, dim], or packed
    [total, heads, dim] with cu_seqlens_q/k [batch + 1]; the log-sum-exp (returned when
    return_lse) is fp32 [batch, heads_q, seq_q] ([heads_q, total] packed), float64 for
    float64 inputs. GQA without repeating k and v; queries are taken in chunks so no more
    than `budget` scores exist at once. max_seqlen_*, num_splits and check_seqlens only
    tell a kernel how to divide the work and do not change the result.
    Masked by selection: each query row's softmax and products run over the keys it sees
    and no other (the masked keys removed, never added as -inf), so nothing at a position
    the mask hides, NaN and inf included, reaches any output or gradient, as in the flash
    and cuDNN backends. At the positions a row sees, faults propagate as the arithmetic
    does: a NaN score gives the row o and lse NaN and p NaN at every key it sees (so the
    gradients of those keys); a +inf score gives o NaN and lse +inf, p NaN likewise.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens_q is None:
        o, lse = _attention_dense(q, k, v, causal, scale, window, softcap, budget)
    else:
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        outs, lses = [], []
        for i in range(len(cq) - 1):
            qi = q[cq[i]:cq[i + 1]].transpose(0, 1).unsqueeze(0)
            ki = k[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
            vi = v[ck[i]:ck[i + 1]].transpose(0, 1).unsqueeze(0)
            oi, li = _attention_dense(qi, ki, vi, causal, scale, window, softcap, budget)
            outs.append(oi[0].transpose(0, 1))
            lses.append(li[0])
        o = torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)
        lse = (torch.cat(lses, dim=1) if lses else
               torch.zeros(q.shape[1], 0, dtype=_opmath(q), device=q.device))
    if not return_lse:
        return o
    return o, lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None,
                         class_weight: torch.Tensor | None = None,
                         return_z_loss: bool = False, return_token_accuracy: bool = False,
                         return_predicted_tokens: bool = False):
    """cross_entropy(F.linear(hidden, weight, bias).float(), target, ...,
    weight=class_weight): the logits in hidden's dtype, as an lm_head computes them, then
    the loss (and the asked-for extras) as Hugging Face's loss computes them from the
    logits upcast to float32: the loss and z-loss are float32 for half-precision inputs
    (float64 for float64)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return cross_entropy(logits.to(_opmath(logits)), target, ignore_index, reduction, label_smoothing, z_loss,
                         softcap, weight=class_weight, return_z_loss=return_z_loss,
                         return_token_accuracy=return_token_accuracy,
                         return_predicted_tokens=return_predicted_tokens)


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, group_offsets: torch.Tensor,
                   bias: torch.Tensor | None = None, activation: str | None = None,
                   out_dtype: torch.dtype | None = None):
    """act(x[rows of g] @ w[g]^T + bias[g]) per group, as a PyTorch user loops over the
    experts: each group's matmul in x's dtype (one rounding), the bias and activation in
    that dtype; rows past the last group's end are zeros. group_offsets [G] holds the
    cumulative row ends (read on the host). On float64 everything stays float64."""
    dtype = torch.float64 if x.dtype == torch.float64 else (out_dtype or x.dtype)
    parts, start = [], 0
    for g, end in enumerate(group_offsets.tolist()):
        y = matmul(x[start:end], w[g].t(), activation=activation, out_dtype=out_dtype,
                   bias=bias[g] if bias is not None else None)
        parts.append(y.to(dtype))
        start = end
    parts.append(x.new_zeros((x.shape[0] - start, w.shape[1]), dtype=dtype))
    return torch.cat(parts)


def moe_gate_unit(z: torch.Tensor, activation: str, interleaved: bool, gate_multiplier: float,
                   down_multiplier: float, swiglu_alpha: float, swiglu_limit: float):
    """The gate unit of one expert's gate_up output z [rows, 2 I], as the models write it."""
    gate, up = (z[..., 0::2], z[..., 1::2]) if interleaved else z.chunk(2, dim=-1)
    gate = gate * gate_multiplier
    if activation == "clamped_swiglu":  # gpt-oss's GptOssExperts._apply_gate
        gate = gate.clamp(min=None, max=swiglu_limit)
        up = up.clamp(min=-swiglu_limit, max=swiglu_limit)
        return (up + 1) * (gate * torch.sigmoid(gate * swiglu_alpha)) * down_multiplier
    act = {"silu": torch.nn.functional.silu,
           "gelu_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
           "gelu": torch.nn.functional.gelu}[activation]
    return act(gate) * up * down_multiplier


def moe_experts(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                gate_up_proj: torch.Tensor, down_proj: torch.Tensor, activation: str = "silu",
                gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                interleaved: bool = False, gate_multiplier: float = 1.0,
                down_multiplier: float = 1.0, swiglu_alpha: float = 1.702,
                swiglu_limit: float = 7.0) -> torch.Tensor:
    """A mixture of experts' routed experts as transformers 5.x's eager loop computes them:
    for each expert, its tokens' rows through gate_up_proj [2 I, H], the gate unit and
    down_proj [H, I] in the weights' dtype, times the routing weight, index_add_ into a
    zeros tensor of hidden's dtype. Indices outside [0, E) are skipped (reads them on the
    host)."""
    out = torch.zeros_like(hidden)
    for e in range(gate_up_proj.shape[0]):
        token, slot = torch.where(top_k_index == e)
        z = hidden[token] @ gate_up_proj[e].t()
        if gate_up_bias is not None:
            z = z + gate_up_bias[e]
        h = moe_gate_unit(z, activation, interleaved, gate_multiplier, down_multiplier,
                           swiglu_alpha, swiglu_limit)
        y = h @ down_proj[e].t()
        if down_bias is not None:
            y = y + down_bias[e]
        y = y * top_k_weights[token, slot, None]
        out = out.index_add(0, token, y.to(hidden.dtype))
    return out
