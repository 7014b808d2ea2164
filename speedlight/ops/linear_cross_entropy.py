"""Fused linear cross-entropy: the loss of an lm_head (logits = hidden @ weight.T + bias)
without its [tokens, vocab] logits or their gradient ever existing whole.

The chunked launcher (linear_cross_entropy_chunks.py) takes the tokens a chunk at a time:
the chunk's logits, the cross-entropy kernel writing each token's loss and, over the
logits, their gradient, then the gradient's matmuls into d_hidden, d_weight and d_bias.

Two registrations, two backwards, chosen per call by the public function:
- `linear_cross_entropy` computes the gradients in the forward when autograd needs them
  (needs_grad: none for a frozen lm_head or hidden), so the backward only multiplies them
  by the upstream gradient, in place (the forward's gradients are not copied; a second
  backward through one graph is refused);
- `linear_cross_entropy_recompute` computes the loss alone in the forward and the
  gradients in the backward, chunk by chunk, with the upstream gradient multiplied in
  before the gradient is rounded to the logits' dtype. It serves reduction "none" (a
  per-token upstream gradient cannot scale a precomputed d_weight) and fp16 logits: an
  fp16 gradient computed before a loss scaler's factor is known underflows (a mean over
  16K tokens makes most of it smaller than fp16's smallest subnormal), so it waits for
  the scaled upstream gradient, at the cost of the logits matmul a second time.
Without a gradient (evaluation) only the logits matmul and the loss run.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch

from speedlight import reference, shapes
from speedlight.ops._checks import check_bool, check_dense, check_same_device, check_tensor
from speedlight.ops._dtensor import local_reduction_refused, local_rows
from speedlight.ops.cross_entropy import (
    TARGET_DTYPES,
    CrossEntropyOutput,
    check_class_weight,
    ignore_and_class_weight,
    check_options,
    loss_chains,
)
from speedlight.ops.linear_cross_entropy_chunks import linear_cross_entropy_fwd, scale_in_place
from speedlight.ops.linear_cross_entropy_schedule import (
    LOW_MEMORY_BUDGET,
    budget_like,
    headline,
    plan_schedule,
)
from speedlight.ops.registration import register_op
from speedlight.runtime import autocast_dtype, describe
from speedlight.spec import Case, Chain, Cost, OpSpec, generator, inject_nonfinite, rand_tensor

# --- registration ---------------------------------------------------------------------------
# The launchers' parameters are the custom ops' schemas. hidden [tokens, H], target
# [tokens] (the public function flattens the leading dims); the extras (z_loss_term,
# token_accuracy, predicted_tokens) are None (an empty placeholder) unless asked for.


def _train_fwd(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
               bias: Optional[torch.Tensor], class_weight: Optional[torch.Tensor],
               ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
               softcap: Optional[float], chunk_size: Optional[int],
               memory_budget: Optional[int], autocast_dtype: Optional[torch.dtype],
               check_target: bool, extras: bool, needs_grad: list[bool]):
    """The loss, the gradients needs_grad asks for (of the loss itself) and the extras."""
    loss, dh, dw, db, more = linear_cross_entropy_fwd(
        hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
        softcap, class_weight=class_weight, needs_grad=needs_grad,
        autocast_dtype=autocast_dtype, chunk_size=chunk_size, memory_budget=memory_budget,
        check_target=check_target, extras=extras)
    return (loss, dh, dw, db, *(more or (None, None, None)))


def _loss_fwd(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
              bias: Optional[torch.Tensor], class_weight: Optional[torch.Tensor],
              ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
              softcap: Optional[float], chunk_size: Optional[int],
              memory_budget: Optional[int], autocast_dtype: Optional[torch.dtype],
              check_target: bool, extras: bool):
    """The loss and the extras, no gradient."""
    loss, _, _, _, more = linear_cross_entropy_fwd(
        hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
        softcap, class_weight=class_weight, autocast_dtype=autocast_dtype,
        chunk_size=chunk_size, memory_budget=memory_budget, check_target=check_target,
        extras=extras)
    return (loss, *(more or (None, None, None)))


def _scale_bwd(dloss: torch.Tensor, d_hidden: torch.Tensor, d_weight: torch.Tensor,
               d_bias: torch.Tensor) -> None:
    """The forward's gradients times the upstream gradient, in place (no copy of
    d_weight), by a kernel that leaves them untouched when it is exactly 1 (read on the
    device: no host sync); the placeholders of gradients not computed stay empty."""
    for t in (d_hidden, d_weight, d_bias):
        scale_in_place(t, dloss)


def _recompute_bwd(dloss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                   target: torch.Tensor, bias: Optional[torch.Tensor],
                   class_weight: Optional[torch.Tensor], ignore_index: int, reduction: str,
                   label_smoothing: float, z_loss: float, softcap: Optional[float],
                   chunk_size: Optional[int], memory_budget: Optional[int],
                   autocast_dtype: Optional[torch.dtype], needs_grad: list[bool]):
    """The gradients needs_grad asks for, of sum(dloss * loss), recomputed chunk by chunk."""
    _, dh, dw, db, _ = linear_cross_entropy_fwd(
        hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
        softcap, class_weight=class_weight, needs_grad=needs_grad, grad_loss=dloss,
        autocast_dtype=autocast_dtype, chunk_size=chunk_size, memory_budget=memory_budget,
        check_target=False)
    return dh, dw, db


def _outputs_fake(hidden, target, reduction, autocast_dtype, extras) -> tuple:
    """(loss, z_loss_term, token_accuracy, predicted_tokens) as fakes."""
    per_token = target.shape if reduction == "none" else ()
    loss = hidden.new_empty(per_token, dtype=torch.float32)
    if not extras:
        return loss, None, None, None
    return (loss, loss.new_empty(per_token), loss.new_empty(per_token, dtype=torch.float32),
            target.new_empty(target.shape, dtype=torch.int64))


def _train_fake(hidden, weight, target, bias, class_weight, ignore_index, reduction,
                label_smoothing, z_loss, softcap, chunk_size, memory_budget, autocast_dtype,
                check_target, extras, needs_grad):
    loss, *more = _outputs_fake(hidden, target, reduction, autocast_dtype, extras)
    grad_h, grad_w, grad_b = needs_grad
    return (loss, hidden.new_empty(hidden.shape) if grad_h else None,
            weight.new_empty(weight.shape) if grad_w else None,
            bias.new_empty(bias.shape) if grad_b and bias is not None else None, *more)


def _recompute_bwd_fake(dloss, hidden, weight, target, bias, *options):
    grad_h, grad_w, grad_b = options[-1]
    return (hidden.new_empty(hidden.shape) if grad_h else None,
            weight.new_empty(weight.shape) if grad_w else None,
            bias.new_empty(bias.shape) if grad_b and bias is not None else None)


LINEAR_CROSS_ENTROPY = register_op(
    "linear_cross_entropy",
    forward=_train_fwd,
    inference=_loss_fwd,
    outputs=("loss", "d_hidden", "d_weight", "d_bias", "z_loss_term", "token_accuracy",
             "predicted_tokens"),
    stats=("d_hidden", "d_weight", "d_bias"),
    fake=_train_fake,
    backward=_scale_bwd,
    backward_mutates=("d_hidden", "d_weight", "d_bias"),
    grads=("hidden", "weight", "bias"),
    optional_grads=True,  # the extras receive no gradient; nor zeros the size of d_weight
)

LINEAR_CROSS_ENTROPY_RECOMPUTE = register_op(
    "linear_cross_entropy_recompute",
    forward=_loss_fwd,
    outputs=("loss", "z_loss_term", "token_accuracy", "predicted_tokens"),
    fake=lambda hidden, weight, target, bias, class_weight, ignore_index, reduction, *rest: (
        _outputs_fake(hidden, target, reduction, rest[-3], rest[-1])),
    backward=_recompute_bwd,
    backward_fake=_recompute_bwd_fake,
    grads=("hidden", "weight", "bias"),
    optional_grads=True,
)


# --- public function ---------------------------------------------------------------------

def check_gathered_weight(weight: torch.Tensor, hidden: torch.Tensor) -> None:
    """weight must be the whole [V, H] lm_head on this rank. A parameter ZeRO-3 or FSDP
    has released (empty) or that holds one rank's flat shard, or a slice along hidden,
    would give a wrong loss or none: each raises, saying how to gather it. (A row shard
    [V / ranks, H] is [V', H] as far as shapes tell; its targets past V' fail the target
    check.) A DTensor weight sharded in any way is refused by local_rows."""
    if weight.numel() == 0 and weight.dim() != 2:
        raise ValueError(
            f"weight is empty ({describe(weight)}): a parameter ZeRO-3 or FSDP has released "
            f"outside its module's forward; call linear_cross_entropy inside the forward of "
            f"the module that owns it (speedlight.patch runs it inside the lm_head's call), or "
            f"gather it first (deepspeed.zero.GatheredParameters, FSDP's summon_full_params)")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape (vocab, {hidden.shape[-1]}) (hidden's last dim), got "
            f"{describe(weight)}; a shard of a sharded lm_head (FSDP, ZeRO-3, a "
            f"tensor-parallel split) must be gathered first")


def _check_dtypes(hidden, weight, bias, under_autocast: bool) -> None:
    """Outside autocast weight and bias have hidden's dtype, as F.linear requires; under
    it any mix of float32/float16/bfloat16 is cast as F.linear's operands are."""
    if under_autocast:
        return
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight must have hidden's dtype {hidden.dtype} (outside "
                        f"torch.autocast), got {describe(weight)}")
    if bias is not None and bias.dtype != hidden.dtype:
        raise TypeError(f"bias must have hidden's dtype {hidden.dtype} (outside "
                        f"torch.autocast), got {describe(bias)}")


@local_rows("hidden", "target", refuse=local_reduction_refused)
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None,
                         class_weight: torch.Tensor | None = None,
                         chunk_size: int | None = None, memory_budget: int | None = None,
                         check_target: bool = True,
                         return_z_loss: bool = False, return_token_accuracy: bool = False,
                         return_predicted_tokens: bool = False
                         ) -> torch.Tensor | CrossEntropyOutput:
    """speedlight.cross_entropy(hidden @ weight.T + bias, target, ...) without the logits.

    hidden [..., H] (any leading dims), weight [V, H] (an lm_head's), bias [V] or None,
    float32/float16/bfloat16 of one dtype (under torch.autocast any mix); target [...]
    (hidden's leading dims) integer class indices. The options are speedlight.cross_entropy's,
    with the same semantics: reductions, ignore_index, label smoothing, z-loss, softcap
    (Gemma 2's, on the logits), class weights (`class_weight`, [V], torch's `weight`:
    `weight` here is the lm_head's), and a mean over nothing counted is 0.
    return_z_loss / return_token_accuracy / return_predicted_tokens: computed in the same
    pass over each chunk's logits; any of them makes the result a
    CrossEntropyOutput(loss, z_loss, token_accuracy, predicted_tokens) named tuple, as
    cross_entropy's (None for the parts not asked; the predicted tokens are the argmax of
    the logits as computed, in their dtype).

    The logits are computed in hidden's dtype (as F.linear does) and the loss from them in
    fp32; the loss, the z-loss and the accuracy are fp32 whatever the inputs' dtype (as
    Hugging Face's loss, which upcasts the logits, and Liger's are). Under torch.autocast
    the matmuls run in the autocast dtype, as F.linear's do there, and each gradient has
    its input's dtype.

    Never materialises the [tokens, V] logits. memory_budget: the bytes it may hold beyond
    its inputs and the gradients it returns (default 1 GiB; 250_000_000 is the low-memory
    setting), which choose the schedule (linear_cross_entropy_schedule): chunks of tokens
    whose logits fit, d_weight summed in itself (each chunk rounds it once), in an fp32
    accumulator when that fits too, or, where d_weight would be rounded more than 8 times,
    vocabulary blocks with the logits computed again (a fourth matmul, one rounding).
    `speedlight.ops.linear_cross_entropy_schedule.plan_schedule` says which a call
    takes; chunk_size (tokens) forces chunks of that size. The gradients autograd needs
    (none for an input that does not require grad) are computed during the forward and
    the backward scales them in place (skipped, without a host sync, for an upstream
    gradient of 1), so a second backward on one graph is refused; with reduction="none"
    or fp16 logits the backward computes them instead (see this module's docstring).

    check_target: a target neither in [0, V) nor ignore_index raises ValueError (on CUDA
    one host sync; pass False inside CUDA-graph capture, as for cross_entropy).
    """
    check_tensor("hidden", hidden, min_dim=1)
    check_tensor("weight", weight)
    check_gathered_weight(weight, hidden)
    if bias is not None:
        check_tensor("bias", bias, min_dim=1)
        if tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {describe(bias)}")
    check_dense("target", target)
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be an integer tensor of class indices, got "
                        f"{describe(target)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"target must have shape {tuple(hidden.shape[:-1])} (hidden's shape "
                         f"without its last dim), got {describe(target)}")
    check_same_device(hidden=hidden, weight=weight, target=target, bias=bias)
    amp_dtype = autocast_dtype(hidden)
    _check_dtypes(hidden, weight, bias, amp_dtype is not None)
    check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    check_class_weight(class_weight, weight.shape[0], hidden.device, name="class_weight")
    for name, flag in (("check_target", check_target), ("return_z_loss", return_z_loss),
                       ("return_token_accuracy", return_token_accuracy),
                       ("return_predicted_tokens", return_predicted_tokens)):
        check_bool(name, flag)
    if chunk_size is not None and (not isinstance(chunk_size, numbers.Integral)
                                   or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
    if memory_budget is not None and (not isinstance(memory_budget, numbers.Integral)
                                      or isinstance(memory_budget, bool) or memory_budget < 0):
        raise ValueError(f"memory_budget must be None or a number of bytes >= 0, got "
                         f"{memory_budget!r}")
    if weight.shape[0] == 0 and target.numel():
        raise ValueError(f"weight must have at least one row (class), got {describe(weight)}")

    asked = (bool(return_z_loss), bool(return_token_accuracy), bool(return_predicted_tokens))
    if target.numel() == 0:
        return _no_tokens(hidden, weight, bias, target, reduction, asked)
    args = (hidden.reshape(-1, hidden.shape[-1]), weight, target.reshape(-1), bias,
            class_weight, int(ignore_index), reduction, float(label_smoothing), float(z_loss),
            float(softcap) if softcap is not None else None,
            int(chunk_size) if chunk_size is not None else None,
            int(memory_budget) if memory_budget is not None else None, amp_dtype,
            bool(check_target) or hidden.device.type == "cpu", any(asked))
    recompute = reduction == "none" or (amp_dtype or hidden.dtype) == torch.float16
    op = LINEAR_CROSS_ENTROPY_RECOMPUTE if recompute else LINEAR_CROSS_ENTROPY
    loss, *more = op(*args)
    if reduction == "none":
        loss = loss.view(target.shape)
    if not any(asked):
        return loss
    z, accuracy, predicted = more
    if reduction == "none":
        z, accuracy = z.view(target.shape), accuracy.view(target.shape)
    # logged values: their gradient flows through loss, not through them
    return CrossEntropyOutput(loss, *(m.detach() if a else None for m, a in
                                      zip((z, accuracy, predicted.view(target.shape)), asked)))


def _no_tokens(hidden, weight, bias, target, reduction, asked):
    """The result for no tokens, without a launch: F.linear's empty [0, V] logits summed
    (0, or [0] per token for "none"), so that autograd gives the lm_head exact zeros (an
    empty matmul) whatever the upstream gradient, as the unfused computation does."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    loss = logits.sum(-1) if reduction == "none" else logits.sum()
    if not any(asked):
        return loss
    zero = torch.zeros(loss.shape, dtype=torch.float32, device=hidden.device)
    predicted = torch.empty(target.shape, dtype=torch.int64, device=hidden.device)
    return CrossEntropyOutput(loss, *(m if a else None for m, a in
                                      zip((zero, zero.clone(), predicted), asked)))


# --- OpSpec --------------------------------------------------------------------------------

LOW_MB = LOW_MEMORY_BUDGET // 10 ** 6  # the low-memory setting as a case's budget flag
# A case of at most this many logits runs on a CPU (skip), and is given the memory budget
# that rounds its d_weight as often as the headline shape's is under its setting
SMALL_CASE_LOGITS = 2 ** 22


def case_budget(case: Case) -> int | None:
    """The memory_budget a case runs with: the setting's (flag budget: megabytes, 250 the
    low-memory setting; else the default, None), or for a half-precision case of at most
    SMALL_CASE_LOGITS logits without an explicit chunk size, the budget that gives it the
    schedule and chunk count the headline shape has under that setting (budget_like), so
    that verify on a CPU judges the accuracy the GPU's default has (a half-precision
    d_weight rounded as often; an fp32 one's roundings are fp32's, which no count makes
    matter)."""
    budget = case.flag("budget") * 10 ** 6 if case.flag("budget") is not None else None
    tokens, hidden_size, vocab = case["tokens"], case["hidden"], case["vocab"]
    if (case.flag("chunk") is not None or tokens * vocab > SMALL_CASE_LOGITS
            or case.dtype == torch.float32):
        return budget
    return budget_like(headline(budget, case.dtype), tokens, vocab, hidden_size, case.dtype)


def make_inputs(case: Case, device) -> dict:
    tokens, hidden_size, vocab = case["tokens"], case["hidden"], case["vocab"]
    softcap = case.flag("softcap")
    extras = bool(case.flag("extras"))
    # logits = hidden @ weight.T a few units wide (wider before a softcap), as a trained
    # LM's: unit hidden, weight rows of norm ~2 (~15 before a cap)
    hidden = rand_tensor((tokens, hidden_size), case, device)
    w_scale = (15.0 if softcap else 2.0) / max(hidden_size, 1) ** 0.5
    weight = rand_tensor((vocab, hidden_size), case.with_(layout="contiguous"), device,
                         scale=w_scale, salt=1)
    bias = (rand_tensor((vocab,), case.with_(layout="contiguous"), device, scale=0.5, salt=4)
            if case.flag("bias") else None)
    if case.flag("nonfinite"):
        inject_nonfinite(hidden, case)
    g = generator(case, salt=2)
    target = torch.randint(0, max(vocab, 1), (tokens,), generator=g)
    if extras and tokens and vocab:
        _plant_argmax(hidden, weight, target, g)
    class_weight = ignore_and_class_weight(case, target, g, vocab, device)
    return {"hidden": hidden, "weight": weight, "target": target.to(device), "bias": bias,
            "ignore_index": -100, "reduction": case.flag("reduction", "mean"),
            "label_smoothing": float(case.flag("smoothing", 0.0)),
            "z_loss": float(case.flag("zloss", 0.0)), "softcap": softcap,
            "class_weight": class_weight, "chunk_size": case.flag("chunk"),
            "memory_budget": case_budget(case), "return_z_loss": extras,
            "return_token_accuracy": extras, "return_predicted_tokens": extras}


def _plant_argmax(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, g) -> None:
    """Give each token's logits one clear maximum (at its target for about half of them),
    so that the predicted tokens do not depend on how the logits are rounded: hidden
    moves along the chosen class's weight row until that logit grows by 10, then, where
    two logits still lie within 0.5 (a few bf16 ulps at that size), along the difference
    of their rows."""
    n, vocab = hidden.shape[0], weight.shape[0]
    chosen = torch.where(torch.rand(n, generator=g) < 0.5, target,
                         torch.randint(0, vocab, (n,), generator=g))
    w = weight.double().cpu()
    h = hidden.double().cpu() + 10.0 * w[chosen] / w[chosen].square().sum(-1, keepdim=True)
    hidden.copy_(h.to(hidden.dtype))
    for _ in range(4 if vocab > 1 else 0):
        h = hidden.double().cpu()
        top = (h @ w.t()).topk(2, dim=-1)
        close = (top.values[:, 0] - top.values[:, 1]) < 0.5
        if not bool(close.any()):
            return
        d = w[top.indices[:, 0]] - w[top.indices[:, 1]]
        step = d / d.square().sum(-1, keepdim=True).clamp_min(1e-12)
        hidden.copy_(torch.where(close[:, None], h + step, h).to(hidden.dtype))


def _reference(hidden, weight, target, bias=None, *, chunk_size=None, memory_budget=None,
               **options):
    return reference.linear_cross_entropy(hidden, weight, target, bias, **options)


def _held(case: Case, *, grad_weight: bool) -> int:
    """What the forward holds at once besides its inputs, outputs and gradients: its
    schedule's logits (a chunk, or a vocabulary block) and any fp32 d_weight accumulator,
    under the case's memory budget (flag budget, megabytes; else the default)."""
    budget = case.flag("budget")
    return plan_schedule(case["tokens"], case["vocab"], case["hidden"], case.dtype, case.dtype,
                         grad_weight=grad_weight,
                         memory_budget=None if budget is None else budget * 10 ** 6).extra_bytes


def cost(case: Case, mode: str) -> Cost:
    n, h, v, e = case["tokens"], case["hidden"], case["vocab"], case.dtype.itemsize
    bias = v if case.flag("bias") else 0
    none = case.flag("reduction") == "none"
    # the backward computes the gradients (a profiled call of that op says so)
    recompute = none or case.dtype == torch.float16 or bool(case.flag("recompute"))
    loss_bytes = n * e if none else e
    # read hidden, weight, bias, target (and class weights)
    inputs = (n * h + v * h + bias + (v if case.flag("weight") else 0)) * e + 8 * n
    grads = (n * h + v * h + bias) * e  # d_hidden, d_weight, d_bias
    matmul = 2 * n * v * h  # one [n, h] x [h, v] product (2 FLOP per multiply-add)
    ce = (7 + (22 if case.flag("softcap") else 0)) * n * v  # ~ per logit, as cross_entropy
    if mode == "fwd":
        extras = 16 * n if case.flag("extras") else 0  # write z, correct (fp32), argmax
        if recompute:  # the loss only: logits matmul + cross-entropy
            return Cost(flops=matmul + ce, bytes=inputs + loss_bytes + extras,
                        saved=_held(case, grad_weight=False))
        # training's forward computes the gradients too: the logits, d_hidden and d_weight
        # matmuls; read the inputs, write the loss and the gradients (the logits never
        # reach memory in the ideal)
        return Cost(flops=3 * matmul + ce, bytes=inputs + loss_bytes + extras + grads,
                    saved=_held(case, grad_weight=True))
    if recompute:  # read the inputs and the upstream gradients, write the gradients
        return Cost(flops=3 * matmul + ce + n * v, bytes=inputs + loss_bytes + grads)
    # scale the forward's gradients by the upstream gradient in place: read, write each
    return Cost(flops=n * h + v * h + bias, bytes=2 * grads + e)


def cases(suite: str) -> list[Case]:
    def case(tokens, hidden, vocab, model=None, **flags):
        return Case("linear_cross_entropy",
                    (("tokens", tokens), ("hidden", hidden), ("vocab", vocab)),
                    flags=flags, model=model)

    if suite == "quick":  # (the contract test runs each in 3 dtypes x 2 seeds: kept small)
        # without a chunk flag a case is rounded as often as the headline shape under its
        # setting (case_budget): the default's chunks, or the low-memory setting's (budget
        # in MB) vocabulary blocks
        # (the first is the one inspect's gfx942 guard compiles: every kernel of the op)
        return [case(37, 16, 300, budget=LOW_MB, ignore="some", smoothing=0.1, zloss=1e-3,
                     softcap=30.0, bias=True),
                case(37, 32, 300), case(1, 16, 7),
                case(50, 16, 130, chunk=16),  # 4 chunks, the last ragged
                # class weights and per-token upstream gradients (the backward's pass)
                case(37, 16, 300, budget=LOW_MB, reduction="none", weight=True, zloss=1e-3,
                     ignore="some"),
                case(37, 16, 300, chunk=16, extras=True, zloss=1e-3, ignore="some"),
                case(6, 16, 100, ignore="all", chunk=4), case(0, 16, 100)]
    out = []
    pairs = shapes.distinct_configs(("hidden", "vocab"), where=lambda m: bool(m.vocab))
    for (hidden, vocab), model in pairs:
        cfg = shapes.MODELS[model]
        flags = {"softcap": cfg.logit_softcap} if cfg.logit_softcap else {}
        for tokens in shapes.MODEL_TOKENS:
            out.append(case(tokens, hidden, vocab, model=model, ignore="some", **flags))
    if suite == "full":
        out += [case(257, 1000, 32003, ignore="some"), case(1031, 509, 65537, bias=True),
                case(4096, 4096, 128256, ignore="all"),
                case(4096, 4096, 128256, reduction="none", smoothing=0.1, zloss=1e-4),
                # the low-memory setting at 16K tokens: vocabulary blocks
                case(16384, 4096, 128256, budget=LOW_MB, ignore="some"),
                case(3, 16, 20011, reduction="sum"),
                case(257, 1000, 32003, weight=True, smoothing=0.1, extras=True,
                     reduction="none", ignore="some"),
                case(1031, 512, 65537, weight=True, zloss=1e-4, extras=True, reduction="sum"),
                # weight and its gradient past 2^31 elements together (Gemma 3's vocabulary)
                case(16384, 4096, 262144, huge=True)]
    return out


def skip(case: Case, device) -> str | None:
    if torch.device(device).type != "cuda" and case["tokens"] * case["vocab"] > SMALL_CASE_LOGITS:
        return ("tokens x vocab > 4M logits: hours of matmuls and interpreted kernels on a "
                "CPU; it runs on a GPU")
    return None


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """A causal LM's lm_head and loss over every token (the last of each sequence ignored)."""
    if not cfg.vocab:
        return []
    flags = {"ignore": "some"}
    if cfg.logit_softcap:
        flags["softcap"] = cfg.logit_softcap
    return [Case("linear_cross_entropy",
                 (("tokens", batch * seq), ("hidden", cfg.hidden), ("vocab", cfg.vocab)),
                 flags=flags, model=cfg.name)]


_CALLS = ("linear_cross_entropy_fwd", "linear_cross_entropy_infer", "linear_cross_entropy_bwd",
          "linear_cross_entropy_recompute_fwd", "linear_cross_entropy_recompute_bwd")


def case_of(call: str, args) -> Case | None:
    """[tokens, hidden] x [vocab, hidden] of a call, with the options that change the cost
    (the scaling backward reads the forward's gradients: d_hidden, d_weight), and the
    schedule a call that runs the matmuls took (`schedule`, `chunks`, `blocks`: what
    profile shows of it; the cost stays the ideal's)."""
    if call not in _CALLS:
        return None
    if call == "linear_cross_entropy_bwd":
        hidden, weight, bias = args["d_hidden"], args["d_weight"], args["d_bias"]
        flags = {"bias": bool(bias.numel()) or None}  # (mean and sum cost the same)
    else:
        hidden, weight, bias = args["hidden"], args["weight"], args.get("bias")
        reduction = args.get("reduction", "mean")
        flags = {"bias": bias is not None or None,
                 "reduction": None if reduction == "mean" else reduction,
                 "softcap": args.get("softcap"),
                 "weight": args.get("class_weight") is not None or None,
                 "extras": args.get("extras") or None,
                 "recompute": call.startswith("linear_cross_entropy_recompute") or None}
    n = hidden.numel() // hidden.shape[-1] if hidden.dim() and hidden.shape[-1] else 0
    dtype = args.get("autocast_dtype") or weight.dtype  # the logits' and matmuls' dtype
    if call != "linear_cross_entropy_bwd":
        grad_w = bool((args.get("needs_grad") or (False, False))[1])
        sched = plan_schedule(n, weight.shape[0], weight.shape[-1], dtype, weight.dtype,
                     grad_weight=grad_w, memory_budget=args.get("memory_budget"),
                     chunk_size=args.get("chunk_size"), weight_copy=weight.dtype != dtype)
        flags.update(schedule=sched.kind if grad_w else None, chunks=sched.n_chunks,
                     blocks=sched.n_blocks if grad_w and sched.n_blocks else None)
    return Case("linear_cross_entropy", (("tokens", n), ("hidden", weight.shape[-1]),
                                         ("vocab", weight.shape[0])), dtype=dtype,
                flags={k: v for k, v in flags.items() if v is not None})


def recognise(g, calls) -> list[Chain]:
    """The logits matmul (mm, addmm) before a log_softmax + nll_loss: hidden [tokens, H]
    times the lm_head's [H, vocab]; an alternative to cross_entropy's chain, whose logits
    it never writes."""
    chains = []
    for fwd, start, logits, _ in loss_chains(g):
        mm = g.input_base(start, 0)
        if g.name(mm) not in ("mm", "addmm"):
            continue
        hidden, weight = (g.tensor(t) for t in g.row(mm)["inputs"][-2:])
        n = hidden.numel() // hidden.shape[-1] if hidden.shape[-1] else 0
        case = Case("linear_cross_entropy", (("tokens", n), ("hidden", weight.shape[0]),
                                             ("vocab", weight.shape[-1])), dtype=weight.dtype,
                    flags={"bias": True} if g.name(mm) == "addmm" else {})
        stored = g.tensor(logits)
        chains.append(Chain("logits matmul + cross-entropy (logits never stored)",
                            fwd | {mm} | g.views_between(mm, start), g.row(mm)["module"], case,
                            "an alternative to cross_entropy, not in addition",
                            unstored=stored.numel() * stored.element_size()))
    return chains


SPEC = OpSpec(
    impl=linear_cross_entropy,
    reference=_reference,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("hidden", "weight", "bias"),
    skip=skip,
    family="compute-bound",
    notes=("lm_head matmul + cross-entropy in chunks of tokens: one chunk's logits alive at "
           "a time, their gradient written over them by the cross-entropy kernel; the memory "
           "budget picks how d_weight is summed (in itself, in an fp32 accumulator, or by "
           "vocabulary blocks with the logits again). fwd counts the gradient matmuls "
           "(computed there); bwd only "
           "scales (reduction none and fp16: fwd the loss, bwd recomputes)."),
    for_model=for_model,
    aligned=lambda case: case["hidden"] % 16 == 0 and case["vocab"] % 16 == 0,
    case_of=case_of,
    recognise=recognise,
    fuses=("lm_head matmul + cross-entropy in chunks of tokens: the [tokens, vocab] logits "
           "and their gradient are never stored"),
    peers={"liger": "liger_fused_linear_cross_entropy", "torch": "linear_cross_entropy"},
    patches="linear_cross_entropy",
)
