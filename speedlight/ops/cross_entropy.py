"""Cross-entropy over logits [..., vocab] with integer targets [...]: the loss and its
gradient in one pass over the logits (the backward only scales that gradient), with
torch's reductions, ignore_index and label smoothing, plus z-loss and logit soft-capping.
fp32 arithmetic whatever the logits dtype; the loss has the logits' dtype, as in torch.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional

import torch
import triton

from speedlight import shapes
from speedlight.kernels.cross_entropy import (
    _cross_entropy_bwd_kernel,
    _cross_entropy_fwd_kernel,
    _cross_entropy_fwd_looped_kernel,
    _cross_entropy_split_finish_kernel,
    _cross_entropy_split_stats_kernel,
)
from speedlight.launch import planned_sm_count, row_tile, warps_for_tile
from speedlight.ops._checks import check_bool, check_dense, check_choice, check_same_device, check_tensor
from speedlight.ops._dtensor import local_reduction_refused, local_rows
from speedlight.ops._suites import is_call_of, rows_case
from speedlight.ops.registration import like, register_op
from speedlight.runtime import check_runtime, describe
from speedlight.spec import (Case, Cost, KernelDesign, OpSpec, generator, inject_nonfinite,
                             rand_tensor)

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)

# Rows up to this many columns are held in registers (logits read once); longer rows take
# the two-pass kernels, in chunks of LOOP_BLOCK_N. The interpreter takes the same paths
# for the same shapes, so CPU tests exercise what the GPU runs.
MAX_FUSED_N = 8192
LOOP_BLOCK_N = 4096
SPLIT_SPAN = 16384  # columns per program when few long rows are split across programs
SCALE_BLOCK_N = 4096  # the backward's longest column block on a GPU


# --- launchers (usable without autograd) --------------------------------------------------

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


def _check_targets(target: torch.Tensor, n_cols: int, ignore_index: int) -> None:
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


class CrossEntropyOutput(NamedTuple):
    """What cross_entropy returns when any of return_z_loss, return_token_accuracy,
    return_predicted_tokens is asked for; the fields not asked for are None."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


def _fwd_plan(n_rows: int, n_cols: int, device: torch.device, extras: bool = False) -> dict:
    if n_cols <= MAX_FUSED_N:
        block_m, block_n, num_warps = row_tile(n_cols, device, max_block_n=MAX_FUSED_N)
        if planned_sm_count(device):
            # 8 logits a thread, not row_tile's 16: they stay live to the gradient in fp32,
            # with their exp (and a softcap's tanh and derivative)
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


def _mean_divisor(t: torch.Tensor, n_cols: int, ignore_index: int,
                  weight: torch.Tensor | None) -> torch.Tensor:
    """What a mean divides by: the number of non-ignored tokens (int64), or with class
    weights the sum of their targets' weights (fp32), as torch divides. 0-dim, no sync."""
    valid = t != ignore_index
    if weight is None:
        return valid.sum()
    idx = torch.where(valid & (t >= 0) & (t < n_cols), t, 0).long()
    return torch.where(valid, weight.float()[idx], 0.0).sum()


def _divide(total: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
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
        _check_targets(target, n_cols, ignore_index)
    if grad_out is None and compute_grad:
        grad_out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    t = target.reshape(-1)
    divisor = _mean_divisor(t, n_cols, ignore_index, weight) if reduction == "mean" else None
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
    plan = _fwd_plan(n_rows, n_cols, logits.device, extras)

    if plan["n_splits"] == 1:
        grid = (triton.cdiv(n_rows, plan["block_m"]),)
        kernel = (_cross_entropy_fwd_kernel if plan["one_block"]
                  else _cross_entropy_fwd_looped_kernel)
        kernel[grid](
            x, t, loss_rows, dx, w, w_sum, *extra_ptrs, g_scale, n_rows, n_cols, seq,
            sxb, sxs, sxv, t.stride(0), sdb, sds, sdv, stride_gs, *scalars, **flags,
            EXTRAS=extras, BLOCK_M=plan["block_m"], BLOCK_N=plan["block_n"],
            num_warps=plan["num_warps"])
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
        loss = _divide(loss_rows.sum(), divisor).to(logits.dtype)
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
    z = (_divide(z, divisor) if reduction == "mean" else z).to(dtype)
    return z, _divide(correct.sum(), (target != ignore_index).sum()), pred


def _row_grad_scale(grad_loss: torch.Tensor, divisor: torch.Tensor | None) -> torch.Tensor:
    """The upstream gradient of each token's loss: grad_loss, over the mean's divisor (in
    fp32, one rounding; 0 when the divisor is 0) for a mean."""
    if divisor is None or divisor.numel() == 0:
        return grad_loss
    return _divide(grad_loss, divisor)


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


# --- registration: custom ops, fakes and autograd -----------------------------------------
# The forward of training writes the loss and dlogits; the backward only scales dlogits by
# the upstream gradient. Without a gradient wanted, the inference op writes the loss alone.
# The extras (z_loss, token_accuracy, predicted_tokens) are None (an empty placeholder in
# the custom op) unless asked for.

def _train_fwd(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
               ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
               softcap: Optional[float], check_target: bool, extras: bool):
    loss, dlogits, divisor, more = cross_entropy_fwd(
        logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap,
        weight=weight, check_target=check_target, extras=extras)
    return (loss, dlogits, divisor, *(more or (None, None, None)))


def _infer_fwd(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
               ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
               softcap: Optional[float], check_target: bool, extras: bool):
    loss, _, _, more = cross_entropy_fwd(
        logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap,
        weight=weight, compute_grad=False, check_target=check_target, extras=extras)
    return (loss, *(more or (None, None, None)))


def _scaled_bwd(dloss: torch.Tensor, dlogits: torch.Tensor,
                divisor: torch.Tensor) -> torch.Tensor:
    return cross_entropy_bwd(dlogits, _row_grad_scale(dloss, divisor))


def _loss_fake(logits, target, reduction):
    return logits.new_empty(target.shape if reduction == "none" else ())


def _divisor_fake(target, reduction, weight):
    if reduction != "mean":
        return None
    return target.new_empty((), dtype=torch.int64 if weight is None else torch.float32)


def _extras_fake(logits, target, reduction, extras):
    if not extras:
        return None, None, None
    per_token = target.shape if reduction == "none" else ()
    return (logits.new_empty(per_token), logits.new_empty(per_token, dtype=torch.float32),
            target.new_empty(target.shape, dtype=torch.int64))


CROSS_ENTROPY = register_op(
    "cross_entropy",
    forward=_train_fwd,
    inference=_infer_fwd,
    outputs=("loss", "dlogits", "divisor", "z_loss", "token_accuracy", "predicted_tokens"),
    stats=("dlogits", "divisor"),
    fake=lambda logits, target, weight, ignore_index, reduction, *rest: (
        _loss_fake(logits, target, reduction), like(logits),
        _divisor_fake(target, reduction, weight),
        *_extras_fake(logits, target, reduction, rest[-1])),
    backward=_scaled_bwd,
    backward_fake=lambda dloss, dlogits, divisor: like(dlogits),
    grads=("logits",),
    optional_grads=True,  # the extras receive no gradient
)


# The in-place gradient: the forward overwrites logits with dlogits, the backward scales
# them in place (mutation declared to torch). The mutating op bumps logits' version
# counter: autograd then refuses (at backward) any other op that saved logits.

def _inplace_fwd(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
                 ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                 softcap: Optional[float], check_target: bool, extras: bool):
    loss, _, divisor, more = cross_entropy_fwd(
        logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap,
        weight=weight, check_target=check_target, grad_out=logits, extras=extras)
    return (loss, divisor, *(more or (None, None, None)))


def _inplace_bwd(dloss: torch.Tensor, logits: torch.Tensor, divisor: torch.Tensor) -> None:
    cross_entropy_bwd(logits, _row_grad_scale(dloss, divisor), out=logits)


CROSS_ENTROPY_INPLACE = register_op(
    "cross_entropy_inplace",
    forward=_inplace_fwd,
    mutates=("logits",),
    outputs=("loss", "divisor", "z_loss", "token_accuracy", "predicted_tokens"),
    stats=("divisor",),
    fake=lambda logits, target, weight, ignore_index, reduction, *rest: (
        _loss_fake(logits, target, reduction), _divisor_fake(target, reduction, weight),
        *_extras_fake(logits, target, reduction, rest[-1])),
    backward=_inplace_bwd,
    backward_mutates=("logits",),
    grads=("logits",),
    optional_grads=True,
)


# --- public function ---------------------------------------------------------------------

def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_options(ignore_index, reduction, label_smoothing, z_loss, softcap) -> None:
    """The checks on cross_entropy's plain arguments (shared with nn.CrossEntropyLoss)."""
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"ignore_index must fit int64 (the targets' dtype), got {ignore_index}")
    check_choice("reduction", reduction, REDUCTIONS)
    if not _is_number(label_smoothing) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not _is_number(z_loss) or not 0.0 <= z_loss < float("inf"):
        raise ValueError(f"z_loss must be a finite number >= 0, got {z_loss!r}")
    if softcap is not None and (not _is_number(softcap) or not 0.0 < softcap < float("inf")):
        raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")


@local_rows("logits", "target", refuse=local_reduction_refused)
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: float | None = None, *, weight: torch.Tensor | None = None,
                  inplace_backward: bool = False, check_target: bool = True,
                  return_z_loss: bool = False, return_token_accuracy: bool = False,
                  return_predicted_tokens: bool = False
                  ) -> torch.Tensor | CrossEntropyOutput:
    """Cross-entropy of logits [..., vocab] against class indices target [...].

    Per token with target t (c = softcap * tanh(logits / softcap) with a softcap, else the
    logits; lse = logsumexp(c); eps = label_smoothing; V = vocab):
        loss = (1 - eps) * (lse - c[t]) + eps * (lse - mean(c)) + z_loss * lse^2
    the first two terms being torch.nn.functional.cross_entropy with label_smoothing=eps;
    z_loss adds z_loss * lse^2 per non-ignored token (PaLM's z-loss; it enters the mean
    like the rest). A token whose target is ignore_index adds 0. reduction: "mean" (over
    non-ignored tokens), "sum", or "none" (target's shape). Unlike torch's NaN, a mean over
    no non-ignored token (all ignored, or no tokens) is 0, with an all-zero gradient.

    weight: per-class weights [vocab] (any float dtype, read in fp32), with torch's
    semantics: per token
        loss = w[t] * ((1 - eps) * (lse - c[t]) + z_loss * lse^2)
               + eps / V * sum_j w[j] * (lse - c[j])
    (torch's weighted, smoothed loss; the z-loss term is weighted like the target's own
    term), and a mean divides the sum by the sum of w[t] over non-ignored tokens. A mean
    whose counted weights sum to 0 is 0 (torch: NaN or inf), with a zero gradient.

    return_z_loss / return_token_accuracy / return_predicted_tokens: computed in the same
    kernel pass; any of them makes the result a CrossEntropyOutput(loss, z_loss,
    token_accuracy, predicted_tokens) named tuple (None for the parts not asked). z_loss:
    the loss's z-loss term, reduced as the loss is (so loss - z_loss is the cross-entropy),
    in logits' dtype, for logging (not differentiable: its gradient flows through loss).
    token_accuracy (fp32): for reduction "none" 1.0 where a token's argmax is its target
    and 0.0 elsewhere (0 for ignored tokens); otherwise the fraction of non-ignored tokens
    whose argmax is their target (unweighted; 0 when none). predicted_tokens: the argmax
    of every token's logits (ignored tokens too), int64, target's shape; ties go to the
    first index and a NaN counts as the largest, as torch.argmax(logits, -1).

    The vocab is the LAST dim (torch's F.cross_entropy takes it at dim 1 for > 2-D input;
    speedlight.nn.CrossEntropyLoss follows torch there). logits: float32/float16/bfloat16,
    any strides (a [batch, seq, vocab] view such as logits[:, :-1] is read in place);
    target: an integer tensor, logits' shape without its last dim. Arithmetic is fp32;
    the loss has logits' dtype. Differentiable in logits; torch.compile(fullgraph=True)
    traces it.

    The gradient is computed in the forward, beside the loss, when logits require grad;
    without one (torch.no_grad, eval) the forward only reads logits and writes the loss.
    inplace_backward=True writes that gradient over the logits: after the call, `logits`
    HOLDS dloss/dlogits, not the logits, which saves a [tokens, vocab] buffer. It is
    refused for a leaf logits, and autograd refuses it (at backward) where another op
    saved logits for its own backward; any use of the overwritten logits outside autograd
    (argmax, logging) is the caller's to avoid. Under torch.compile the compiler decides
    whether the buffer is reused.

    check_target: a target neither in [0, vocab) nor ignore_index raises ValueError. CPU
    tensors are always checked (one pass over the targets). On CUDA the check costs a
    small reduction and one host sync, which stalls the CPU until the GPU catches up and
    is illegal in CUDA-graph capture (torch.compile's mode="reduce-overhead"): pass
    check_target=False there. Unchecked, such a token is never used as an address: its
    loss is NaN (so is a mean or sum over it) and so is its gradient row.
    """
    check_tensor("logits", logits, min_dim=1)
    check_dense("target", target)
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be an integer tensor of class indices (int64, int32, "
                        f"int16, int8 or uint8), got {describe(target)}; probability "
                        f"(soft) targets are not supported")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"target must have shape {tuple(logits.shape[:-1])} (logits' shape "
                         f"without its last, vocab, dim), got {describe(target)} for logits "
                         f"of shape {tuple(logits.shape)}")
    check_same_device(logits=logits, target=target)
    check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    for name, flag in (("inplace_backward", inplace_backward), ("check_target", check_target),
                       ("return_z_loss", return_z_loss),
                       ("return_token_accuracy", return_token_accuracy),
                       ("return_predicted_tokens", return_predicted_tokens)):
        check_bool(name, flag)
    if logits.shape[-1] == 0 and target.numel():
        raise ValueError(f"logits must have at least one class in its last dim, got "
                         f"{describe(logits)}")
    check_class_weight(weight, logits.shape[-1], logits.device)
    softcap = float(softcap) if softcap is not None else None
    args = (int(ignore_index), reduction, float(label_smoothing), float(z_loss), softcap)
    check = bool(check_target) or logits.device.type == "cpu"
    asked = (bool(return_z_loss), bool(return_token_accuracy), bool(return_predicted_tokens))
    extras = any(asked)
    want_grad = torch.is_grad_enabled() and logits.requires_grad
    if inplace_backward and want_grad:
        if logits.is_leaf:
            raise ValueError(
                "inplace_backward=True overwrites logits with their gradient, but logits is a "
                "leaf tensor that requires grad (autograd forbids writing over it); pass the "
                "output of the op that made the logits, or inplace_backward=False")
        loss, *more = CROSS_ENTROPY_INPLACE(logits, target, weight, *args, check, extras)
    else:
        loss, *more = CROSS_ENTROPY(logits, target, weight, *args, check, extras)
    if not extras:
        return loss
    # logged values: their gradient flows through loss, not through them
    return CrossEntropyOutput(loss, *(m.detach() if a else None for m, a in zip(more, asked)))


def check_class_weight(weight, n_classes: int, device: torch.device,
                       name: str = "weight") -> None:
    """TypeError/ValueError unless weight (the argument `name`) is None or a float tensor
    [n_classes] on `device`."""
    if weight is None:
        return
    if isinstance(weight, torch.Tensor):
        check_dense(name, weight)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        got = describe(weight) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise TypeError(f"{name} must be None or a floating-point tensor of class weights, "
                        f"got {got}")
    if tuple(weight.shape) != (n_classes,):
        raise ValueError(f"{name} must have shape ({n_classes},) (one weight per class), got "
                         f"{describe(weight)}")
    if weight.device != device:
        raise ValueError(f"{name} is on {weight.device} but the logits are on {device}: all "
                         f"tensors must be on one device")


# --- OpSpec --------------------------------------------------------------------------------

def _make_inputs(case: Case, device) -> dict:
    tokens, vocab = case["tokens"], case["vocab"]
    softcap = case.flag("softcap")
    # logits a few units wide, as a trained LM's are; wider before a softcap so that the
    # cap bends them (Gemma 2 caps at 30)
    scale = 15.0 if softcap else 2.0
    if case.flag("shifted"):  # Hugging Face's shift: logits[:, :-1] of [batch, seq + 1, vocab]
        full = rand_tensor((2, tokens // 2 + 1, vocab), case, device, scale=scale)
        logits = full[:, :-1]
    else:
        logits = rand_tensor((tokens, vocab), case, device, scale=scale)
    if case.flag("nonfinite"):
        inject_nonfinite(logits, case)
    g = generator(case, salt=2)
    target = torch.randint(0, max(vocab, 1), tuple(logits.shape[:-1]), generator=g)
    ignore = case.flag("ignore")
    if ignore == "all":
        target.fill_(-100)
    elif ignore == "some":
        target[torch.rand(target.shape, generator=g) < 0.3] = -100
    weight = None
    if case.flag("weight"):  # class weights in [0, 2), a few classes weighed 0
        weight = rand_tensor((vocab,), case.with_(layout="contiguous"), device,
                             dist="uniform", scale=2.0, salt=3)
        weight[::7] = 0.0
    extras = bool(case.flag("extras"))
    return {"logits": logits, "target": target.to(device), "ignore_index": -100,
            "reduction": case.flag("reduction", "mean"),
            "label_smoothing": float(case.flag("smoothing", 0.0)),
            "z_loss": float(case.flag("zloss", 0.0)), "softcap": softcap, "weight": weight,
            "return_z_loss": extras, "return_token_accuracy": extras,
            "return_predicted_tokens": extras}


def _cost(case: Case, mode: str) -> Cost:
    tokens, vocab, e = case["tokens"], case["vocab"], case.dtype.itemsize
    elems = tokens * vocab
    loss_bytes = tokens * e if case.flag("reduction") == "none" else e
    if mode == "fwd" and case.flag("weight"):
        loss_bytes += vocab * e  # read the class weights
    if mode == "fwd" and case.flag("extras"):  # write z, correct (fp32), argmax (int64)
        loss_bytes += tokens * 16
    if mode == "fwd":
        # read logits, target (int64); write loss and dlogits. The forward of training
        # produces the gradient (the backward only scales it), so dlogits is this pass's
        # output and is counted here, once; without a gradient (no_grad) the kernel skips
        # that write. FLOP/elem: max, subtract, exp, add (logsumexp) + subtract, exp, fma
        # (gradient); + add for the label-smoothing sum; + divide, exp, divide and the
        # 9-term polynomial's ~18 for tanh, and the multiply by its derivative, for a softcap.
        per_elem = 7 + (1 if case.flag("smoothing") else 0) + (22 if case.flag("softcap") else 0)
        return Cost(flops=per_elem * elems, bytes=2 * elems * e + 8 * tokens + loss_bytes)
    # read dlogits, grad_output; write grad. One multiply per element.
    return Cost(flops=elems, bytes=2 * elems * e + loss_bytes)


def _cases(suite: str) -> list[Case]:
    def case(tokens, vocab, layout="contiguous", model=None, **flags):
        return Case("cross_entropy", (("tokens", tokens), ("vocab", vocab)), layout=layout,
                    flags=flags, model=model)

    out = []
    for tokens, vocab, model in shapes.rows_and_width(suite, "vocab"):
        cfg = shapes.MODELS.get(model) if model else None
        flags = {"softcap": cfg.logit_softcap} if cfg is not None and cfg.logit_softcap else {}
        out.append(case(tokens, vocab, model=model, **flags))
    if suite == "quick":
        out += [case(3, 131101),  # the looped kernel, vocab > 65536
                # more rows than an H100's 132 SMs: the looped kernel at a GPU's sizing,
                # small enough for inspect's bytes guard to run in full
                case(136, 12288),
                case(37, 128, ignore="some"), case(6, 1000, ignore="all"),
                case(37, 128, smoothing=0.1), case(5, 781, zloss=0.01),
                case(37, 128, softcap=30.0), case(1, 70001, softcap=30.0),
                case(5, 781, reduction="sum"), case(37, 128, reduction="none"),
                case(1, 70001, reduction="none"), case(6, 1000, ignore="all", reduction="none"),
                case(37, 128, "strided"), case(5, 781, "transposed"), case(8, 1000, shifted=True),
                case(6, 1000, nonfinite=True), case(6, 1000, nonfinite=True, softcap=30.0),
                case(5, 781, ignore="some", smoothing=0.1, zloss=0.01, softcap=30.0),
                case(37, 128, weight=True, ignore="some"),
                case(37, 128, weight=True, smoothing=0.1, reduction="sum"),
                case(5, 781, weight=True, smoothing=0.1, zloss=0.01, reduction="none"),
                case(1, 70001, weight=True, smoothing=0.1, ignore="some"),
                case(37, 128, extras=True, ignore="some"),
                case(5, 781, extras=True, weight=True, zloss=0.01, reduction="none"),
                case(3, 70001, extras=True, zloss=0.01, softcap=30.0),
                case(6, 1000, extras=True, nonfinite=True),
                case(0, 128)]
    if suite == "model":
        out += [case(4096, vocab, model=model, ignore="some", zloss=1e-4)
                for vocab, model in shapes.model_values("vocab")]
    if suite == "full":
        out += [case(257, 1021, "strided"), case(3, 100003, "transposed"),
                case(257, 1021, nonfinite=True), case(1031, 4093, ignore="some"),
                case(257, 65537, smoothing=0.1, zloss=1e-4, softcap=30.0),
                case(1024, 32000, shifted=True, ignore="some", reduction="none"),
                case(1, 262144, softcap=30.0), case(2, 262147, reduction="sum"), case(0, 4096),
                case(257, 32000, weight=True, smoothing=0.1, zloss=1e-4, ignore="some"),
                case(257, 65537, extras=True, weight=True, softcap=30.0, reduction="none"),
                # tokens x vocab > 2^31 (Qwen's vocab at 16K tokens): 64-bit offsets
                case(16384, 152064, huge=True)]
    return out


def _skip(case: Case, device) -> str | None:
    if case.flag("huge") and torch.device(device).type != "cuda":
        return ("64-bit indexing case: tokens x vocab > 2^31 needs > 4 GiB per tensor and "
                "hours under the interpreter; it runs on a GPU")
    return None


_TWO_PASS = ("a row longer than 8192 does not fit registers: its logits are read twice, for "
             "the statistics and for the gradient (the second read from L2 while the rows in "
             "flight fit there): 3 row passes for a compulsory 2")
_SPLIT = ("fewer rows than SMs: each row is cut into spans, one program each; the stats "
          "kernel reads its span, the finish kernel reads it again to write the gradient "
          "(3 row passes for a compulsory 2) plus 5 fp32 statistics per span")


def _for_model(cfg, batch: int, seq: int) -> list[Case]:
    """A causal LM's loss: every token's logits against the next token (HF pads the
    shifted labels with ignore_index, so the last token of each sequence is ignored).
    Soft-capping, where a model has it, is applied by the model before its loss."""
    if not cfg.vocab:
        return []
    return [Case("cross_entropy", (("tokens", batch * seq), ("vocab", cfg.vocab)),
                 flags={"ignore": "some"}, model=cfg.name)]


def _case_of(call: str, args) -> Case | None:
    """logits (dlogits, or the overwritten logits, in the backward) as [tokens, vocab],
    with the options that change the cost."""
    if not (is_call_of(call, "cross_entropy") or is_call_of(call, "cross_entropy_inplace")):
        return None
    if call.endswith("_bwd"):  # the backward scales dlogits: shapes and the reduction only
        logits = args["dlogits"] if "dlogits" in args else args["logits"]
        flags = {"reduction": "none" if args["dloss"].dim() else None}
    else:
        logits = args["logits"]
        reduction = args["reduction"]
        flags = {"reduction": None if reduction == "mean" else reduction,
                 "smoothing": args["label_smoothing"] or None, "zloss": args["z_loss"] or None,
                 "softcap": args["softcap"], "weight": args.get("weight") is not None or None,
                 "extras": args.get("extras") or None}
    return rows_case("cross_entropy", logits, "vocab", rows="tokens", **flags)


SPEC = OpSpec(
    impl=cross_entropy,
    make_inputs=_make_inputs,
    cost=_cost,
    suites=shapes.suites(_cases),
    grad_inputs=("logits",),
    skip=_skip,
    notes=("Loss and dlogits in one forward (the backward scales dlogits); vocab > 8192 "
           "reads each row twice (statistics, then gradient), the second read hitting L2 "
           "only while the rows in flight fit there. fwd bytes count the dlogits write."),
    kernels={
        # 8 logits a thread held to the gradient, with the row statistics: ~50 registers
        # (64 with a softcap), half an SM's warps resident
        "_cross_entropy_fwd_kernel": KernelDesign(min_occupancy=0.5),
        "_cross_entropy_fwd_looped_kernel": KernelDesign(min_occupancy=0.5, bytes_ratio=1.52,
                                                         why=_TWO_PASS),
        "_cross_entropy_split_stats_kernel": KernelDesign(min_occupancy=0.5, bytes_ratio=1.52,
                                                          why=_SPLIT),
        "_cross_entropy_split_finish_kernel": KernelDesign(min_occupancy=0.5,
                                                           bytes_ratio=1.52, why=_SPLIT),
        # an elementwise scale
        "_cross_entropy_bwd_kernel": KernelDesign(min_occupancy=0.75),
    },
    for_model=_for_model,
    case_of=_case_of,
    fuses="log_softmax + nll_loss without the [tokens, vocab] log-probabilities",
    peers={"liger": "liger_cross_entropy"},
    patches="cross_entropy",
)
