"""linear_cross_entropy's launcher: the lm_head matmul and the cross-entropy under the
schedule linear_cross_entropy_schedule.plan_schedule picks for the call's memory budget.

Token-major (in-place, fp32-accumulator): per chunk of tokens, the chunk's logits by one
matmul; speedlight's cross-entropy kernel writes each token's loss (and asked-for extras)
and, over the logits in place, their gradient, already multiplied by the upstream gradient
(a mean's 1 / divisor folded in) before its rounding to the logits' dtype; then that
gradient's matmuls write the chunk's rows of d_hidden and add into d_weight (the first
chunk writes it: nothing is zero-filled): in d_weight itself (in-place), or in an fp32
accumulator whose last chunk's GEMM (speedlight's, its epilogue adding the accumulator)
writes d_weight in its dtype, with no cast pass after.

Vocab-major: the same token pass without d_weight, which also keeps each token's softmax
statistics (kernels/linear_cross_entropy.py); then per block of the vocabulary the block's
logits for every token again, their gradient from the statistics in place, and the block's
rows of d_weight (and d_bias) by one GEMM over all tokens.

The matmuls run in the logits' dtype: hidden's, or under torch.autocast the autocast dtype,
as F.linear runs there (hidden, weight and bias cast to it; the weight once per call, the
hidden states a chunk at a time). d_hidden has hidden's dtype, d_weight and d_bias their
parameter's (d_bias summed in fp32 whatever the schedule: [vocab], no pass worth saving).
"""

from __future__ import annotations

from typing import Sequence

import torch
import triton

from speedlight.kernels.linear_cross_entropy import (
    _lce_grad_block_kernel,
    _lce_row_stats_kernel,
    _lce_scale_kernel,
)
from speedlight.kernels.matmul import _matmul_kernel
from speedlight.launch import planned_sm_count, warps_for_tile
from speedlight.ops._gemm import ensure_allocator, gemm_config, programs, tma_layout, use_tma
from speedlight.ops._gemm import precision as gemm_precision
from speedlight.ops.cross_entropy_launch import (
    check_targets,
    cross_entropy_fwd,
    divide_or_zero,
    mean_divisor,
    reduce_extras,
)
from speedlight.ops.linear_cross_entropy_schedule import Schedule, plan_schedule
from speedlight.ops.matmul import MATMUL_CONFIGS
from speedlight.runtime import check_runtime

STATS_BLOCK_N = 4096  # the statistics kernel's columns per step on a GPU (8 warps, 16 a thread)
GRAD_BLOCK = (16, 256)  # the gradient block kernel's tile on a GPU (rows, columns)
SCALE_BLOCK = 4096


# --- matmuls into a given output -----------------------------------------------------------

_DTYPE_OUT: dict[str, bool] = {}  # device type -> whether aten's mm/addmm .dtype_out run


def _mm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    """out (+)= a @ b, summed in fp32 and rounded once to out's dtype: out's own dtype
    matmul where a and b share it (cuBLAS adds out in the epilogue when accumulating); an
    fp32 out from half-precision a and b by aten's mm/addmm .dtype_out where torch has
    them (CUDA), else through fp32 copies of a and b."""
    if a.dtype == out.dtype:
        if accumulate:
            out.addmm_(a, b)
        else:
            torch.mm(a, b, out=out)
        return
    kind = out.device.type
    if kind == "cuda" and _DTYPE_OUT.get(kind, True):
        try:
            if accumulate:
                torch.ops.aten.addmm.dtype_out(out, a, b, torch.float32, out=out)
            else:
                torch.ops.aten.mm.dtype_out(a, b, torch.float32, out=out)
            _DTYPE_OUT[kind] = True
            return
        except (RuntimeError, NotImplementedError):
            _DTYPE_OUT[kind] = False  # this torch/GPU lacks them: upcast from now on
    if accumulate:
        out.addmm_(a.float(), b.float())
    else:
        torch.mm(a.float(), b.float(), out=out)


def _mm_plus_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  residual: torch.Tensor) -> None:
    """out = a @ b + residual in one GEMM (speedlight's, the residual added to the fp32
    accumulator in its epilogue, one rounding to out's dtype): the fp32-accumulator
    schedule's last chunk, which writes d_weight without a separate cast pass. a [M, K]
    any strides, b [K, N], out [M, N] contiguous, residual [M, N] fp32."""
    m, k = a.shape
    n = b.shape[1]
    check_runtime(a, _matmul_kernel)
    cfg = gemm_config(MATMUL_CONFIGS, m, n, k, a.dtype, a.device, out_dtype=out.dtype,
                      residual=True)
    a_lay, b_lay = tma_layout(a), tma_layout(b)
    tma = (use_tma(a.device) and a_lay is not None and b_lay is not None
           and tma_layout(out) == "row")
    if tma and a.device.type == "cuda":
        ensure_allocator()
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    _matmul_kernel[(programs(tiles, a.device),)](
        a, b, out, out, out, residual, out, m, n, k, a.stride(0), a.stride(1), b.stride(0),
        b.stride(1), out.stride(0), out.stride(1), 0, residual.stride(0), residual.stride(1),
        1.0, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, TMA=tma, A_KMAJOR=a_lay == "row", B_KMAJOR=b_lay == "col",
        HAS_SCALE=False, HAS_BIAS=False, ACTIVATION="none", HAS_RESIDUAL=True,
        STORE_DACT=False, PRECISION=gemm_precision(a.dtype), STORE_AMAX=False, **cfg.options())


# --- the backward's scaling --------------------------------------------------------------

def scale_in_place(x: torch.Tensor, g: torch.Tensor) -> None:
    """x *= g (one value) in place, one kernel that reads g on the device and touches x
    only when g != 1: the forward's gradients times an upstream gradient of exactly 1 (a
    plain loss.backward()) cost one launch, no pass over d_weight, and no host sync."""
    if x.numel() == 0:
        return
    check_runtime(x, _lce_scale_kernel)
    flat = x.view(-1)
    sms = planned_sm_count(x.device)
    blocks = triton.cdiv(flat.numel(), SCALE_BLOCK)
    grid = (max(1, min(blocks, 8 * sms if sms else 2)),)
    _lce_scale_kernel[grid](flat, g.reshape(-1), flat.numel(), BLOCK=SCALE_BLOCK,
                            num_warps=warps_for_tile(SCALE_BLOCK))


# --- the launcher --------------------------------------------------------------------------

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
        chunk_size: int | None = None, memory_budget: int | None = None,
        check_target: bool = True, extras: bool = False):
    """(loss, d_hidden, d_weight, d_bias, extras) over hidden [tokens, H], weight [V, H],
    target [tokens], bias [V] or None, class_weight [V] or None.

    needs_grad: whether to compute (d_hidden, d_weight, d_bias); those not asked are None.
    They are the gradients of the loss or, given grad_loss (the upstream gradient: 0-dim,
    or [tokens] for reduction "none"), of sum(grad_loss * loss).
    autocast_dtype: the dtype of the logits and matmuls under torch.autocast; None outside
    it (then hidden's, which weight and bias share).
    chunk_size, memory_budget: the schedule's (linear_cross_entropy_schedule.plan_schedule).
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
    mm_dtype = autocast_dtype or hidden.dtype
    sched = plan_schedule(n, vocab, h, mm_dtype, weight.dtype, grad_weight=grad_w,
                 memory_budget=memory_budget, chunk_size=chunk_size,
                 weight_copy=weight.dtype != mm_dtype)
    w_mm = weight.to(mm_dtype)  # a copy only under autocast: once per call
    b_mm = bias.to(mm_dtype) if bias is not None else None

    loss_rows = torch.empty(n, dtype=torch.float32, device=dev)
    rows = None  # each token's z-loss term, whether it was right, its argmax
    if extras:
        rows = (torch.empty(n, dtype=torch.float32, device=dev),
                torch.empty(n, dtype=torch.float32, device=dev),
                torch.empty(n, dtype=torch.int64, device=dev))
    divisor = (mean_divisor(target, vocab, ignore_index, class_weight)
               if reduction == "mean" else None)
    any_grad = grad_h or grad_w or grad_b
    scale = _gradient_scale(reduction, divisor, grad_loss, dev) if any_grad else None
    grads = _Gradients(hidden, weight, bias, grad_h, grad_w, grad_b, sched, n)
    vocab_major = sched.kind == "vocab-major" and (grad_w or grad_b)
    stats = torch.empty((3, n), dtype=torch.float32, device=dev) if vocab_major else None
    opts = (ignore_index, "none", label_smoothing, z_loss, softcap)
    token_grad = grad_h or (any_grad and not vocab_major)  # the token pass's gradient
    step = sched.chunk_tokens
    for s in range(0, n, step):
        e = min(s + step, n)
        h_c = hidden[s:e].to(mm_dtype)
        # [c, H] @ [H, V] -> [c, V]
        logits = torch.addmm(b_mm, h_c, w_mm.t()) if b_mm is not None else h_c @ w_mm.t()
        if stats is not None:
            _row_stats(logits, target[s:e], stats[:, s:e], ignore_index, softcap)
        cross_entropy_fwd(
            logits, target[s:e], *opts, weight=class_weight, compute_grad=token_grad,
            check_target=False, grad_out=logits if token_grad else None,
            grad_scale=scale[s:e] if scale is not None and scale.dim() else scale,
            loss_out=loss_rows[s:e], extras=extras,
            extras_out=tuple(r[s:e] for r in rows) if rows else None)
        if token_grad:  # logits now hold their gradient
            grads.add_chunk(logits, h_c, w_mm, s, e, last=e == n, vocab_major=vocab_major)
        del logits, h_c
    if vocab_major:
        _vocab_pass(grads, hidden, w_mm, b_mm, target, stats, class_weight, scale, mm_dtype,
                    ignore_index, label_smoothing, z_loss, softcap)
    del w_mm, b_mm

    if reduction == "none":
        loss = loss_rows
    else:
        total = loss_rows.sum()
        loss = total if reduction == "sum" else divide_or_zero(total, divisor)
    more = (reduce_extras(*rows, target, ignore_index, reduction, divisor, torch.float32)
            if rows else None)
    d_hidden, d_weight, d_bias = grads.results()
    return loss, d_hidden, d_weight, d_bias, more


class _Gradients:
    """The gradients as the chunks (and blocks) add to them, under the schedule."""

    def __init__(self, hidden, weight, bias, grad_h, grad_w, grad_b, sched: Schedule, n):
        dev = hidden.device
        self.sched, self.n = sched, n
        self.d_hidden = torch.empty((n, hidden.shape[1]), dtype=hidden.dtype,
                                    device=dev) if grad_h else None
        self.d_weight = torch.empty(weight.shape, dtype=weight.dtype,
                                    device=dev) if grad_w else None
        self.acc_w = (torch.empty(weight.shape, dtype=torch.float32, device=dev)
                      if grad_w and sched.kind == "fp32-accumulator" else None)
        self.acc_b = torch.empty(bias.shape, dtype=torch.float32, device=dev) if grad_b else None
        self.bias_dtype = bias.dtype if bias is not None else None

    def add_chunk(self, dlogits, h_c, w_mm, s, e, *, last: bool, vocab_major: bool) -> None:
        """The chunk [s, e)'s d_hidden rows, and (token-major) its d_weight, d_bias terms."""
        if self.d_hidden is not None:  # [c, V] @ [V, H] -> [c, H]
            if self.d_hidden.dtype == dlogits.dtype:
                torch.mm(dlogits, w_mm, out=self.d_hidden[s:e])
            else:  # autocast: the logits' dtype, then hidden's, as autograd casts it back
                self.d_hidden[s:e].copy_(dlogits @ w_mm)
        if vocab_major:
            return
        first = s == 0
        if self.d_weight is not None:  # [V, c] @ [c, H] -> [V, H]
            if self.acc_w is None:
                _mm_into(self.d_weight, dlogits.t(), h_c, accumulate=not first)
            elif last and not first:
                _mm_plus_into(self.d_weight, dlogits.t(), h_c, self.acc_w)
            else:
                _mm_into(self.acc_w, dlogits.t(), h_c, accumulate=not first)
                if last:  # (a single chunk never takes the accumulator)
                    self.d_weight.copy_(self.acc_w)
        if self.acc_b is not None:
            part = dlogits.sum(0, dtype=torch.float32)
            if first:
                self.acc_b.copy_(part)
            else:
                self.acc_b += part

    def add_block(self, dlogits, h_mm, v0, v1) -> None:
        """The vocabulary block [v0, v1)'s rows of d_weight and d_bias, over all tokens."""
        if self.d_weight is not None:  # [Vb, n] @ [n, H] -> [Vb, H]
            _mm_into(self.d_weight[v0:v1], dlogits.t(), h_mm, accumulate=False)
        if self.acc_b is not None:
            self.acc_b[v0:v1] = dlogits.sum(0, dtype=torch.float32)

    def results(self):
        d_bias = self.acc_b.to(self.bias_dtype) if self.acc_b is not None else None
        return self.d_hidden, self.d_weight, d_bias


def _row_stats(logits: torch.Tensor, target: torch.Tensor, stats: torch.Tensor,
               ignore_index: int, softcap: float | None) -> None:
    """Each row's (m, log d, p_t - 1) into stats [3, rows] (a column slice of [3, tokens])."""
    rows, n_cols = logits.shape
    if rows == 0:
        return
    check_runtime(logits, _lce_row_stats_kernel)
    gpu = planned_sm_count(logits.device) is not None
    block_m = 1 if gpu else min(16, triton.next_power_of_2(rows))
    block_n = STATS_BLOCK_N if gpu else min(4096, triton.next_power_of_2(n_cols))
    _lce_row_stats_kernel[(triton.cdiv(rows, block_m),)](
        logits, target, stats, rows, n_cols, logits.stride(0), target.stride(0),
        stats.stride(0), int(ignore_index), float(softcap) if softcap is not None else 1.0,
        HAS_SOFTCAP=softcap is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=warps_for_tile(block_m * block_n))


def _vocab_pass(grads: _Gradients, hidden, w_mm, b_mm, target, stats, class_weight, scale,
                mm_dtype, ignore_index, label_smoothing, z_loss, softcap) -> None:
    """Per block of the vocabulary: the block's logits for every token, their gradient in
    place from the token pass's statistics, the block's rows of d_weight and d_bias."""
    n = hidden.shape[0]
    vocab = w_mm.shape[0]
    h_mm = hidden.to(mm_dtype)  # a copy only under autocast with another hidden dtype
    gpu = planned_sm_count(hidden.device) is not None
    has_weight = class_weight is not None
    w = class_weight.contiguous() if has_weight else stats
    w_sum = class_weight.float().sum() if has_weight else stats
    g = scale if scale is not None else stats
    stride_g = scale.stride(0) if scale is not None and scale.dim() else 0
    for v0 in range(0, vocab, grads.sched.vocab_block):
        v1 = min(v0 + grads.sched.vocab_block, vocab)
        w_b = w_mm[v0:v1]
        # [n, H] @ [H, Vb] -> [n, Vb]
        logits = torch.addmm(b_mm[v0:v1], h_mm, w_b.t()) if b_mm is not None else h_mm @ w_b.t()
        check_runtime(logits, _lce_grad_block_kernel)
        block_m, block_n = GRAD_BLOCK if gpu else (min(16, triton.next_power_of_2(n)),
                                                   min(256, triton.next_power_of_2(v1 - v0)))
        grid = (triton.cdiv(n, block_m), triton.cdiv(v1 - v0, block_n))
        _lce_grad_block_kernel[grid](
            logits, target, stats, w, w_sum, g, n, v1 - v0, v0, vocab, logits.stride(0),
            target.stride(0), stats.stride(0), stride_g, int(ignore_index),
            float(label_smoothing), float(z_loss),
            float(softcap) if softcap is not None else 1.0, HAS_SOFTCAP=softcap is not None,
            HAS_WEIGHT=has_weight, GRAD_SCALE=scale is not None, BLOCK_M=block_m,
            BLOCK_N=block_n, num_warps=warps_for_tile(block_m * block_n))
        grads.add_block(logits, h_mm, v0, v1)
        del logits
