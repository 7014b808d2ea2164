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
         autocast: str | None = None, verify: bool | None = None,
         candidates=None) -> plans.Plan:
    """Choose, for each of patch's kinds, the fastest correct implementation for `model` on
    the GPU it sits on, at the shapes of `example_inputs` (what the model is called with:
    a dict of keyword arguments, a tuple, or one tensor of token ids): every candidate
    (speedlight/candidates) is verified against float64 on the kind's unit, and the
    admitted ones timed against the model's own (measure.py, decide.py).

    compile_mode: time every side under torch.compile in that mode. kinds: the kinds to
    measure (default: all of patch's). candidates: the candidates' names to try (default:
    every one of each kind). timer: how a side is timed (default: bench's protocol on a
    GPU; on a CPU nothing is timed). verify: run and judge the candidates (default: when
    timing; on a CPU without a timer, True discovers and verifies them, False only says
    which are offered). Under torch.distributed rank 0 measures and every rank gets its
    plan. The plan is written to the cache (plans.path_for) unless save=False."""
    from speedlight.patching.families import FAMILIES
    from speedlight.patching.patcher import base_model
    from speedlight.patching.patcher import kinds as all_kinds
    from speedlight.planning import decide, measure

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_inputs(example_inputs)
    asked = check_kinds(kinds, all_kinds())
    check_compile_mode(compile_mode)
    tried_names = check_candidates(candidates)
    model = base_model(model)
    if _rank() != 0:
        return plans.shared(None)
    batch, seq = _batch_seq(example_inputs)
    key = plans.key_for(model, batch=batch, seq=seq, compile_mode=compile_mode,
                        autocast=autocast)
    device = next(model.parameters()).device
    if timer is None and device.type == "cuda":
        timer = measure.gpu_timer(device)
    verify = timer is not None if verify is None else bool(verify)
    family = FAMILIES.get(key["model_type"])
    decisions: dict[str, plans.Decision] = {}
    shapes: dict = {}
    if family is None:
        note = f"speedlight.patch does not know {key['model_type']!r}: nothing to measure"
        decisions = {k: plans.Decision(k, "unmeasured", note) for k in asked}
    else:
        if timer is not None:
            note = (f"timed on {key['gpu']}: every candidate of each kind verified against "
                    "float64 and timed on one decoder layer's units, forward and backward")
        else:
            note = ("no GPU: nothing is timed; every kind is unmeasured and patch applies "
                    "today's defaults; the candidates are " + (
                        "verified against float64 on one decoder layer's units" if verify
                        else "listed as offered or not, unverified")
                    + ("; the projected floors below are the only estimate" if projected
                       else ""))
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
                names = candidate_names(kind, tried_names)
                offered = _offered(kind, device, compile_mode)
                if verify:
                    trials[kind] = measure.trial(model, example_inputs, kind, units[kind], c,
                                                 timer, names=names, compile_mode=compile_mode,
                                                 offered=offered)
                else:
                    trials[kind] = measure.discover(model, kind, units[kind], names, offered)
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


def check_candidates(names) -> tuple[str, ...] | None:
    """The candidates' names asked for (None: all), ValueError naming an unknown one."""
    from speedlight.patching import installs
    from speedlight.patching.patcher import kinds

    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"candidates must be a list of candidates' names; got "
                        f"{type(names).__name__}")
    names = tuple(names)
    known = dict.fromkeys(n for kind in kinds() for n in installs.names_for(kind))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"candidates: unknown {', '.join(map(repr, unknown))}; known: "
                         f"{', '.join(known)}")
    return names


def candidate_names(kind: str, asked: tuple[str, ...] | None) -> tuple[str, ...]:
    """The candidates tried for a kind: every name its keyword of patch takes but the
    model's own (always run: it is the yardstick), or those of `asked` among them."""
    from speedlight.patching import installs

    names = [n for n in installs.names_for(kind) if n != "model"]
    return tuple(n for n in names if asked is None or n in asked)


def _offered(kind: str, device: torch.device, compile_mode: str | None):
    """offered(name): why the plan does not offer a candidate before installing it (an
    implementation no GPU has verified, one that runs no backward here, a compile that
    every side already has), or None."""
    from speedlight import registry
    from speedlight.patching import installs

    unverified, unavailable = set(), {}
    for op in installs.KIND_OPS[kind]:
        if op in registry.BUILTIN_OPS:
            spec = registry.builtin_spec(op)
            for i, impl in spec.implementations.items():
                if impl.unavailable(device):
                    unavailable[spec.label(i)] = impl.unavailable(device)
                elif not impl.verified:
                    unverified.add(spec.label(i))

    def offered(name: str) -> str | None:
        if name in unavailable:
            return unavailable[name]
        if name in unverified:
            return (f"no GPU has verified {name} yet: selectable by name "
                    f"(patch(model, {kind}={name!r})), never chosen by a plan")
        if name == "torch-compile" and compile_mode is not None:
            return f"every side already runs under torch.compile (mode {compile_mode})"
        if name == "flex-attention" and device.type != "cuda":
            return "FlexAttention runs no backward on a CPU"
        return None
    return offered


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
