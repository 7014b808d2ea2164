"""Fused linear cross-entropy: the loss of an lm_head (logits = hidden @ weight.T + bias)
without its [tokens, vocab] logits or their gradient ever existing whole.

Tokens are taken in chunks. Per chunk: the chunk's logits by one matmul; speedlight's
cross-entropy kernel writes each token's loss and, over the logits in place, their
gradient (already divided by a mean's divisor); then that gradient's matmuls write the
chunk's d_hidden and accumulate d_weight and d_bias in fp32 (cast once at the end). Only
one chunk's logits are alive at a time.

The gradient is computed in the forward when autograd needs it, so the backward only
multiplies by the upstream gradient (in place: the forward's gradients are not copied).
With reduction="none" a per-token upstream gradient cannot scale a precomputed d_weight,
so the forward computes the loss alone and the backward recomputes chunk by chunk. Without
a gradient (evaluation) only the logits matmul and the loss run.

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

import numbers
from typing import Optional

import torch
import triton

from speedlight import reference, shapes
from speedlight.launch import planned_sm_count
from speedlight.ops._checks import check_bool, check_dense, check_same_device, check_tensor
from speedlight.ops._dtensor import local_reduction_refused, local_rows
from speedlight.ops.cross_entropy import (
    TARGET_DTYPES,
    _check_targets,
    _divide,
    check_options,
    cross_entropy_bwd,
    cross_entropy_fwd,
)
from speedlight.runtime import describe
from speedlight.spec import Case, Cost, OpSpec, generator, inject_nonfinite, rand_tensor

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


def linear_cross_entropy_fwd(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                             bias: torch.Tensor | None = None, ignore_index: int = -100,
                             reduction: str = "mean", label_smoothing: float = 0.0,
                             z_loss: float = 0.0, softcap: float | None = None, *,
                             grad_hidden: bool = False, grad_weight: bool = False,
                             grad_bias: bool = False, grad_rows: torch.Tensor | None = None,
                             chunk_size: int | None = None, check_target: bool = True):
    """(loss, d_hidden, d_weight, d_bias) over hidden [tokens, H], weight [V, H], target
    [tokens], bias [V] or None. The gradients asked for (grad_*) are those of the reduced
    loss (None otherwise); with grad_rows ([tokens]: each token's upstream gradient, for
    reduction "none") they are those of sum(grad_rows * loss). loss: fp32 per token for
    "none", else a 0-dim tensor in hidden's dtype.
    """
    n, h = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    if check_target and n:
        _check_targets(target, vocab, ignore_index)
    any_grad = grad_hidden or grad_weight or grad_bias
    d_hidden = (torch.empty((n, h), dtype=hidden.dtype, device=dev) if grad_hidden
                else None)
    acc_w = torch.zeros((vocab, h), dtype=torch.float32, device=dev) if grad_weight else None
    acc_b = torch.zeros(vocab, dtype=torch.float32, device=dev) if grad_bias else None
    loss_rows = torch.empty(n, dtype=torch.float32, device=dev)
    divisor = (target != ignore_index).sum() if reduction == "mean" else None
    scale = None
    if any_grad and grad_rows is None and divisor is not None:
        scale = _divide(torch.ones((), device=dev), divisor)  # 1 / divisor, 0 for none
    opts = (ignore_index, "none", label_smoothing, z_loss, softcap)
    step = chunk_tokens(n, vocab, hidden.dtype, dev, chunk_size)
    for s in range(0, n, step):
        e = min(s + step, n)
        h_c = hidden[s:e]
        # [c, H] @ [H, V] -> [c, V]
        logits = torch.addmm(bias, h_c, weight.t()) if bias is not None else h_c @ weight.t()
        cross_entropy_fwd(logits, target[s:e], *opts, compute_grad=any_grad,
                          check_target=False, grad_out=logits if any_grad else None,
                          grad_scale=scale, loss_out=loss_rows[s:e])
        if not any_grad:
            continue
        dlogits = logits
        if grad_rows is not None:  # each token's own upstream gradient, in place
            cross_entropy_bwd(dlogits, grad_rows[s:e], out=dlogits)
        if grad_hidden:
            torch.mm(dlogits, weight, out=d_hidden[s:e])  # [c, V] @ [V, H] -> [c, H]
        if grad_weight:
            _accumulate_mm(acc_w, dlogits.t(), h_c)  # [V, c] @ [c, H] -> [V, H]
        if grad_bias:
            acc_b += dlogits.sum(0, dtype=torch.float32)
        del logits, dlogits
    if reduction == "none":
        loss = loss_rows
    else:
        total = loss_rows.sum()
        loss = (total if reduction == "sum" else _divide(total, divisor)).to(hidden.dtype)
    d_weight = acc_w.to(weight.dtype) if acc_w is not None else None
    d_bias = acc_b.to(bias.dtype) if acc_b is not None else None
    return loss, d_hidden, d_weight, d_bias


# --- registration: torch custom ops, opaque to torch.compile, with fake and autograd rules ---

def _none_to_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return t if t is not None else like.new_empty((0,))


@torch.library.custom_op("speedlight::linear_cross_entropy_fwd", mutates_args=())
def _lce_fwd_op(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor], ignore_index: int, reduction: str,
                label_smoothing: float, z_loss: float, softcap: Optional[float],
                grad_hidden: bool, grad_weight: bool, grad_bias: bool,
                chunk_size: Optional[int], check_target: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss, dh, dw, db = linear_cross_entropy_fwd(
        hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss,
        softcap, grad_hidden=grad_hidden, grad_weight=grad_weight, grad_bias=grad_bias,
        chunk_size=chunk_size, check_target=check_target)
    if reduction == "none":
        loss = loss.to(hidden.dtype)
    return (loss, _none_to_empty(dh, hidden), _none_to_empty(dw, weight),
            _none_to_empty(db, weight))


@_lce_fwd_op.register_fake
def _(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss, softcap,
      grad_hidden, grad_weight, grad_bias, chunk_size, check_target):
    loss = hidden.new_empty(target.shape if reduction == "none" else ())
    return (loss, hidden.new_empty(hidden.shape if grad_hidden else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)),
            weight.new_empty((weight.shape[0],) if grad_bias else (0,)))


@torch.library.custom_op("speedlight::linear_cross_entropy_recompute_bwd", mutates_args=())
def _lce_recompute_bwd_op(grad_rows: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                target: torch.Tensor, bias: Optional[torch.Tensor], ignore_index: int,
                label_smoothing: float, z_loss: float, softcap: Optional[float],
                grad_hidden: bool, grad_weight: bool, grad_bias: bool,
                chunk_size: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """reduction "none": recompute each chunk's gradient, scaled by its tokens' grad_rows."""
    _, dh, dw, db = linear_cross_entropy_fwd(
        hidden, weight, target, bias, ignore_index, "none", label_smoothing, z_loss, softcap,
        grad_hidden=grad_hidden, grad_weight=grad_weight, grad_bias=grad_bias,
        grad_rows=grad_rows, chunk_size=chunk_size, check_target=False)
    return _none_to_empty(dh, hidden), _none_to_empty(dw, weight), _none_to_empty(db, weight)


@_lce_recompute_bwd_op.register_fake
def _(grad_rows, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
      grad_hidden, grad_weight, grad_bias, chunk_size):
    return (hidden.new_empty(hidden.shape if grad_hidden else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)),
            weight.new_empty((weight.shape[0],) if grad_bias else (0,)))


@torch.library.custom_op("speedlight::linear_cross_entropy_bwd",
                         mutates_args=("d_hidden", "d_weight", "d_bias"))
def _lce_scale_bwd_op(dloss: torch.Tensor, d_hidden: torch.Tensor, d_weight: torch.Tensor,
                      d_bias: torch.Tensor) -> None:
    """reduction "mean"/"sum": the forward's gradients times the upstream gradient, in place
    (no copy of d_weight); empty placeholders stay empty."""
    g = dloss.float()
    for t in (d_hidden, d_weight, d_bias):
        if t.numel():
            t.mul_(g)


@_lce_scale_bwd_op.register_fake
def _(dloss, d_hidden, d_weight, d_bias):
    return None


def _setup_context(ctx, inputs, output):
    (hidden, weight, target, bias, ignore_index, reduction, label_smoothing, z_loss, softcap,
     grad_hidden, grad_weight, grad_bias, chunk_size, _) = inputs
    _, dh, dw, db = output
    ctx.reduction = reduction
    ctx.flags = (grad_hidden, grad_weight, grad_bias)
    ctx.set_materialize_grads(False)  # no zeros the size of d_weight for the unused outputs
    ctx.mark_non_differentiable(dh, dw, db)
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, target, bias)
        ctx.options = (ignore_index, label_smoothing, z_loss, softcap)
        ctx.chunk_size = chunk_size
    else:
        ctx.save_for_backward(dh, dw, db)
        ctx.scaled = False


def _backward(ctx, grad_loss, *_):
    grad_hidden, grad_weight, grad_bias = ctx.flags
    if grad_loss is None:
        return (None,) * 14
    if ctx.reduction == "none":
        hidden, weight, target, bias = ctx.saved_tensors
        dh, dw, db = torch.ops.speedlight.linear_cross_entropy_recompute_bwd(
            grad_loss.reshape(-1), hidden, weight, target, bias, *ctx.options, grad_hidden,
            grad_weight, grad_bias, ctx.chunk_size)
    else:
        # The forward's gradients, scaled in place (they are not copied): a second backward
        # through the same graph would scale them twice, so it is refused.
        if ctx.scaled:
            raise RuntimeError("linear_cross_entropy's backward ran twice on one forward "
                               "(retain_graph=True): its gradients were already scaled in "
                               "place; run the forward again")
        ctx.scaled = True
        dh, dw, db = ctx.saved_tensors
        torch.ops.speedlight.linear_cross_entropy_bwd(grad_loss, dh, dw, db)
    return ((dh if grad_hidden else None), (dw if grad_weight else None), None,
            (db if grad_bias else None)) + (None,) * 10


_lce_fwd_op.register_autograd(_backward, setup_context=_setup_context)

# --- end of the registration block --------------------------------------------------------


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


@local_rows("hidden", "target", refuse=local_reduction_refused)
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None,
                         chunk_size: int | None = None, check_target: bool = True
                         ) -> torch.Tensor:
    """speedlight.cross_entropy(hidden @ weight.T + bias, target, ...) without the logits.

    hidden [..., H] (any leading dims), weight [V, H] (an lm_head's), bias [V] or None, all
    float32/float16/bfloat16 of one dtype; target [...] (hidden's leading dims) integer
    class indices. Same semantics as speedlight.cross_entropy: reductions, ignore_index,
    label smoothing, z-loss, softcap (Gemma 2's, on the logits), and a mean over only
    ignored targets is 0. The logits are computed in hidden's dtype (as F.linear does) and
    the loss from them in fp32; the loss has hidden's dtype.

    Never materialises the [tokens, V] logits: tokens are processed in chunks (chunk_size
    tokens each, or the rule in this module's docstring), so the memory beyond the inputs
    and the gradients is one chunk's logits plus, for half-precision weights, d_weight's
    fp32 accumulator. The gradients are computed during the forward when autograd needs
    them (the backward scales them in place, so a second backward on one graph is
    refused); with reduction="none" the backward recomputes the chunks instead.

    check_target: a target neither in [0, V) nor ignore_index raises ValueError (on CUDA
    one host sync; pass False inside CUDA-graph capture, as for cross_entropy).
    """
    check_tensor("hidden", hidden, min_dim=1)
    check_tensor("weight", weight)
    check_gathered_weight(weight, hidden)
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight must have hidden's dtype {hidden.dtype}, got {describe(weight)}")
    if bias is not None:
        check_tensor("bias", bias, min_dim=1)
        if tuple(bias.shape) != (weight.shape[0],) or bias.dtype != hidden.dtype:
            raise ValueError(f"bias must have shape ({weight.shape[0]},) and dtype "
                             f"{hidden.dtype}, got {describe(bias)}")
    check_dense("target", target)
    if target.dtype not in TARGET_DTYPES:
        raise TypeError(f"target must be an integer tensor of class indices, got "
                        f"{describe(target)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"target must have shape {tuple(hidden.shape[:-1])} (hidden's shape "
                         f"without its last dim), got {describe(target)}")
    check_same_device(hidden=hidden, weight=weight, target=target, bias=bias)
    check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    check_bool("check_target", check_target)
    if chunk_size is not None and (not isinstance(chunk_size, numbers.Integral)
                                   or isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
    if weight.shape[0] == 0 and target.numel():
        raise ValueError(f"weight must have at least one row (class), got {describe(weight)}")
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    target1 = target.reshape(-1)
    grad = torch.is_grad_enabled()
    flags = (grad and hidden.requires_grad, grad and weight.requires_grad,
             grad and bias is not None and bias.requires_grad)
    check = bool(check_target) or hidden.device.type == "cpu"
    loss, *_ = torch.ops.speedlight.linear_cross_entropy_fwd(
        hidden2, weight, target1, bias, int(ignore_index), reduction, float(label_smoothing),
        float(z_loss), float(softcap) if softcap is not None else None, *flags,
        int(chunk_size) if chunk_size is not None else None, check)
    return loss.view(target.shape) if reduction == "none" else loss


# --- OpSpec --------------------------------------------------------------------------------

def _make_inputs(case: Case, device) -> dict:
    tokens, hidden_size, vocab = case["tokens"], case["hidden"], case["vocab"]
    softcap = case.flag("softcap")
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
    ignore = case.flag("ignore")
    if ignore == "all":
        target.fill_(-100)
    elif ignore == "some":
        target[torch.rand(target.shape, generator=g) < 0.3] = -100
    return {"hidden": hidden, "weight": weight, "target": target.to(device), "bias": bias,
            "ignore_index": -100, "reduction": case.flag("reduction", "mean"),
            "label_smoothing": float(case.flag("smoothing", 0.0)),
            "z_loss": float(case.flag("zloss", 0.0)), "softcap": softcap,
            "chunk_size": case.flag("chunk")}


def _reference(hidden, weight, target, bias=None, *, chunk_size=None, **options):
    return reference.linear_cross_entropy(hidden, weight, target, bias, **options)


def _cost(case: Case, mode: str) -> Cost:
    n, h, v, e = case["tokens"], case["hidden"], case["vocab"], case.dtype.itemsize
    bias = v if case.flag("bias") else 0
    none = case.flag("reduction") == "none"
    loss_bytes = n * e if none else e
    inputs = (n * h + v * h + bias) * e + 8 * n  # hidden, weight, bias, target
    grads = (n * h + v * h + bias) * e  # d_hidden, d_weight, d_bias
    matmul = 2 * n * v * h  # one [n, h] x [h, v] product (2 FLOP per multiply-add)
    ce = (7 + (22 if case.flag("softcap") else 0)) * n * v  # ~ per logit, as cross_entropy
    if mode == "fwd":
        if none:  # the loss only (the backward recomputes): logits matmul + cross-entropy
            return Cost(flops=matmul + ce, bytes=inputs + loss_bytes)
        # training's forward computes the gradients too: the logits, d_hidden and d_weight
        # matmuls; read the inputs, write the loss and the gradients (the logits never
        # reach memory in the ideal)
        return Cost(flops=3 * matmul + ce, bytes=inputs + loss_bytes + grads)
    if none:  # recompute: read the inputs and the upstream gradients, write the gradients
        return Cost(flops=3 * matmul + ce + n * v, bytes=inputs + loss_bytes + grads)
    # scale the forward's gradients by the upstream gradient in place: read, write each
    return Cost(flops=n * h + v * h + bias, bytes=2 * grads + e)


def _cases(suite: str) -> list[Case]:
    def case(tokens, hidden, vocab, model=None, **flags):
        return Case("linear_cross_entropy",
                    (("tokens", tokens), ("hidden", hidden), ("vocab", vocab)),
                    flags=flags, model=model)

    if suite == "quick":  # (the contract test runs each in 3 dtypes x 2 seeds: kept small)
        return [case(37, 32, 300), case(1, 16, 7),
                case(50, 16, 130, chunk=16),  # 4 chunks, the last ragged
                case(37, 16, 300, chunk=16, ignore="some", smoothing=0.1, zloss=1e-3,
                     softcap=30.0, bias=True),
                case(37, 16, 300, chunk=16, reduction="none", ignore="some"),
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
                case(3, 16, 20011, reduction="sum"),
                # weight and its gradient past 2^31 elements together (Gemma 3's vocabulary)
                case(16384, 4096, 262144, huge=True)]
    return out


def _skip(case: Case, device) -> str | None:
    if torch.device(device).type != "cuda" and case["tokens"] * case["vocab"] > 2 ** 22:
        return ("tokens x vocab > 4M logits: hours of matmuls and interpreted kernels on a "
                "CPU; it runs on a GPU")
    return None


def _for_model(cfg, batch: int, seq: int) -> list[Case]:
    """A causal LM's lm_head and loss over every token (the last of each sequence ignored)."""
    if not cfg.vocab:
        return []
    flags = {"ignore": "some"}
    if cfg.logit_softcap:
        flags["softcap"] = cfg.logit_softcap
    return [Case("linear_cross_entropy",
                 (("tokens", batch * seq), ("hidden", cfg.hidden), ("vocab", cfg.vocab)),
                 flags=flags, model=cfg.name)]


_CALLS = {"linear_cross_entropy_fwd": "fwd", "linear_cross_entropy_bwd": "bwd",
          "linear_cross_entropy_recompute_bwd": "bwd"}


def _case_of(call: str, args) -> Case | None:
    """[tokens, hidden] x [vocab, hidden] of a call, with the options that change the cost
    (the scaling backward reads the forward's gradients: d_hidden, d_weight)."""
    if call not in _CALLS:
        return None
    if call == "linear_cross_entropy_bwd":
        hidden, weight, bias = args["d_hidden"], args["d_weight"], args["d_bias"]
        flags = {"bias": bool(bias.numel()) or None}  # (mean and sum cost the same)
    else:
        hidden, weight, bias = args["hidden"], args["weight"], args.get("bias")
        reduction = args.get("reduction", "none" if "grad_rows" in args else "mean")
        flags = {"bias": bias is not None or None,
                 "reduction": None if reduction == "mean" else reduction,
                 "softcap": args.get("softcap")}
    n = hidden.numel() // hidden.shape[-1] if hidden.dim() and hidden.shape[-1] else 0
    return Case("linear_cross_entropy", (("tokens", n), ("hidden", weight.shape[-1]),
                                         ("vocab", weight.shape[0])), dtype=weight.dtype,
                flags={k: v for k, v in flags.items() if v is not None})


SPEC = OpSpec(
    impl=linear_cross_entropy,
    reference=_reference,
    make_inputs=_make_inputs,
    cost=_cost,
    suites=shapes.suites(_cases),
    grad_inputs=("hidden", "weight", "bias"),
    skip=_skip,
    family="compute-bound",
    notes=("lm_head matmul + cross-entropy in chunks of tokens: one chunk's logits alive at "
           "a time, their gradient written over them by the cross-entropy kernel; d_weight "
           "accumulated in fp32. fwd counts the gradient matmuls (computed there); bwd only "
           "scales."),
    for_model=_for_model,
    aligned=lambda case: case["hidden"] % 16 == 0 and case["vocab"] % 16 == 0,
    case_of=_case_of,
    fuses=("lm_head matmul + cross-entropy in chunks of tokens: the [tokens, vocab] logits "
           "and their gradient are never stored"),
    peers={"liger": "liger_fused_linear_cross_entropy", "torch": "linear_cross_entropy"},
    patches="linear_cross_entropy",
)
