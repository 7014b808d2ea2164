"""patch(model, plan=...): which kinds a measured plan (speedlight.plans) lets patch apply.

The plan is only read here; measuring one is the composer's job (speedlight.plan, or
speedlight.patch(model, plan="measure", example_inputs=...), which measures and hands the
plan to patch). Under torch.distributed rank 0's plan is broadcast, so every replica
patches the same kinds. Every plan is checked whole (plans.check_document): a bad one
given as plan= is a PlanError (a ValueError) naming the file and what is wrong; a bad or
stale file in the cache is named in a PlanWarning and ignored (plans.cached); a valid plan
for another model, GPU or versions is warned about and not used.
"""

from __future__ import annotations

import os
import warnings

import torch

from speedlight import plan_prior, plans

MEASURE_HINT = ("plan='measure' is measured by speedlight.plan(model, example_inputs), a "
                "composer: call speedlight.patch(model, plan='measure', example_inputs=...) "
                "or patch(model, plan=speedlight.plan(model, example_inputs))")


def _on_gpu(model: torch.nn.Module) -> bool:
    first = next(model.parameters(), None)
    return first is not None and first.device.type == "cuda"


def resolve_plan(model: torch.nn.Module, plan) -> tuple[plans.Plan | None, str]:
    """The plan patch applies to `model` (None: today's kinds) and a note for the report
    saying where it came from, or why none is used."""
    if plan is None:
        return None, "plan=None: every kind asked for, unmeasured"
    if isinstance(plan, str) and plan == "measure":
        raise ValueError(MEASURE_HINT)
    found: plans.Plan | None
    if isinstance(plan, str) and plan == "auto":
        if not _on_gpu(model):
            shipped = plan_prior.prior_summary(plan_prior.load_prior())
            return None, ("no GPU: nothing is timed, every kind asked for applied unmeasured "
                          f"(the prior for GPUs: {shipped})")
        rank0 = not (torch.distributed.is_available() and torch.distributed.is_initialized()
                     and torch.distributed.get_rank() != 0)
        found = plans.shared(plans.cached(model) if rank0 else None)
        if found is not None:
            try:
                check_choices(found, "the cached plan")
            except plans.PlanError as e:
                warnings.warn(f"speedlight: ignoring {e}", plans.PlanWarning, stacklevel=3)
                found = None
        if found is None:
            first = next(model.parameters())
            prior, why = plan_prior.prior_plan(model, plan_prior.arch_of(first.device))
            return prior, f"{plans.HINT}; meanwhile {why}"
        return found, f"the cached plan measured at {_where(found)}"
    if isinstance(plan, plans.Plan):
        source = "plan (a speedlight.plans.Plan)"
        found = plans.Plan.from_json(plan.to_json(), source)
    elif isinstance(plan, dict):
        source = "plan (a plan's JSON dict)"
        found = plans.Plan.from_json(plan, source)
    elif isinstance(plan, (str, os.PathLike)):
        source = f"plan file {str(plan)!r}"
        found = plans.load_plan(plan)
    else:
        raise TypeError(f"plan must be 'auto', 'measure', None, a plan file's path, a "
                        f"speedlight.plans.Plan or its JSON dict; got {type(plan).__name__}")
    check_choices(found, source)
    if _on_gpu(model):
        found = plans.shared(found)
    stale = plans.mismatch(found, model)
    if stale is not None:
        note = f"the plan given is not for this model here ({stale}): not used"
        warnings.warn(f"speedlight.patch: {note}; every kind asked for is applied unmeasured",
                      plans.PlanWarning, stacklevel=3)
        return None, note
    return found, f"the plan given, measured at {_where(found)}"


def _where(plan: plans.Plan) -> str:
    k = plan.key
    return (f"batch {k.get('batch')} x seq {k.get('seq')} (buckets), {k.get('compile')}, "
            f"{k.get('gpu')}")


def wanted(asked: dict[str, bool | str], plan: plans.Plan | None) -> dict[str, bool | str]:
    """What to apply per kind: a kind asked for by True takes the plan's choice (False
    where it dropped the kind, the chosen candidate where it kept one); a candidate named
    by the caller, or False, stands; mlp="fused" stays unless the plan dropped the MLP or
    chose another than speedlight."""
    if plan is None:
        return dict(asked)
    keep = plan.wanted()
    out = {}
    for kind, value in asked.items():
        decided = keep.get(kind, True)
        if value is True:
            out[kind] = decided
        elif value == "fused" and kind == "mlp":
            out[kind] = value if decided in (True, "speedlight") else decided
        else:
            out[kind] = value
    return out


def check_choices(plan: plans.Plan, source: str) -> None:
    """PlanError unless every decision's choice is a candidate of its kind here."""
    from speedlight.patching import installs

    for kind, d in plan.decisions.items():
        known = installs.names_for(kind)
        if d.choice is not None and d.choice != "model" and d.choice not in known:
            raise plans.PlanError(f"{source}: decisions: {kind}: choice {d.choice!r} is no "
                                  f"candidate of {kind} ({', '.join(installs.names_for(kind))})")


def statuses(asked: dict[str, bool | str], plan: plans.Plan | None) -> dict[str, str]:
    """Per kind asked for: kept or dropped by measurement or by the prior (with the numbers
    and the candidate chosen), or applied unmeasured."""
    out = {}
    for kind, on in asked.items():
        if not on:
            continue
        decision = plan.decisions.get(kind) if plan is not None else None
        if decision is None or decision.verdict == "unmeasured":
            why = decision.reason if decision is not None else "no measured plan"
            out[kind] = f"applied unmeasured ({why})"
        else:
            by = "the prior" if plan.origin == "prior" else "measurement"
            named = f"{decision.choice}: " if decision.choice not in (None, "speedlight") \
                and decision.verdict == "kept" else ""
            said = f"{decision.verdict} by {by} ({named}{decision.detail()})"
            asked_by_name = isinstance(on, str) and not (kind == "mlp" and on == "fused")
            out[kind] = f"{on} applied as asked; {said}" if asked_by_name else said
    return out
