"""Measuring each kind's candidates on one layer of the model, as the model runs it.

Per kind, a unit: the first decoder layer's module that kind replaces (its norm, MLP,
attention; the whole layer for decoder_layer), or the head and loss for the two loss
kinds. Its inputs are captured from one real forward of the model (forward hooks, with
keyword arguments). The model's own unit runs first: its outputs and gradients are the
yardstick of PyTorch's error, and it is timed. Then each candidate of the kind
(installs.names_for: speedlight's kernels, torch's fused functions, Liger's, SDPA's
backends, the compiled region...) is installed alone by speedlight.patch(<kind>=<name>):
one patch refuses (no form of the model's variant, cannot run here) is not offered, with
the patch's reason; one that raises or whose outputs and gradients fail verify's rule
against the original unit run in float64 (error at most k times PyTorch's own in the
model's dtype) is excluded, with its error ratio; the rest are admitted and timed with
bench's timer (warm-up, L2 flush, host-lead spin, samples until the median is steady) and
their peak memory recorded. Attention's inputs are captured again under each candidate:
its mask is built for the implementation in use.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch

from speedlight.planning.decide import (ADMITTED, EXCLUDED, MODEL, NOT_OFFERED, OFFERED,
                                        KindTrial, Timing, Tried)

LOSS = "lm_head + loss"
# a timer: (step(k), prepare(k), kind, candidate) -> seconds per call; the model's own is
# the candidate "model"
Timer = Callable[[Callable[[int], Any], Callable[[int], Any], str, str], list[float]]


def sides(kind: str, name: str) -> dict:
    """patch's keywords of one side of a kind's trial (every other kind is off): the
    candidate `name` ("model": the model's own). decoder_layer is timed on top of
    speedlight's rms_norm on both sides."""
    base = {"rms_norm": True} if kind == "decoder_layer" else {}
    return base if name == MODEL else dict(base, **{kind: name})


@dataclasses.dataclass
class Captured:
    args: tuple
    kwargs: dict


def units(model: torch.nn.Module, family) -> dict[str, str]:
    """kind -> the path of the module timed for it (LOSS for the loss kinds)."""
    from speedlight.patching import decoder_layer

    layers = decoder_layer.layer_modules(model, family)
    if not layers:
        return {}
    path, layer = layers[0]
    found: dict[str, str] = {"decoder_layer": path}
    names = {type(m).__name__: [] for _, m in layer.named_modules()}
    for sub, m in layer.named_modules():
        names[type(m).__name__].append(sub)
    norms = names.get(family.norm_class, [])
    in_place = [n for n in norms if n.rsplit(".", 1)[-1] in family.in_place_norms]
    if norms:
        found["rms_norm"] = f"{path}.{(in_place or norms)[0]}"
    mlps = names.get(family.mlp_class) or next(
        (names[n] for n in family.experts_classes if names.get(n)), [])
    if mlps:
        found["mlp"] = f"{path}.{mlps[0]}"
    if names.get(family.attention_class):
        found["rope"] = found["attention"] = f"{path}.{names[family.attention_class][0]}"
    if isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        found["cross_entropy"] = found["linear_cross_entropy"] = LOSS
    for kind, _ in family.kept:  # the family keeps the model's own (patch reports why)
        found.pop(kind, None)
    return found


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)


def capture_arguments(model: torch.nn.Module, inputs, paths: set[str]) -> dict[str, Captured]:
    """The arguments each module in `paths` (LOSS: the lm_head) is called with in one
    forward of the model, detached."""
    modules = dict(model.named_modules())
    got: dict[str, Captured] = {}
    hooks = []
    for path in paths:
        module = model.lm_head if path == LOSS else modules[path]

        def hook(_m, args, kwargs, _out, path=path):
            if path not in got:
                got[path] = Captured(*_detached((args, kwargs)))
        hooks.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            _call(model, _without_cache(model, inputs))
    finally:
        for h in hooks:
            h.remove()
    return got


def _without_cache(model: torch.nn.Module, inputs):
    """The inputs with use_cache=False where the model takes it and they do not say: a
    captured key/value cache would grow with every call of the unit (training keeps none)."""
    import inspect

    if not isinstance(inputs, dict) or "use_cache" in inputs:
        return inputs
    try:
        takes = "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return dict(inputs, use_cache=False) if takes else inputs


def _detached(x):
    if torch.is_tensor(x):
        return x.detach().clone()
    if isinstance(x, tuple):
        return tuple(_detached(v) for v in x)
    if isinstance(x, list):
        return [_detached(v) for v in x]
    if isinstance(x, dict):
        return {k: _detached(v) for k, v in x.items()}
    return x


def _cast(x, dtype):
    if torch.is_tensor(x):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def _first_tensor(out) -> torch.Tensor:
    if torch.is_tensor(out):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    return out[0]  # a ModelOutput


class Run:
    """One side of a unit, ready to step: forward then backward, gradients kept."""

    def __init__(self, fn: Callable, captured: Captured, params: dict[str, torch.nn.Parameter],
                 grad_seed: int = 0):
        self.fn, self.params = fn, params
        args, kwargs = _detached((captured.args, captured.kwargs))
        self.x = args[0] if args and torch.is_tensor(args[0]) else kwargs.get("hidden_states")
        if self.x is not None and self.x.is_floating_point():
            self.x.requires_grad_(True)
        self.args, self.kwargs = args, kwargs
        self.dy0 = self.dy = None
        self.seed = grad_seed

    def prepare(self, _k: int = 0) -> None:
        for p in self.params.values():
            p.grad = None
        if self.x is not None:
            self.x.grad = None
        if self.dy is not None:
            self.dy.copy_(self.dy0)  # an in-place backward writes over its incoming gradient

    def step(self, _k: int = 0) -> torch.Tensor:
        out = _first_tensor(self.fn(*self.args, **self.kwargs))
        if out.dim() == 0:
            out.backward()
            return out
        if self.dy is None:
            g = torch.Generator(device="cpu").manual_seed(self.seed)
            self.dy0 = torch.randn(out.shape, generator=g).to(out.device, out.dtype)
            self.dy = self.dy0.clone()
        out.backward(self.dy)
        return out

    def results(self) -> dict[str, torch.Tensor]:
        """The output and every gradient of one fresh step."""
        self.prepare()
        out = {"output": self.step().detach()}
        if self.x is not None and self.x.grad is not None:
            out["grad input"] = self.x.grad.detach().clone()
        out |= {f"grad {n}": p.grad.detach().clone() for n, p in self.params.items()
                if p.grad is not None}
        return out


def peak_bytes(run: Run, device: torch.device) -> int | None:
    """Memory one step allocates above what is live before it (None on a CPU)."""
    if device.type != "cuda":
        return None
    run.prepare()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run.step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def gpu_timer(device: torch.device) -> Timer:
    """bench's protocol: warm-up, L2 flush, host-lead spin, samples until steady (capped
    at half a second per side, so one layer's kinds fit in well under a minute)."""
    from speedlight.bench import timer

    rule = dataclasses.replace(timer.default_rule(device), time_cap_s=0.5, max_samples=200)
    flush = timer.flush_for(device)
    lead = timer.GpuLead(device) if device.type == "cuda" else None

    def time_it(step, prepare, _kind, _side):
        return timer.measure(step, clock=timer.clock_for(device), rule=rule, prepare=prepare,
                             flush=flush, lead=lead).samples
    return time_it


def verify(ours: dict, theirs: dict, ref: dict, dtype: torch.dtype) -> tuple[bool, str, float]:
    """Every output and gradient of ours against the float64 reference, by verify's rule
    with the original module's error as the yardstick: (passed, why not, the worst error
    ratio, ours over PyTorch's)."""
    from speedlight.spec import TOLERANCES
    from speedlight.verify.compare import judge

    tol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    failed, worst = [], 0.0
    for name, ref64 in ref.items():
        if name not in theirs:
            continue
        check = judge(name, ours.get(name), ref64, theirs[name], tol)
        worst = max(worst, check.ratio)
        if not check.passed:
            failed.append(f"{name}: {check.reason}")
    return not failed, "; ".join(failed[:2]), worst


def reference_of(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of an unpatched module; attention that cannot run in float64 (flash,
    flex) runs as SDPA in the copy."""
    ref = copy.deepcopy(module).to(torch.float64)
    for m in ref.modules():
        config = getattr(m, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) not in (
                None, "eager", "sdpa"):
            config._attn_implementation_internal = "sdpa"
    return ref


def loss_fn(model: torch.nn.Module, head: torch.nn.Module, labels: torch.Tensor,
            fused: bool) -> Callable:
    """The head and the loss as the model computes them (the fused loss: without logits,
    by the candidate the patch put on the lm_head)."""
    vocab = head.weight.shape[0]
    if fused:  # through the lm_head's patched forward: the candidate's fused loss
        from speedlight.patching.causal_lm import LOSS_KWARG
        return lambda h: head(h, **{LOSS_KWARG: {"labels": labels}})
    loss = model.loss_function  # read now: speedlight's when cross_entropy is patched
    return lambda h: loss(logits=head(h), labels=labels, vocab_size=vocab)


VERIFY_TOKENS = 2048  # the loss kinds verify on the first tokens (a float64 [tokens, vocab] is large)


class _Patched:
    """The model patched for one side of a trial alone (plan=None: no plan decides), its
    patch report on entry, and unpatched on exit."""

    def __init__(self, model: torch.nn.Module, on: dict):
        self.model, self.on = model, on

    def __enter__(self):
        import warnings

        from speedlight.patching import apply_kinds
        from speedlight.patching.patcher import kinds
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return apply_kinds(self.model, plan=None, **({k: False for k in kinds()} | self.on))

    def __exit__(self, *exc):
        from speedlight.patching import unpatch
        unpatch(self.model)


def refusal(report, kind: str, path: str) -> str | None:
    """Why a patch did not put its candidate on the unit at `path` (None: it did), from the
    patch report: the reasons it gives for this kind, or that nothing was patched."""
    patched = report.patched.get(kind, [])
    if patched and (path == LOSS or any(p == path or p.startswith(path + " ") for p in patched)):
        return None
    why = [f"{what}: {reason}" if what.split(" ")[0] == kind else reason
           for what, reason in report.not_patched if what.split(" ")[0] == kind]
    return "; ".join(dict.fromkeys(why)) or f"patch put nothing on {path}"


def labels_of(inputs) -> torch.Tensor | None:
    """The token ids a causal LM's loss is computed on: the inputs' labels, else their
    input_ids (or the one tensor given)."""
    if isinstance(inputs, dict):
        for name in ("labels", "input_ids"):
            if torch.is_tensor(inputs.get(name)):
                return inputs[name]
        return None
    if isinstance(inputs, (tuple, list)):
        return inputs[0] if inputs and torch.is_tensor(inputs[0]) else None
    return inputs if torch.is_tensor(inputs) else None


def _side_fn(model, kind: str, path: str, labels, compile_mode: str | None, fused: bool):
    if path == LOSS:
        head = model.lm_head
        return loss_fn(model, head, labels, fused), dict(head.named_parameters())
    module = dict(model.named_modules())[path]
    fn = torch.compile(module, mode=compile_mode) if compile_mode else module
    return fn, dict(module.named_parameters())


def _truncated(c: Captured, labels, tokens: int) -> tuple[Captured, torch.Tensor]:
    h = c.args[0]
    rows = max(1, min(h.shape[-2], tokens // max(1, h.shape[:-2].numel())))
    return Captured((h[..., :rows, :],) + tuple(c.args[1:]), c.kwargs), labels[..., :rows]


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def trial(model, inputs, kind: str, path: str, captured: Captured, timer: Timer | None, *,
          names: tuple[str, ...], compile_mode: str | None = None,
          offered: Callable[[str], str | None] = lambda name: None) -> KindTrial:
    """Verify, and time where a timer is given, the model's own unit and each candidate in
    `names` (see the module docstring). offered(name): a reason the plan does not offer a
    candidate before it is installed, or None."""
    device = captured.args[0].device if captured.args else next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    labels = labels_of(inputs)
    check, check_labels = (_truncated(captured, labels, VERIFY_TOKENS) if path == LOSS
                           else (captured, labels))
    # the float64 reference: the original unit, before anything is patched
    if path == LOSS:
        head64 = reference_of(model.lm_head)
        fn64 = (lambda h, loss=model.loss_function, v=head64.weight.shape[0]:
                loss(logits=head64(h), labels=check_labels, vocab_size=v))
        ref = Run(fn64, Captured(*_cast((check.args, check.kwargs), torch.float64)),
                  dict(head64.named_parameters())).results()
    else:
        mod64 = reference_of(dict(model.named_modules())[path])
        ref = Run(mod64, Captured(*_cast((check.args, check.kwargs), torch.float64)),
                  dict(mod64.named_parameters())).results()

    def side(name: str):
        c = captured
        if kind == "attention" and name != MODEL:  # its mask is built for it
            c = capture_arguments(model, inputs, {path})[path]
        fused = kind == "linear_cross_entropy" and name != MODEL
        fn, params = _side_fn(model, kind, path, labels, compile_mode, fused)
        if path == LOSS:
            fn_check = _side_fn(model, kind, path, check_labels, None, fused)[0]
            outputs = Run(fn_check, check, params).results()
        else:
            outputs = Run(fn, c, params).results()
        return outputs, Run(fn, c, params)

    def timed(run: Run, name: str) -> Timing | None:
        if timer is None:
            return None
        samples = timer(run.step, run.prepare, kind, name)
        return Timing(list(samples), peak_bytes(run, device))

    with _Patched(model, sides(kind, MODEL)):
        theirs, run = side(MODEL)
        model_timing = timed(run, MODEL)
    tried = []
    for name in names:
        why = offered(name)
        if why is not None:
            tried.append(Tried(name, NOT_OFFERED, why))
            continue
        with _Patched(model, sides(kind, name)) as report:
            why = refusal(report, kind, path)
            if why is not None:
                tried.append(Tried(name, NOT_OFFERED, why))
                continue
            try:
                ours, run = side(name)
            except Exception as e:  # a candidate that cannot run the model's unit: excluded
                tried.append(Tried(name, EXCLUDED, f"raised {_first_line(e)}"))
                continue
            ok, why, ratio = verify(ours, theirs, ref, dtype)
            if not ok:
                tried.append(Tried(name, EXCLUDED, f"failed verification: {why}", None, ratio))
                continue
            tried.append(Tried(name, ADMITTED, "verified", timed(run, name), ratio))
    return KindTrial(kind, model_timing, tried, path, ran=True)


def discover(model, kind: str, path: str, names: tuple[str, ...],
             offered: Callable[[str], str | None] = lambda name: None) -> KindTrial:
    """Which candidates the model's variant admits, without running any: each installed
    alone and the patch report read (offered, or not offered with the reason)."""
    tried = []
    for name in names:
        why = offered(name)
        if why is None:
            with _Patched(model, sides(kind, name)) as report:
                why = refusal(report, kind, path)
        tried.append(Tried(name, NOT_OFFERED, why) if why is not None
                     else Tried(name, OFFERED, "the patch installs it; not verified"))
    return KindTrial(kind, None, tried, path)
