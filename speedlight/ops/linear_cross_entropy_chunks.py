"""linear_cross_entropy's launcher: the lm_head matmul and the cross-entropy over tokens in
chunks, so that only one chunk's [chunk, vocab] logits exist at a time.

Per chunk: the chunk's logits by one matmul; speedlight's cross-entropy kernel writes each
token's loss (and asked-for extras) and, over the logits in place, their gradient, already
multiplied by the upstream gradient (a mean's 1 / divisor folded in) before its rounding to
the logits' dtype; then that gradient's matmuls write the chunk's d_hidden and accumulate
d_weight and d_bias in fp32 (cast once at the end).

The matmuls run in the logits' dtype: hidden's, or under torch.autocast the autocast dtype,
as F.linear runs there (hidden, weight and bias cast to it; the weight once per call, the
hidden states a chunk at a time). d_hidden has hidden's dtype, d_weight and d_bias their
parameter's (accumulated in fp32 whatever the logits' dtype).

Chunk rule (`chunk_tokens`): the most tokens whose logits fit CHUNK_BUDGET_BYTES, but never
fewer than MIN_TOKENS_PER_SM per SM of the GPU the launch is sized for: the d_weight matmul
reduces over the chunk's tokens, and a reduction shorter than ~2K (16 per SM on a 132-SM
H100) leaves it short of the matmul ceiling, while [chunk, vocab] tiles then fill every SM
many times over. The chunks are then evened out (each a multiple of 128 tokens, the matmul
tile, where there are that many), so no last chunk is much smaller than the others (which
may take a chunk a little under the per-SM floor: 16384 tokens of a 128K vocabulary in bf16
on an H100 are 8 chunks of 2048).
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton

from speedlight.launch import planned_sm_count
from speedlight.ops.cross_entropy_launch import (
    check_targets,
    cross_entropy_fwd,
    divide_or_zero,
    mean_divisor,
    reduce_extras,
)

CHUNK_BUDGET_BYTES = 512 * 2 ** 20  # one chunk's logits (their gradient overwrites them)
MIN_TOKENS_PER_SM = 16
TILE_TOKENS = 128


def chunk_tokens(n_tokens: int, vocab: int, dtype: torch.dtype, device,
                 chunk_size: int | None = None) -> int:
    """Tokens per chunk: chunk_size when given, else the rule of the module docstring."""
    if n_tokens <= 0:
        return 1
    if chunk_size is not None:
        return max(1, min(int(chunk_size), n_tokens))
    by_budget = CHUNK_BUDGET_BYTES // max(1, vocab * dtype.itemsize)
    sms = planned_sm_count(device)
    size = max(by_budget, MIN_TOKENS_PER_SM * sms if sms else 1, 1)
    if size >= n_tokens:
        return n_tokens
    n_chunks = triton.cdiv(n_tokens, size)
    even = triton.cdiv(n_tokens, n_chunks)
    if even >= TILE_TOKENS:
        even = triton.cdiv(even, TILE_TOKENS) * TILE_TOKENS
    return min(even, n_tokens)


_FP32_OUT_MM: dict[str, bool] = {}  # device type -> whether addmm with an fp32 output runs


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b with acc fp32, whatever a and b's dtype: one half-precision matmul
    with an fp32 output (aten::addmm.dtype_out) where torch has it (CUDA); elsewhere, or
    where it fails, through fp32 copies of the chunk's operands (slower, more memory)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
        return
    kind = acc.device.type
    if kind == "cuda" and _FP32_OUT_MM.get(kind, True):
        try:
            torch.ops.aten.addmm.dtype_out(acc, a, b, torch.float32, out=acc)
            _FP32_OUT_MM[kind] = True
            return
        except (RuntimeError, NotImplementedError):
            _FP32_OUT_MM[kind] = False  # this torch/GPU lacks it: upcast from now on
    acc.addmm_(a.float(), b.float())


def _gradient_scale(reduction: str, divisor: torch.Tensor | None,
                    grad_loss: torch.Tensor | None, device) -> torch.Tensor | None:
    """What each token's gradient is multiplied by in the kernel: the upstream gradient
    (0-dim, or [tokens] for "none"; 1 when None), over a mean's divisor; None for 1."""
    if reduction == "mean":
        upstream = grad_loss if grad_loss is not None else torch.ones((), device=device)
        return divide_or_zero(upstream, divisor)  # 0 for a mean over nothing counted
    return grad_loss


def linear_cross_entropy_fwd(
        hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
        bias: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean",
        label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None, *,
        class_weight: torch.Tensor | None = None,
        needs_grad: Sequence[bool] = (False, False, False),
        grad_loss: torch.Tensor | None = None, autocast_dtype: torch.dtype | None = None,
        chunk_size: int | None = None, check_target: bool = True, extras: bool = False):
    """(loss, d_hidden, d_weight, d_bias, extras) over hidden [tokens, H], weight [V, H],
    target [tokens], bias [V] or None, class_weight [V] or None.

    needs_grad: whether to compute (d_hidden, d_weight, d_bias); those not asked are None.
    They are the gradients of the loss or, given grad_loss (the upstream gradient: 0-dim,
    or [tokens] for reduction "none"), of sum(grad_loss * loss).
    autocast_dtype: the dtype of the logits and matmuls under torch.autocast; None outside
    it (then hidden's, which weight and bias share).
    loss: fp32, 0-dim, or [tokens] for "none", whatever the inputs' dtype (as Hugging
    Face's loss and torch's losses under autocast).
    extras: (z_loss, token_accuracy, predicted_tokens) as cross_entropy returns them (the
    z-loss fp32 too), when asked; else None.
    """
    n, h = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    if check_target and n:
        check_targets(target, vocab, ignore_index)
    grad_h, grad_w, grad_b = (bool(f) for f in needs_grad)
    grad_b = grad_b and bias is not None
    any_grad = grad_h or grad_w or grad_b
    mm_dtype = autocast_dtype or hidden.dtype
    w_mm = weight.to(mm_dtype)  # a copy only under autocast: once per call
    b_mm = bias.to(mm_dtype) if bias is not None else None

    d_hidden = torch.empty((n, h), dtype=hidden.dtype, device=dev) if grad_h else None
    acc_w = torch.zeros((vocab, h), dtype=torch.float32, device=dev) if grad_w else None
    acc_b = torch.zeros(vocab, dtype=torch.float32, device=dev) if grad_b else None
    loss_rows = torch.empty(n, dtype=torch.float32, device=dev)
    rows = None  # each token's z-loss term, whether it was right, its argmax
    if extras:
        rows = (torch.empty(n, dtype=torch.float32, device=dev),
                torch.empty(n, dtype=torch.float32, device=dev),
                torch.empty(n, dtype=torch.int64, device=dev))
    divisor = (mean_divisor(target, vocab, ignore_index, class_weight)
               if reduction == "mean" else None)
    scale = _gradient_scale(reduction, divisor, grad_loss, dev) if any_grad else None
    opts = (ignore_index, "none", label_smoothing, z_loss, softcap)
    step = chunk_tokens(n, vocab, mm_dtype, dev, chunk_size)
    for s in range(0, n, step):
        e = min(s + step, n)
        h_c = hidden[s:e].to(mm_dtype)
        # [c, H] @ [H, V] -> [c, V]
        logits = torch.addmm(b_mm, h_c, w_mm.t()) if b_mm is not None else h_c @ w_mm.t()
        cross_entropy_fwd(
            logits, target[s:e], *opts, weight=class_weight, compute_grad=any_grad,
            check_target=False, grad_out=logits if any_grad else None,
            grad_scale=scale[s:e] if scale is not None and scale.dim() else scale,
            loss_out=loss_rows[s:e], extras=extras,
            extras_out=tuple(r[s:e] for r in rows) if rows else None)
        if not any_grad:
            continue
        dlogits = logits  # written over the logits by the kernel
        if grad_h:  # [c, V] @ [V, H] -> [c, H]
            if d_hidden.dtype == mm_dtype:
                torch.mm(dlogits, w_mm, out=d_hidden[s:e])
            else:  # autocast: the logits' dtype, then hidden's, as autograd casts it back
                d_hidden[s:e].copy_(dlogits @ w_mm)
        if grad_w:
            _accumulate_mm(acc_w, dlogits.t(), h_c)  # [V, c] @ [c, H] -> [V, H]
        if grad_b:
            acc_b += dlogits.sum(0, dtype=torch.float32)
        del logits, dlogits, h_c
    del w_mm, b_mm

    if reduction == "none":
        loss = loss_rows
    else:
        total = loss_rows.sum()
        loss = total if reduction == "sum" else divide_or_zero(total, divisor)
    more = (reduce_extras(*rows, target, ignore_index, reduction, divisor, torch.float32)
            if rows else None)
    d_weight = acc_w.to(weight.dtype) if acc_w is not None else None
    d_bias = acc_b.to(bias.dtype) if acc_b is not None else None
    return loss, d_hidden, d_weight, d_bias, more
