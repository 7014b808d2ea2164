"""The patched model against the original, both judged against a float64 copy.

The same rule as `speedlight verify`, one level up: the patched model's logits, loss and
every parameter gradient may have at most k times the error the original model has in
the same dtype (each against the float64 copy of the original), under the dtype's ceiling.
A patched model that trains without logits (linear_cross_entropy) has its logits checked
on its normal (eval) path.
"""

from __future__ import annotations

import copy

import torch

from speedlight.spec import TOLERANCES, dtype_name
from speedlight.verify.compare import judge

# A float64 copy costs 8 bytes a parameter (plus activations); past this, the patched
# model is compared with the original directly.
MAX_FP64_PARAMS = 200_000_000


def patch_coverage(report) -> dict:
    """What a PatchReport swapped, as the model check records it: each kind with its
    count, and a sentence on the decoder-layer fusion (how many layers, or why none)."""
    kinds = {kind: len(paths) for kind, paths in report.patched.items()}
    layers = kinds.get("decoder_layer", 0)
    if layers:
        forms = sorted({p.rsplit("(", 1)[-1].split(":")[0] for p in report.patched["decoder_layer"]})
        fusion = (f"applied: {layers} decoder layer{'s' if layers != 1 else ''} "
                  f"({', '.join(forms)}) add the residual and normalize in one add_rms_norm")
    else:
        why = [b for a, b in report.not_patched if a.startswith("decoder_layer")]
        fusion = "not applied: " + (why[0] if why else "not asked for")
    return {"kinds": kinds, "layer_fusion": fusion}


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _to64(x):
    if isinstance(x, torch.Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: _to64(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to64(v) for v in x)
    return x


def _outputs(model, inputs, loss_fn, train: bool, amp: torch.dtype | None = None,
             loss_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """logits, loss and (with train) the gradient of every parameter, by name; under
    torch.autocast in amp when given, the gradients those of loss * loss_scale divided by
    loss_scale (what a gradient scaler's unscale gives)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    device = next(model.parameters()).device.type
    with torch.set_grad_enabled(train), torch.autocast(device, dtype=amp or torch.bfloat16,
                                                       enabled=amp is not None):
        out = _call(model, inputs)
        loss = loss_fn(out)
        got = {}
        logits = getattr(out, "logits", None)
        if logits is None and train and model.training:
            # a patched model trains on linear_cross_entropy and returns no logits: check
            # them on the normal path (eval mode keeps it) too, so both paths are covered
            with torch.no_grad():
                model.eval()
                try:
                    logits = getattr(_call(model, inputs), "logits", None)
                finally:
                    model.train()
        if isinstance(logits, torch.Tensor):
            got["logits"] = logits.detach()
        got["loss"] = loss.detach().reshape(1)
        if train:
            grads = torch.autograd.grad(loss * loss_scale if loss_scale != 1 else loss,
                                        [p for _, p in params], allow_unused=True)
            got.update({f"grad:{n}": g / loss_scale if loss_scale != 1 else g
                        for (n, _), g in zip(params, grads) if g is not None})
    return got


def check_models(original: torch.nn.Module, patched: torch.nn.Module, inputs, loss_fn, *,
                 train: bool, amp: torch.dtype | None = None, loss_scale: float = 1.0) -> dict:
    """amp: both models run under torch.autocast in that dtype (the float64 copy without
    it), judged with that dtype's tolerance; loss_scale: the factor a gradient scaler
    multiplies the loss by before the backward (fp16), divided out of the gradients."""
    dtype = amp or next(original.parameters()).dtype
    tol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    n_params = sum(p.numel() for p in original.parameters())
    ours = _outputs(patched, inputs, loss_fn, train, amp, loss_scale)
    theirs = _outputs(original, inputs, loss_fn, train, amp, loss_scale)
    if n_params <= MAX_FP64_PARAMS:
        ref_model = copy.deepcopy(original).double()
        if hasattr(ref_model, "set_experts_implementation"):
            # an MoE's grouped_mm takes no float64: its per-expert loop computes the same
            ref_model.set_experts_implementation("eager")
        ref = _outputs(ref_model, _to64(inputs), loss_fn, train)
        basis = "float64 copy of the original model"
        del ref_model
    else:
        ref, basis = {k: v.double() for k, v in theirs.items()}, \
            "the original model itself (too large for a float64 copy)"
    checks = []
    for name, r in ref.items():
        o, t = ours.get(name), theirs.get(name)
        c = judge(name, o.to(t.dtype) if o is not None and t is not None else o, r,
                  t if t is not None else r.to(dtype), tol)
        checks.append(c.to_json())
    failed = [c for c in checks if not c["passed"]]
    worst = max(checks, key=lambda c: c["ratio"]) if checks else None
    return {"dtype": dtype_name(dtype), "reference": basis, "train": train,
            "tolerance": {"k": tol.k, "floor": tol.floor, "ceiling": tol.ceiling},
            "passed": not failed, "checks": checks, "failed": [c["name"] for c in failed],
            "worst": {"name": worst["name"], "ratio": worst["ratio"],
                      "rel_l2": (worst["ours"] or {}).get("rel_l2")} if worst else None,
            "loss": {"original": float(theirs["loss"].item()), "patched": float(ours["loss"].item()),
                     "float64": float(ref["loss"].item())}}
