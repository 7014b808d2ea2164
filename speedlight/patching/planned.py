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

from speedlight import plans

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
            return None, "no GPU: nothing is timed, every kind asked for applied unmeasured"
        rank0 = not (torch.distributed.is_available() and torch.distributed.is_initialized()
                     and torch.distributed.get_rank() != 0)
        found = plans.shared(plans.cached(model) if rank0 else None)
        if found is None:
            return None, plans.HINT
        return found, f"the cached plan measured at {_where(found)}"
    if isinstance(plan, plans.Plan):
        found = plans.Plan.from_json(plan.to_json(), "plan (a speedlight.plans.Plan)")
    elif isinstance(plan, dict):
        found = plans.Plan.from_json(plan, "plan (a plan's JSON dict)")
    elif isinstance(plan, (str, os.PathLike)):
        found = plans.load_plan(plan)
    else:
        raise TypeError(f"plan must be 'auto', 'measure', None, a plan file's path, a "
                        f"speedlight.plans.Plan or its JSON dict; got {type(plan).__name__}")
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
    """The kinds to apply: those asked for that the plan did not drop."""
    if plan is None:
        return dict(asked)
    keep = plan.wanted()
    return {k: (v if keep.get(k, True) else False) for k, v in asked.items()}


def statuses(asked: dict[str, bool | str], plan: plans.Plan | None) -> dict[str, str]:
    """Per kind asked for: kept by measurement, dropped by measurement (with the numbers),
    or applied unmeasured."""
    out = {}
    for kind, on in asked.items():
        if not on:
            continue
        decision = plan.decisions.get(kind) if plan is not None else None
        if decision is None or decision.verdict == "unmeasured":
            why = decision.reason if decision is not None else "no measured plan"
            out[kind] = f"applied unmeasured ({why})"
        else:
            out[kind] = f"{decision.verdict} by measurement ({decision.detail()})"
    return out
