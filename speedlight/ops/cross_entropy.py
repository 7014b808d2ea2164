"""Cross-entropy over logits [..., vocab] with integer targets [...]: the loss and its
gradient in one pass over the logits (the backward only scales that gradient), with
torch's reductions, ignore_index and label smoothing, plus z-loss and logit soft-capping.
fp32 arithmetic whatever the logits dtype; the loss has the logits' dtype, as in torch.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Optional

import torch

from speedlight import shapes
from speedlight.ops._checks import check_bool, check_dense, check_choice, check_same_device, check_tensor
from speedlight.ops._dtensor import local_reduction_refused, local_rows
from speedlight.ops._suites import is_call_of, rows_case, skip_huge_on_cpu
from speedlight.ops.cross_entropy_launch import (  # noqa: F401 (the op's launcher API)
    cross_entropy_bwd,
    cross_entropy_fwd,
    row_grad_scale,
)
from speedlight.ops.registration import like, register_op
from speedlight.runtime import describe
from speedlight.spec import (Case, Chain, Cost, KernelDesign, OpSpec, generator, inject_nonfinite,
                             rand_tensor)

REDUCTIONS = ("mean", "sum", "none")
TARGET_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class CrossEntropyOutput(NamedTuple):
    """What cross_entropy returns when any of return_z_loss, return_token_accuracy,
    return_predicted_tokens is asked for; the fields not asked for are None."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


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
    return cross_entropy_bwd(dlogits, row_grad_scale(dloss, divisor))


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
    cross_entropy_bwd(logits, row_grad_scale(dloss, divisor), out=logits)


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

def ignore_and_class_weight(case: Case, target: torch.Tensor, g: torch.Generator, vocab: int,
                            device) -> torch.Tensor | None:
    """A loss case's flags on its targets (ignore="all" or "some": -100 in every or about
    30% of the places, drawn from g) and its class weights (weight: in [0, 2), every
    seventh class weighed 0), shared by cross_entropy's and linear_cross_entropy's inputs."""
    ignore = case.flag("ignore")
    if ignore == "all":
        target.fill_(-100)
    elif ignore == "some":
        target[torch.rand(target.shape, generator=g) < 0.3] = -100
    if not case.flag("weight"):
        return None
    weight = rand_tensor((vocab,), case.with_(layout="contiguous"), device,
                         dist="uniform", scale=2.0, salt=3)
    weight[::7] = 0.0
    return weight


def make_inputs(case: Case, device) -> dict:
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
    weight = ignore_and_class_weight(case, target, g, vocab, device)
    extras = bool(case.flag("extras"))
    return {"logits": logits, "target": target.to(device), "ignore_index": -100,
            "reduction": case.flag("reduction", "mean"),
            "label_smoothing": float(case.flag("smoothing", 0.0)),
            "z_loss": float(case.flag("zloss", 0.0)), "softcap": softcap, "weight": weight,
            "return_z_loss": extras, "return_token_accuracy": extras,
            "return_predicted_tokens": extras}


def cost(case: Case, mode: str) -> Cost:
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


def cases(suite: str) -> list[Case]:
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


def skip(case: Case, device) -> str | None:
    return skip_huge_on_cpu(case, device, "tokens x vocab > 2^31")


_TWO_PASS = ("a row longer than 8192 does not fit registers: its logits are read twice, for "
             "the statistics and for the gradient (the second read from L2 while the rows in "
             "flight fit there): 3 row passes for a compulsory 2")
_SPLIT = ("fewer rows than SMs: each row is cut into spans, one program each; the stats "
          "kernel reads its span, the finish kernel reads it again to write the gradient "
          "(3 row passes for a compulsory 2) plus 5 fp32 statistics per span")


def for_model(cfg, batch: int, seq: int) -> list[Case]:
    """A causal LM's loss: every token's logits against the next token (HF pads the
    shifted labels with ignore_index, so the last token of each sequence is ignored).
    Soft-capping, where a model has it, is applied by the model before its loss."""
    if not cfg.vocab:
        return []
    return [Case("cross_entropy", (("tokens", batch * seq), ("vocab", cfg.vocab)),
                 flags={"ignore": "some"}, model=cfg.name)]


def case_of(call: str, args) -> Case | None:
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


def loss_chains(g) -> list[tuple]:
    """Each log_softmax + nll_loss (after an upcast of the logits, when there is one) in a
    profiled forward: (forward ops, the op the logits enter, the logits, the loss op). The
    recognisers of cross_entropy and linear_cross_entropy start from these."""
    found = []
    for r in g.fwd:
        if r["name"] not in ("nll_loss_forward", "nll_loss2d_forward"):
            continue
        ls = g.input_base(r["index"], 0)
        if g.name(ls) != "_log_softmax":
            continue
        fwd, start = {ls, r["index"]} | g.views_between(ls, r["index"]), ls
        up = g.input_base(ls, 0)
        if g.name(up) == "_to_copy":
            fwd |= {up} | g.views_between(up, ls)
            start = up
        found.append((fwd, start, g.row(start)["inputs"][0], r))
    return found


def recognise(g, calls) -> list[Chain]:
    """log_softmax + nll_loss, and the upcast before it: the logits over [tokens, vocab]."""
    return [Chain("log_softmax + nll_loss" + (" after an fp32 upcast" if g.name(start) ==
                                              "_to_copy" else ""), fwd, loss["module"],
                  rows_case("cross_entropy", g.tensor(logits), "vocab", rows="tokens"))
            for fwd, start, logits, loss in loss_chains(g)]


SPEC = OpSpec(
    impl=cross_entropy,
    make_inputs=make_inputs,
    cost=cost,
    suites=shapes.suites(cases),
    grad_inputs=("logits",),
    skip=skip,
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
    for_model=for_model,
    case_of=case_of,
    recognise=recognise,
    fuses="log_softmax + nll_loss without the [tokens, vocab] log-probabilities",
    peers={"liger": "liger_cross_entropy"},
    patches="cross_entropy",
)
