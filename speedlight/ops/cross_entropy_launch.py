"""Cross-entropy's launchers (usable without autograd): the forward, which writes each
token's loss and, beside it, its gradient in one pass over the logits, and the backward,
which only scales that gradient. The public function, its registration and SPEC are in
ops/cross_entropy.py; linear_cross_entropy's chunks call these launchers too."""

from __future__ import annotations

import torch
import triton

from speedlight.kernels.cross_entropy import _cross_entropy_bwd_kernel, _cross_entropy_fwd_kernel
from speedlight.kernels.cross_entropy_long import (
    _cross_entropy_fwd_looped_kernel,
    _cross_entropy_split_finish_kernel,
    _cross_entropy_split_stats_kernel,
)
from speedlight.launch import (pipeline_depth, planned_arch, planned_sm_count, row_tile,
                               target_programs, warps_for_tile)
from speedlight.runtime import check_runtime

# Rows up to this many columns are held in registers (logits read once); longer rows take
# the two-pass kernels, in chunks of LOOP_BLOCK_N. The interpreter takes the same paths
# for the same shapes, so CPU tests exercise what the GPU runs.
MAX_FUSED_N = 8192
LOOP_BLOCK_N = 4096
SPLIT_SPAN = 16384  # columns per program when few long rows are split across programs
SCALE_BLOCK_N = 4096  # the backward's longest column block on a GPU
# The fused forward is persistent: FWD_WARPS_PER_SM resident warps per SM (at a vocabulary
# of 8192, two programs of 16 warps for a plain row, 16 logits a lane, one of 32 with a
# softcap, class weights or extras, 8 a lane; at most 64 registers), each program's tile
# loop pipelined (launch.pipeline_depth: up to 3 tiles of logits loading while one is
# reduced).
FWD_WARPS_PER_SM = 32


def _rows_layout(t: torch.Tensor, seq: int | None = None
                 ) -> tuple[int, tuple[int, int, int]] | None:
    """(seq, (stride_b, stride_s, stride_v)) that address t's rows as [batch, seq] without a
    copy (with the given seq, so that two tensors share one row numbering), or None when
    t's leading dims cannot be read that way."""
    n_cols = t.shape[-1]
    if seq is not None:
        try:
            return seq, tuple(t.view(-1, seq, n_cols).stride())
        except RuntimeError:
            return None
    try:
        flat = t.view(-1, n_cols)
        return max(flat.shape[0], 1), (0, flat.stride(0), flat.stride(1))
    except RuntimeError:
        pass
    if t.dim() >= 3:
        try:
            bsv = t.view(-1, t.shape[-2], n_cols)
            return bsv.shape[1], tuple(bsv.stride())
        except RuntimeError:
            pass
    return None


def check_targets(target: torch.Tensor, n_cols: int, ignore_index: int) -> None:
    """ValueError if a target is neither ignore_index nor in [0, n_cols). One reduction over
    the targets, and on CUDA one host sync to read its result."""
    flat = target.reshape(-1)
    bad = (flat != ignore_index) & ((flat < 0) | (flat >= n_cols))
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0, 0])
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), target.shape))
    raise ValueError(
        f"target holds {int(bad.sum())} class index(es) outside [0, {n_cols}) (the vocab of "
        f"logits) that are not ignore_index={ignore_index}; the first is target{list(where)} "
        f"= {int(flat[first])}")


def _fwd_plan(n_rows: int, n_cols: int, device: torch.device, extras: bool = False,
              lean: bool = True) -> dict:
    """How the forward covers the rows: the fused kernel's tile (one_block), or the looped
    kernel's, or the split pair's spans. lean: no softcap, class weights or extras."""
    if n_cols <= MAX_FUSED_N:
        block_m, block_n, num_warps = row_tile(n_cols, device, max_block_n=MAX_FUSED_N)
        if planned_sm_count(device) and not (lean and block_m == 1):
            # 8 logits a thread, not row_tile's 16 (kept for one plain row per tile): a
            # softcap's tanh and derivative, class weights or the argmax's logits stay live
            # beside each logit's exp, and a tile of several rows keeps each row's scalars
            num_warps = min(32, 2 * num_warps)
        return dict(block_m=block_m, block_n=block_n, one_block=True, num_warps=num_warps,
                    n_splits=1)
    block_n = LOOP_BLOCK_N
    sms = planned_sm_count(device)
    # the split pair tracks no argmax: with extras, few long rows take the looped kernel
    if sms:
        n_splits = 1 if n_rows >= sms or extras else min(triton.cdiv(n_cols, SPLIT_SPAN),
                                                         triton.cdiv(2 * sms, n_rows))
        block_m, num_warps = 1, warps_for_tile(block_n)
    else:  # split a lone row, so that the interpreter runs the split kernels too
        n_splits = 1 if n_rows >= 2 or extras else min(4, triton.cdiv(n_cols, SPLIT_SPAN))
        block_m, num_warps = min(4, triton.next_power_of_2(n_rows)), 4
    return dict(block_m=block_m, block_n=block_n, one_block=False, num_warps=num_warps,
                n_splits=max(1, n_splits))


def mean_divisor(t: torch.Tensor, n_cols: int, ignore_index: int,
                  weight: torch.Tensor | None) -> torch.Tensor:
    """What a mean divides by: the number of non-ignored tokens (int64), or with class
    weights the sum of their targets' weights (fp32), as torch divides. 0-dim, no sync."""
    valid = t != ignore_index
    if weight is None:
        return valid.sum()
    idx = torch.where(valid & (t >= 0) & (t < n_cols), t, 0).long()
    return torch.where(valid, weight.float()[idx], 0.0).sum()


def divide_or_zero(total: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """total / divisor in fp32; 0 where divisor is 0 (a mean over nothing counted)."""
    return torch.where(divisor != 0, total.float() / divisor, 0.0)


def cross_entropy_fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0,
                      z_loss: float = 0.0, softcap: float | None = None, *,
                      weight: torch.Tensor | None = None, compute_grad: bool = True,
                      check_target: bool = True, grad_out: torch.Tensor | None = None,
                      extras: bool = False, grad_scale: torch.Tensor | None = None,
                      loss_out: torch.Tensor | None = None,
                      extras_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None,
                                 tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """(loss, dlogits, divisor, extras): the loss (logits' dtype; shape () or target's shape
    for "none"), each token's dloss_i/dlogits_i (None unless compute_grad; a new contiguous
    tensor, or `grad_out`: pass logits to overwrite them), for a mean the divisor of the
    sum (the number of non-ignored tokens, int64, or the sum of their class weights, fp32;
    0-dim), by which the backward divides grad_output, and with extras=True (z_loss,
    token_accuracy, predicted_tokens) reduced as cross_entropy documents.
    weight: class weights [vocab] (any float dtype; read in fp32).
    grad_scale: what the gradient is multiplied by in the kernel, before its rounding to
    the logits' dtype: a 0-dim tensor, or one value per token ([tokens], any stride): a
    chunked loss's upstream gradient, a mean's 1 / divisor folded in. loss_out: an fp32
    [tokens] buffer each token's loss is written to (reduction "none" only; it is then the
    returned loss); extras_out: (z, correct, predicted) [tokens] buffers (fp32, fp32,
    int64) the extras are written to the same way (with extras=True and reduction "none";
    returned as they are).
    check_target: ValueError on a target neither in [0, vocab) nor ignore_index (on CUDA,
    a host sync); unchecked, such a row gets a NaN loss and a NaN gradient row.
    """
    n_cols = logits.shape[-1]
    n_rows = target.numel()
    if check_target and n_rows:
        check_targets(target, n_cols, ignore_index)
    if grad_out is None and compute_grad:
        grad_out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    t = target.reshape(-1)
    divisor = mean_divisor(t, n_cols, ignore_index, weight) if reduction == "mean" else None
    if n_rows == 0:
        loss = (logits.new_empty(target.shape) if reduction == "none"
                else logits.new_zeros(()))
        more = None
        if extras:
            z = loss.clone()
            acc = (torch.empty(target.shape, device=logits.device) if reduction == "none"
                   else torch.zeros((), device=logits.device))
            more = (z, acc, torch.empty(target.shape, dtype=torch.int64, device=logits.device))
        return loss, grad_out, divisor, more
    check_runtime(logits, _cross_entropy_fwd_kernel)

    x, x_layout = logits, _rows_layout(logits)
    if x_layout is None:  # leading dims no [batch, seq] view can express: copy the rows
        x = logits.reshape(-1, n_cols).contiguous()
        x_layout = _rows_layout(x)
    seq = x_layout[0]
    dx = grad_out
    if compute_grad:
        dx_layout = _rows_layout(grad_out, seq)
        if dx_layout is None:  # an in-place target that no view expresses: write, then copy
            dx = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device)
            dx_layout = _rows_layout(dx, seq)
    else:
        dx, dx_layout = x, x_layout  # never written: COMPUTE_GRAD=False
    (sxb, sxs, sxv), (sdb, sds, sdv) = x_layout[1], dx_layout[1]

    if loss_out is not None:
        loss = loss_rows = loss_out
    elif reduction == "none":
        loss = torch.empty(target.shape, dtype=logits.dtype, device=logits.device)
        loss_rows = loss.view(-1)
    else:
        loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    has_weight = weight is not None
    w = weight.contiguous() if has_weight else loss_rows  # never read without weights
    w_sum = weight.float().sum() if has_weight else loss_rows
    if extras_out is not None:
        z_rows, correct, pred = extra_ptrs = extras_out
    elif extras:
        z_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        correct = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        pred = torch.empty(target.shape, dtype=torch.int64, device=logits.device)
        extra_ptrs = (z_rows, correct, pred.view(-1))
    else:
        extra_ptrs = (loss_rows, loss_rows, loss_rows)  # never written with EXTRAS=False
    has_softcap = softcap is not None
    scalars = (int(ignore_index), float(label_smoothing), float(z_loss),
               float(softcap) if has_softcap else 1.0)
    flags = dict(HAS_SOFTCAP=has_softcap, HAS_WEIGHT=has_weight, COMPUTE_GRAD=compute_grad,
                 GRAD_SCALE=grad_scale is not None)
    g_scale = grad_scale if grad_scale is not None else loss_rows  # unread without GRAD_SCALE
    stride_gs = g_scale.stride(0) if g_scale.dim() else 0
    plan = _fwd_plan(n_rows, n_cols, logits.device, extras,
                     lean=not (has_softcap or has_weight or extras))

    if plan["n_splits"] == 1:
        tiles = triton.cdiv(n_rows, plan["block_m"])
        args = (x, t, loss_rows, dx, w, w_sum, *extra_ptrs, g_scale, n_rows, n_cols, seq,
                sxb, sxs, sxv, t.stride(0), sdb, sds, sdv, stride_gs, *scalars)
        sizes = dict(EXTRAS=extras, BLOCK_M=plan["block_m"], BLOCK_N=plan["block_n"],
                     num_warps=plan["num_warps"])
        if plan["one_block"]:
            per_sm = max(1, FWD_WARPS_PER_SM // plan["num_warps"])
            stages = pipeline_depth(plan["block_m"] * plan["block_n"] * logits.element_size(),
                                    per_sm, logits.device)
            grid = (min(tiles, target_programs(logits.device, per_sm=per_sm)),)
            # the registers FWD_WARPS_PER_SM resident warps leave a thread (64): ptxas
            # would otherwise take more (sm_90a: 70 for a plain row of 4096, 89 with a
            # softcap), and fewer programs would be resident
            regs = dict(maxnreg=65536 // (32 * FWD_WARPS_PER_SM)) if planned_arch(
                logits.device) else {}
            _cross_entropy_fwd_kernel[grid](
                *args, **flags, **sizes, SMOOTHING=label_smoothing > 0, BATCHED=seq < n_rows,
                EVEN_N=n_cols == plan["block_n"], STAGES=stages, **regs)
        else:
            _cross_entropy_fwd_looped_kernel[(tiles,)](*args, **flags, **sizes)
    else:
        block_n = plan["block_n"]
        span = triton.cdiv(triton.cdiv(n_cols, plan["n_splits"]), block_n) * block_n
        n_splits = triton.cdiv(n_cols, span)
        stats = torch.empty((5, n_rows, n_splits), dtype=torch.float32, device=logits.device)
        _cross_entropy_split_stats_kernel[(n_rows, n_splits)](
            x, t, w, stats, n_cols, seq, span, n_splits, sxb, sxs, sxv, t.stride(0),
            scalars[0], scalars[3], HAS_SOFTCAP=has_softcap, HAS_WEIGHT=has_weight,
            BLOCK_N=block_n, num_warps=plan["num_warps"])
        _cross_entropy_split_finish_kernel[(n_rows, n_splits if compute_grad else 1)](
            x, t, loss_rows, dx, w, w_sum, stats, g_scale, n_cols, seq, span, n_splits,
            sxb, sxs, sxv, t.stride(0), sdb, sds, sdv, stride_gs, *scalars, **flags,
            BLOCK_N=block_n, BLOCK_S=triton.next_power_of_2(n_splits),
            num_warps=plan["num_warps"])

    if compute_grad and dx is not grad_out:
        grad_out.copy_(dx.view(grad_out.shape))
    if reduction == "sum":
        loss = loss_rows.sum().to(logits.dtype)
    elif reduction == "mean":
        loss = divide_or_zero(loss_rows.sum(), divisor).to(logits.dtype)
    more = None
    if extras_out is not None:
        more = extras_out
    elif extras:
        more = reduce_extras(z_rows, correct, pred, target, ignore_index, reduction, divisor,
                             logits.dtype)
    return loss, grad_out, divisor, more


def reduce_extras(z_rows: torch.Tensor, correct: torch.Tensor, pred: torch.Tensor,
                  target: torch.Tensor, ignore_index: int, reduction: str,
                  divisor: torch.Tensor | None, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(z_loss, token_accuracy, predicted_tokens) from each token's z-loss term, whether
    it was right (fp32 [tokens]) and its argmax, reduced as cross_entropy documents: the
    z-loss as the loss (in `dtype`), the accuracy a mean over the non-ignored tokens
    (reduction "none": per token), the predicted tokens in target's shape."""
    pred = pred.view(target.shape)
    if reduction == "none":
        return z_rows.view(target.shape).to(dtype), correct.view(target.shape), pred
    z = z_rows.sum()
    z = (divide_or_zero(z, divisor) if reduction == "mean" else z).to(dtype)
    return z, divide_or_zero(correct.sum(), (target != ignore_index).sum()), pred


def row_grad_scale(grad_loss: torch.Tensor, divisor: torch.Tensor | None) -> torch.Tensor:
    """The upstream gradient of each token's loss: grad_loss, over the mean's divisor (in
    fp32, one rounding; 0 when the divisor is 0) for a mean."""
    if divisor is None or divisor.numel() == 0:
        return grad_loss
    return divide_or_zero(grad_loss, divisor)


def cross_entropy_bwd(dlogits: torch.Tensor, grad_output: torch.Tensor, *,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """dlogits * grad_output (one scalar, or one value per token shaped like the targets)
    in dlogits' dtype; written to `out` when given (dlogits itself scales in place)."""
    n_cols = dlogits.shape[-1]
    if out is None:
        out = torch.empty(dlogits.shape, dtype=dlogits.dtype, device=dlogits.device)
    if dlogits.numel() == 0:
        return out
    check_runtime(dlogits, _cross_entropy_bwd_kernel)
    n_rows = dlogits.numel() // n_cols
    d_layout = _rows_layout(dlogits)
    o_layout = _rows_layout(out, d_layout[0]) if d_layout is not None else None
    if o_layout is None:  # in place on a layout no view expresses: compute, then copy
        scaled = cross_entropy_bwd(dlogits.reshape(-1, n_cols).contiguous(), grad_output)
        return out.copy_(scaled.view(out.shape))
    (seq, d_strides), o_strides = d_layout, o_layout[1]
    g = grad_output.reshape(-1)
    stride_g = 0 if g.numel() == 1 else g.stride(0)
    # an elementwise scale: row_tile's tile, a row longer than max_n cut into column blocks
    max_n = SCALE_BLOCK_N if planned_sm_count(dlogits.device) else 65536
    block_m, block_n, _ = row_tile(min(n_cols, max_n), dlogits.device, max_block_n=max_n)
    block_m = min(block_m, triton.next_power_of_2(n_rows))
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
    _cross_entropy_bwd_kernel[grid](
        dlogits, g, out, n_rows, n_cols, seq, *d_strides, stride_g, *o_strides,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps_for_tile(block_m * block_n))
    return out
