"""`speedlight plan` and speedlight.plan(model, example_inputs): keep the kinds of
speedlight.patch that measure faster on this GPU at this model's shapes.

A composer: it patches (patching), times (bench's timer and statistics) and verifies
(verify's judge) one decoder layer's units kind by kind (measure.py), decides
(decide.py), and writes the plan (speedlight.plans, which patch reads) into the user's
cache. Without a GPU nothing is timed: every kind is unmeasured, patch's defaults stay,
and `speedlight plan --model MODEL` adds the projected floors of `profile --project`.
"""

from __future__ import annotations

import datetime as _dt

import torch

from speedlight import plans


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _batch_seq(inputs) -> tuple[int, int]:
    from speedlight.planning.measure import labels_of

    ids = labels_of(inputs)
    if ids is None or ids.dim() == 0:
        return 1, 1
    return (int(ids.shape[0]), int(ids.shape[-1])) if ids.dim() > 1 else (1, int(ids.shape[0]))


def check_inputs(example_inputs) -> None:
    """TypeError unless example_inputs is what a model is called with."""
    ok = isinstance(example_inputs, (dict, tuple, list)) or torch.is_tensor(example_inputs)
    if not ok:
        raise TypeError("example_inputs must be what the model is called with: a dict of "
                        "keyword arguments, a tuple or list of positional arguments, or a "
                        f"tensor of token ids; got {type(example_inputs).__name__}")
    if isinstance(example_inputs, dict) and not all(isinstance(k, str) for k in example_inputs):
        raise TypeError("example_inputs: a dict of keyword arguments takes str keys; got "
                        f"{[k for k in example_inputs if not isinstance(k, str)][:3]}")


def check_kinds(kinds, known: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds asked for (all of patch's when None): ValueError naming any kind patch does
    not know, TypeError for a string or a non-iterable."""
    if kinds is None:
        return known
    if isinstance(kinds, (str, bytes)) or not hasattr(kinds, "__iter__"):
        raise TypeError(f"kinds must be a list of kind names ({', '.join(known)}); got "
                        f"{type(kinds).__name__} {kinds!r}"[:300])
    asked = tuple(kinds)
    unknown = [k for k in asked if k not in known]
    if unknown:
        raise ValueError(f"kinds: unknown {', '.join(map(repr, unknown))}; speedlight.patch "
                         f"knows {', '.join(known)}")
    if not asked:
        raise ValueError(f"kinds is empty: name at least one of {', '.join(known)}")
    return tuple(dict.fromkeys(asked))


def compile_modes() -> tuple[str, ...]:
    """torch.compile's modes in this torch."""
    import torch._inductor

    return tuple(torch._inductor.list_mode_options())


def check_compile_mode(mode) -> None:
    if mode is None:
        return
    known = compile_modes()
    if mode not in known:
        raise ValueError(f"compile_mode must be None (eager) or one of torch.compile's modes "
                         f"({', '.join(known)}); got {mode!r}")


def plan(model: torch.nn.Module, example_inputs, *, compile_mode: str | None = None,
         kinds=None, timer=None, save: bool = True, projected: dict | None = None,
         autocast: str | None = None) -> plans.Plan:
    """Measure which of patch's kinds to keep for `model` on the GPU it sits on, at the
    shapes of `example_inputs` (what the model is called with: a dict of keyword
    arguments, a tuple, or one tensor of token ids). compile_mode: time both sides under
    torch.compile in that mode. kinds: the kinds to measure (default: all of patch's).
    timer: how a side is timed (default: bench's protocol on a GPU; on a CPU nothing is
    timed). Under torch.distributed rank 0 measures and every rank gets its plan. The plan
    is written to the cache (plans.path_for) unless save=False."""
    from speedlight.patching.families import FAMILIES
    from speedlight.patching.patcher import _base_model
    from speedlight.patching.patcher import kinds as all_kinds
    from speedlight.planning import decide, measure

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_inputs(example_inputs)
    asked = check_kinds(kinds, all_kinds())
    check_compile_mode(compile_mode)
    model = _base_model(model)
    if _rank() != 0:
        return plans.shared(None)
    batch, seq = _batch_seq(example_inputs)
    key = plans.key_for(model, batch=batch, seq=seq, compile_mode=compile_mode,
                        autocast=autocast)
    device = next(model.parameters()).device
    if timer is None and device.type == "cuda":
        timer = measure.gpu_timer(device)
    family = FAMILIES.get(key["model_type"])
    decisions: dict[str, plans.Decision] = {}
    shapes: dict = {}
    if timer is None:
        note = ("no GPU: nothing is timed; every kind is unmeasured and patch applies today's "
                "defaults" + ("; the projected floors below are the only estimate"
                              if projected else ""))
        decisions = {k: plans.Decision(k, "unmeasured", "no GPU: nothing timed")
                     for k in asked}
    elif family is None:
        note = f"speedlight.patch does not know {key['model_type']!r}: nothing to measure"
        decisions = {k: plans.Decision(k, "unmeasured", note) for k in asked}
    else:
        note = f"timed on {key['gpu']}: one decoder layer's units, forward and backward"
        units = measure.units(model, family)
        has_labels = measure.labels_of(example_inputs) is not None
        todo = [k for k in asked if k in units and (units[k] != measure.LOSS or has_labels)]
        captured = measure.capture_arguments(model, example_inputs, {units[k] for k in todo})
        trials = {}
        grads = {p: p.grad for p in model.parameters()}  # the timed steps leave gradients
        try:
            for kind in todo:
                c = captured[units[kind]]
                shapes[units[kind]] = [list(t.shape) for t in c.args if torch.is_tensor(t)]
                trials[kind] = measure.trial(model, example_inputs, kind, units[kind], c,
                                             timer, compile_mode=compile_mode)
        finally:  # the model's gradients as they were: a training step after it starts clean
            for p, g in grads.items():
                p.grad = g
        decisions = decide.decide_all(trials)
        for k in asked:
            decisions.setdefault(k, plans.Decision(k, "unmeasured", "no unit of this kind in "
                                                   "the model's first decoder layer"))
        decisions = {k: decisions[k] for k in asked}
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    result = plans.Plan(key, decisions, timer is not None, note, shapes, projected, created)
    if save:
        plans.save(result)
    return plans.shared(result)


_measured = plan  # patch's keyword `plan` hides the function's name inside it


def patch(model: torch.nn.Module, *, plan="auto", example_inputs=None, compile_mode=None,
          **kinds):
    """speedlight.patch, which also measures: plan="measure" runs speedlight.plan(model,
    example_inputs) first and applies what it kept; every other plan (auto, a path, a
    plan, None) and keyword go to speedlight.patching.apply_kinds as they are."""
    from speedlight.patching import apply_kinds

    if isinstance(plan, str) and plan == "measure":
        if example_inputs is None:
            raise ValueError("plan='measure' needs example_inputs: what the model is called "
                             "with (a dict of keyword arguments, a tuple, or token ids)")
        plan = _measured(model, example_inputs, compile_mode=compile_mode)
    return apply_kinds(model, plan=plan, **kinds)
