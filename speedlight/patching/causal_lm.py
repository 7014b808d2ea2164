"""A causal LM's loss on speedlight: the model's loss_function on speedlight.cross_entropy,
and the forward that trains without logits (speedlight.linear_cross_entropy over the last
hidden state and the lm_head's weight).

Neither reads a value on the host: the targets are checked by a device-side assertion
(torch._assert_async: an error on a CPU, a device assert on a GPU, as torch's own cross
entropy does) and the ops are called with check_target=False, so a training step needs no
host sync (CUDA graphs can capture it). Everything the forward needs from the model's
modules (its output class, a mixture of experts' load-balancing function) is looked up at
patch time: torch.compile traces the call whole.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import torch

from speedlight.patching.forwards import direct_weight_problem, op

LOSS_KWARG = "speedlight_fused_loss"
# keywords of the loss, which Hugging Face's loss functions take through **kwargs
_LOSS_ARGUMENTS = ("num_items_in_batch", "shift_labels", "ignore_index")


def _assert_targets(target: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every target ignore_index or in [0, vocab): checked on the device, no host read."""
    valid = (target == ignore_index) | ((target >= 0) & (target < vocab))
    torch._assert_async(valid.all(), f"speedlight's patched loss: a label is neither in [0, "
                                     f"{vocab}) (the vocabulary) nor ignore_index={ignore_index}")


def _shifted(labels, shift_labels, ignore_index: int) -> torch.Tensor:
    if shift_labels is not None:
        return shift_labels
    return torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _reduced(loss_sum: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss_sum.device)
    return loss_sum / num_items_in_batch


def causal_lm_loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
                   shift_labels=None, **kwargs):
    """Hugging Face's ForCausalLMLoss on speedlight.cross_entropy: labels shifted by one,
    mean over non-ignored tokens (or sum / num_items_in_batch). The logits are not upcast
    to float32 first: the kernel accumulates in float32 whatever their dtype."""
    from speedlight.ops.cross_entropy import cross_entropy  # imported at patch time
    logits = logits.reshape(-1, vocab_size)
    target = _shifted(labels, shift_labels, ignore_index).reshape(-1).to(logits.device)
    _assert_targets(target, vocab_size, ignore_index)
    if num_items_in_batch is None:
        return cross_entropy(logits, target, ignore_index=ignore_index,
                             check_target=False).float()
    loss = cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum",
                         check_target=False).float()
    return _reduced(loss, num_items_in_batch)


def causal_lm_loss_with(fn):
    """causal_lm_loss on another candidate's cross entropy (candidates.adapt), called with
    cross_entropy's inputs by name."""
    def loss(logits, labels, vocab_size: int, num_items_in_batch=None, ignore_index: int = -100,
             shift_labels=None, **kwargs):
        logits = logits.reshape(-1, vocab_size)
        target = _shifted(labels, shift_labels, ignore_index).reshape(-1).to(logits.device)
        _assert_targets(target, vocab_size, ignore_index)
        reduction = "mean" if num_items_in_batch is None else "sum"
        out = fn(logits=logits, target=target, ignore_index=ignore_index,
                 reduction=reduction).float()
        return out if num_items_in_batch is None else _reduced(out, num_items_in_batch)
    return loss


def fused_causal_lm_loss(hidden, lm_head, labels, *, shift_labels=None,
                         num_items_in_batch=None, ignore_index: int = -100,
                         logits_scale: float = 1.0, softcap: float | None = None, fn=None):
    """Hugging Face's ForCausalLMLoss of lm_head(hidden) (times logits_scale, soft-capped),
    by speedlight.linear_cross_entropy: the logits are never made. Labels shifted by one;
    a mean over non-ignored tokens, or sum / num_items_in_batch (gradient accumulation);
    fp32, as Hugging Face's loss. A logits_scale other than 1 needs a bias-free lm_head.
    fn: another candidate's fused linear cross entropy (candidates.adapt), called with the
    op's inputs by name over the tokens as rows."""
    from speedlight.ops.linear_cross_entropy import linear_cross_entropy  # imported at patch time
    if logits_scale != 1:
        hidden = hidden * logits_scale  # s * lm_head(h) = lm_head(s * h) without a bias
    target = _shifted(labels, shift_labels, ignore_index).to(hidden.device)
    _assert_targets(target, lm_head.weight.shape[0], ignore_index)
    if fn is not None:
        reduction = "mean" if num_items_in_batch is None else "sum"
        loss = fn(hidden=hidden.reshape(-1, hidden.shape[-1]), weight=lm_head.weight,
                  target=target.reshape(-1), bias=lm_head.bias, ignore_index=ignore_index,
                  reduction=reduction, softcap=softcap).float()
        return loss if num_items_in_batch is None else _reduced(loss, num_items_in_batch)
    kwargs = dict(ignore_index=ignore_index, softcap=softcap, check_target=False)
    if num_items_in_batch is None:
        return linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias,
                                    **kwargs).float()
    loss = linear_cross_entropy(hidden, lm_head.weight, target, lm_head.bias, reduction="sum",
                                **kwargs).float()
    return _reduced(loss, num_items_in_batch)


def lm_head_forward(previous, fn=None):
    """The lm_head's own forward, which computes fused_causal_lm_loss instead when the
    patched causal-LM forward passes the loss's arguments: the loss then runs inside the
    lm_head's call, after the hooks that gather its weight (FSDP2 unshards a fully_shard
    lm_head, ZeRO-3 gathers its parameters, in the module's pre-forward hooks), and its
    backward passes the module's post-backward hooks (gradient reduce-scatter). fn:
    another candidate's fused loss (fused_causal_lm_loss's fn)."""
    def forward(self, hidden, *args, **kwargs):
        loss_args = kwargs.pop(LOSS_KWARG, None)
        if loss_args is None:
            return previous(hidden, *args, **kwargs)
        return fused_causal_lm_loss(hidden, self, **loss_args, fn=fn)
    return forward


def _logits_scale(model) -> float:
    """What a family multiplies its lm_head's output by before the loss: Granite divides by
    config.logits_scaling, Falcon-H1 multiplies by model.lm_head_multiplier; 1 elsewhere."""
    scale = 1.0
    divisor = getattr(model.config, "logits_scaling", None)
    if divisor:
        scale /= float(divisor)
    multiplier = getattr(model.model, "lm_head_multiplier", None)
    if multiplier is not None:
        scale *= float(multiplier)
    return scale


def output_class(model) -> type:
    """The output class the causal LM's own forward returns (its return annotation:
    CausalLMOutputWithPast, MoeCausalLMOutputWithPast, MultimodalCausalLMOutputWithPast,
    ...); CausalLMOutputWithPast when it names none."""
    from transformers import modeling_outputs
    from transformers.utils import ModelOutput
    try:
        annotation = inspect.signature(type(model).forward, eval_str=True).return_annotation
    except (NameError, TypeError, ValueError):
        annotation = None
    for candidate in (*getattr(annotation, "__args__", ()), annotation):
        if isinstance(candidate, type) and issubclass(candidate, ModelOutput):
            return candidate
    return modeling_outputs.CausalLMOutputWithPast


def with_keyword(signature: inspect.Signature, name: str, default) -> inspect.Signature:
    """signature with a keyword-only parameter `name` added before its **kwargs."""
    params = list(signature.parameters.values())
    extra = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                              annotation=bool | None)
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    return signature.replace(parameters=params[:at] + [extra] + params[at:])


def causal_lm_forward(model, previous, note_fallback):
    """The causal LM's forward: with labels in training (or skip_logits=True), the base
    model, then fused_causal_lm_loss on its last hidden state, through the lm_head's call;
    otherwise `previous` (the model's forward as it was). Its signature is previous's with
    skip_logits added, so Trainer keeps the dataset's columns and generate passes
    logits_to_keep. An lm_head that is no longer a plain Linear at call time (a PEFT
    adapter or a quantized layer put on after the patch) keeps the normal path, and
    note_fallback(model, reason) records why. ValueError if previous takes *args."""
    signature = inspect.signature(previous)
    params = signature.parameters
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        raise ValueError(f"its forward takes *args {signature}")
    positional = tuple(n for n, p in params.items()
                       if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    keep_default = params["logits_to_keep"].default if "logits_to_keep" in params else 0
    output = output_class(model)
    known = frozenset(f.name for f in dataclasses.fields(output))
    op("linear_cross_entropy")  # imported now, not inside a traced call
    balance = None
    if hasattr(model, "router_aux_loss_coef"):  # a mixture of experts: the family's own function
        balance = importlib.import_module(type(model).__module__).load_balancing_loss_func

    def forward(self, *args, skip_logits: bool | None = None, **kwargs):
        arguments = dict(zip(positional, args))
        arguments.update(kwargs)
        labels = arguments.pop("labels", None)
        keep = arguments.pop("logits_to_keep", keep_default)
        fused = labels is not None and (self.training if skip_logits is None else skip_logits)
        scale = _logits_scale(self)
        if (not fused or not isinstance(keep, int) or keep != 0 or "fused_lm_head" in arguments
                or (scale != 1 and self.lm_head.bias is not None)):
            return previous(*args, **kwargs)  # (TRL's fused_lm_head computes its own loss)
        problem = direct_weight_problem(self.lm_head)
        if problem is not None:
            note_fallback(self, f"lm_head: {problem}")
            return previous(*args, **kwargs)
        loss_args = {k: arguments.pop(k) for k in _LOSS_ARGUMENTS if k in arguments}
        if balance is not None and arguments.get("output_router_logits") is None:
            arguments["output_router_logits"] = bool(getattr(self.config, "output_router_logits",
                                                             False))
        outputs = self.model(**arguments)
        # through the lm_head's call, so that hooks gathering a sharded weight run first
        # (FSDP2's fully_shard of the lm_head, DeepSpeed ZeRO-3): see lm_head_forward
        loss = self.lm_head(outputs[0], **{LOSS_KWARG: dict(
            labels=labels, **loss_args, logits_scale=scale,
            softcap=getattr(self.config, "final_logit_softcapping", None))})
        fields = {k: v for k, v in outputs.items() if k != "last_hidden_state" and k in known}
        if balance is not None and arguments["output_router_logits"]:
            # the load-balancing loss of the family's own function, added as its forward does
            aux = balance(outputs.router_logits, self.num_experts, self.num_experts_per_tok,
                          arguments.get("attention_mask"))
            loss = loss + self.router_aux_loss_coef * aux.to(loss.device)
            fields["aux_loss"] = aux
        return output(loss=loss, logits=None, **fields)

    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = with_keyword(signature.replace(parameters=[this, *params.values()]),
                                         "skip_logits", None)
    return forward
