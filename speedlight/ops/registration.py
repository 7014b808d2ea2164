"""One registration per op: the torch custom op(s), their fakes and the autograd rule,
built from one declaration.

    RMS_NORM = register_op(
        "rms_norm",
        forward=rms_norm_fwd,          # launcher: (x, weight, eps, offset) -> (y, rstd)
        outputs=("y", "rstd"),         # names of what forward returns, in order
        stats=("rstd",),               # kept for the backward only, never returned
        fake=lambda x, weight, eps, offset: (like(x), row_stats(x)),
        backward=rms_norm_bwd,         # launcher: (dy, x, weight, rstd, offset) -> (dx, dw)
        grads=("x", "weight"),         # the inputs backward's results are gradients of
    )

    def rms_norm(x, weight=None, eps=1e-6, offset=0.0):
        check...(x, weight, eps, offset)           # bad input raises before any launch
        return RMS_NORM(x, weight, float(eps), float(offset))   # y

What the declaration builds:
- `speedlight::<name>_fwd`, a torch.library custom op (opaque to torch.compile, which
  traces it through `fake`), whose schema comes from the forward launcher's annotations
  plus `impl: str`, the implementation that runs;
- `speedlight::<name>_bwd`, the backward launcher as a custom op, and the autograd rule
  that links the two: the backward's parameters are matched by name, `d<output>` to the
  gradient of that output, an input's or output's name to that value (tensors are saved
  for the backward, plain values kept on the context). Its results are the gradients of
  `grads`, in order (an entry ("x", "residual") gives both inputs the same gradient);
  a None result, or the gradient of an input passed as None, is None. `backward_fake`
  defaults to each gradient shaped like the backward argument of the same name;
- `speedlight::<name>_infer` when `inference` is given: a launcher with forward's
  parameters that returns only the public outputs, skipping the work only a backward
  needs (statistics, a gradient computed in the forward). It runs when no input in
  `grads` requires grad (or grad mode is off).

Calling the returned `RegisteredOp` returns the public outputs (those not in `stats`):
one tensor, or a tuple. Launchers may return None for an optional output; the custom
op carries an empty placeholder instead, since its outputs are tensors.

Which gradients a call needs: a launcher parameter named `needs_grad` (annotated
`list[bool]`) is given one flag per entry of `grads`, True where that input needs a
gradient on this call (grad mode on and the input given and requiring grad), so a
launcher skips work nobody asked for (no dW for a frozen weight). The caller never
passes it: the forward's is filled in when the op is called, the backward's from autograd
(`ctx.needs_input_grad`). The autograd rule returns None for every input that needs no
gradient, whatever the backward computed.

An op whose backward differs with a call's options registers one op per backward, and
its public function chooses, as it chooses an in-place variant: linear_cross_entropy
computes its gradients in the forward and scales them in the backward, except for
reduction "none" or fp16 logits, where a second registration recomputes them in the
backward with the upstream gradient.

More than one implementation: `forward={"triton": f, "cuda": g}` (and `backward` the
same keys); `op(..., impl="cuda")` forces one, `op(...)` runs `op.default`: the first
verified one, until `set_default` installs another (a tuned table's or a measured per-GPU
choice).
`unverified=("cuda",)` names implementations no GPU run has verified yet: set_default
refuses them, so they run only when forced. A launcher
that calls a CUDA C++ extension registers exactly like a Triton one; it wraps each
extension function with `speedlight.launch.extension_kernel(fn, name)` so that launch
counting (verify's empty-input check) sees its launches as it sees Triton's.

Written in place: `mutates=("logits",)` declares which inputs the forward overwrites
(`backward_mutates` the backward's). torch accepts no autograd formula on a mutating
op, so the rule is then an autograd.Function around the two ops. A backward that
mutates writes the first gradients of `grads` over the arguments it names, in order,
and returns the rest (none when it writes them all): `backward_mutates=("dy",)` with
`grads=("x", "weight")` writes dx over dy and returns dw. A gradient written over is
made contiguous first (a copy only when autograd hands over a strided or broadcast one).
A backward that writes over what the forward saved (an output or an input) can run once
per forward: a second backward through the same graph (retain_graph=True) is refused
with an error naming the op.

The launch context (speedlight/launch.py: the GPU launches are sized for, forced or tuned
configurations) is saved with each forward and re-entered around its backward: autograd
runs a GPU backward on a thread of its own, which does not see the caller's ContextVar.
Launchers read it themselves (`launch.planned_sm_count`, `launch.config`); configuration
spaces and tuned tables are speedlight/tuning.py's, not the registration's.

Why torch.library.custom_op and not triton_op: triton_op lets torch.compile trace into
Triton kernels, but only kernels launched through wrap_triton and only Triton ones; a
CUDA extension launcher, the interpreter runtime and launchers that choose among
kernels on the host need an opaque op with a fake, which custom_op is. See
docs/DESIGN-NOTES.md.
"""

from __future__ import annotations

import inspect
import sys
import typing
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from speedlight import launch
from speedlight.ops._custom_op import Launcher, build_custom_op

NAMESPACE = "speedlight"
NEEDS_GRAD = "needs_grad"  # the launcher parameter given which gradients a call needs


def like(t: torch.Tensor | None) -> torch.Tensor | None:
    """An uninitialized tensor of t's shape and dtype (None for None): the usual fake."""
    return None if t is None else t.new_empty(t.shape)


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """A fake [rows] fp32 statistic of x over its last dim (rstd, mean)."""
    n_cols = x.shape[-1]
    return x.new_empty((x.numel() // n_cols if n_cols else 0,), dtype=torch.float32)


@dataclass
class RegisteredOp:
    """What register_op built: call it like the forward launcher (plus `impl=`)."""

    name: str
    outputs: tuple[str, ...]
    stats: tuple[str, ...]
    impls: tuple[str, ...]
    forward_op: Any
    backward_op: Any | None = None
    inference_op: Any | None = None
    _apply: Callable[..., Any] | None = None
    _grad_groups: tuple[tuple[int, ...], ...] = ()  # positions of each entry of grads
    _n_params: int = 0  # the caller's parameters (impl and needs_grad not counted)
    _defaults: tuple = ()  # of the caller's trailing parameters that have one
    _flags_at: int | None = None  # where the forward launcher takes needs_grad
    unverified: frozenset = frozenset()  # implementations no GPU run has verified yet
    default: str = ""  # the implementation op(...) runs; "": the first

    def __post_init__(self):
        self.default = self.default or next(i for i in self.impls if i not in self.unverified)

    def set_default(self, impl: str) -> None:
        """Make `impl` the one op(...) runs (a tuned table's or a measured per-GPU choice);
        an unverified implementation cannot be the default."""
        self._impl(impl)
        if impl in self.unverified:
            raise ValueError(f"{self.name}: implementation {impl!r} is not verified on a GPU "
                             f"yet, so it cannot be the default (force it with impl={impl!r})")
        self.default = impl

    @property
    def public(self) -> tuple[str, ...]:
        """The outputs a call returns: those not in stats."""
        return tuple(o for o in self.outputs if o not in self.stats)

    def __call__(self, *args, impl: str | None = None):
        impl = self._impl(impl)
        missing = self._n_params - len(args)
        if 0 < missing <= len(self._defaults):  # impl comes last: fill in the defaults
            args = args + self._defaults[len(self._defaults) - missing:]
        flags = self.grad_flags(args)
        if self.inference_op is not None and not any(flags):
            return self.inference_op(*args, impl)
        if self._flags_at is not None:
            args = args[:self._flags_at] + (flags,) + args[self._flags_at:]
        out = self._apply(*args, impl)
        if not isinstance(out, tuple):
            return out
        public = tuple(v for v, n in zip(out, self.outputs) if n in self.public)
        return public[0] if len(public) == 1 else public

    def _impl(self, impl: str | None) -> str:
        if impl is None:
            return self.default
        if impl not in self.impls:
            raise ValueError(f"{self.name} has no implementation {impl!r}: expected one of "
                             f"{', '.join(self.impls)}")
        return impl

    def grad_flags(self, args) -> list[bool]:
        """For each entry of grads, whether a call with `args` (the caller's, without
        needs_grad) needs its gradient: grad mode on and the input a tensor requiring it."""
        grad = torch.is_grad_enabled()
        return [grad and any(i < len(args) and isinstance(args[i], torch.Tensor)
                             and args[i].requires_grad for i in group)
                for group in self._grad_groups]

_REGISTERED: dict[str, RegisteredOp] = {}


def registered_ops() -> list[RegisteredOp]:
    """Every RegisteredOp register_op built in this process (the last one of a name
    registered in several namespaces)."""
    return list(_REGISTERED.values())


def register_op(name: str, *, forward: Launcher | Mapping[str, Launcher],
                outputs: Sequence[str], fake: Callable[..., Any],
                stats: Sequence[str] = (),
                backward: Launcher | Mapping[str, Launcher] | None = None,
                grads: Sequence[str | Sequence[str]] = (),
                backward_fake: Callable[..., Any] | None = None,
                inference: Launcher | Mapping[str, Launcher] | None = None,
                mutates: Sequence[str] = (), backward_mutates: Sequence[str] = (),
                optional_grads: bool = False,
                unverified: Sequence[str] = (), namespace: str = NAMESPACE) -> RegisteredOp:
    """Register op `name` (see the module docstring) and return its RegisteredOp.

    optional_grads: the backward takes None for an output that received no gradient
    (instead of zeros), e.g. one of two outputs left unused. unverified: implementations
    not yet verified on a GPU (never the default). namespace: the torch library
    the ops go in (`torch.ops.<namespace>`); a team's own ops take their own.
    """
    forward, backward, inference = (_by_impl(f) for f in (forward, backward, inference))
    outputs, stats = tuple(outputs), tuple(stats)
    unknown = [s for s in stats if s not in outputs]
    if unknown:
        raise ValueError(f"{name}: stats {unknown} are not among outputs {outputs}")
    for role, impls in (("backward", backward), ("inference", inference)):
        if impls is not None and set(impls) != set(forward):
            raise ValueError(f"{name}: {role} implementations {sorted(impls)} differ from "
                             f"forward's {sorted(forward)}")
    first = next(iter(forward.values()))
    params = list(inspect.signature(first).parameters.values())
    hints = typing.get_type_hints(first)
    in_names = [p.name for p in params]
    # what the caller passes: the launcher's parameters but needs_grad, filled in per call
    call_params = [p for p in params if p.name != NEEDS_GRAD]
    call_names = [p.name for p in call_params]
    defaults = tuple(p.default for p in call_params
                     if p.default is not inspect.Parameter.empty)

    fwd_op = build_custom_op(f"{namespace}::{name}_fwd", forward, fake, params, hints,
                             len(outputs), mutates)
    unknown = [u for u in unverified if u not in forward]
    if unknown or (forward and set(forward) <= set(unverified)):
        raise ValueError(f"{name}: unverified {list(unverified)} must name some, not all, of "
                         f"the implementations {sorted(forward)}")
    op = RegisteredOp(name, outputs, stats, tuple(forward), fwd_op,
                      _apply=fwd_op, _n_params=len(call_params), _defaults=defaults,
                      _flags_at=in_names.index(NEEDS_GRAD) if NEEDS_GRAD in in_names else None,
                      unverified=frozenset(unverified))
    _REGISTERED[name] = op

    targets = [(g,) if isinstance(g, str) else tuple(g) for g in grads]
    for group in targets:
        for g in group:
            if g not in call_names:
                raise ValueError(f"{name}: grads names {g!r}, not a forward parameter "
                                 f"({', '.join(call_names)})")
    op._grad_groups = tuple(tuple(call_names.index(g) for g in group) for group in targets)

    if inference is not None:
        public_at = [i for i, o in enumerate(outputs) if o not in stats]

        def inference_fake(*args):
            if op._flags_at is not None:  # the forward's fake, told no gradient is wanted
                args = args[:op._flags_at] + ([False] * len(targets),) + args[op._flags_at:]
            out = fake(*args)
            out = out if isinstance(out, tuple) else (out,)
            picked = tuple(out[i] for i in public_at)
            return picked[0] if len(picked) == 1 else picked

        op.inference_op = build_custom_op(f"{namespace}::{name}_infer", inference,
                                          inference_fake, call_params, hints,
                                          len(public_at), mutates)

    if backward is None:
        return op
    bfirst = next(iter(backward.values()))
    bparams = list(inspect.signature(bfirst).parameters.values())
    bhints = typing.get_type_hints(bfirst)
    plan = _backward_plan(name, bparams, in_names, outputs, stats)
    backward_mutates = tuple(backward_mutates)
    unknown = [n for n in backward_mutates if n not in plan]
    if unknown or len(backward_mutates) > len(targets):
        raise ValueError(f"{name}: backward_mutates {list(backward_mutates)} must name at most "
                         f"{len(targets)} backward parameters (of {', '.join(plan)})")
    n_grads = len(targets) - len(backward_mutates)
    if backward_fake is None:
        backward_fake = _default_backward_fake(name, bparams, targets, backward_mutates)
    used = [p for p in bparams if p.name in plan]
    bwd_op = build_custom_op(f"{namespace}::{name}_bwd", backward, backward_fake, used,
                             bhints, n_grads, backward_mutates)
    op.backward_op = bwd_op
    rule = _AutogradRule(name, in_names, outputs, stats, plan, [p.name for p in used],
                         targets, bwd_op, backward_mutates, optional_grads)
    if mutates:
        op._apply = _function(name, fwd_op, rule)
    else:
        fwd_op.register_autograd(rule.backward, setup_context=rule.setup_context)
    return op


# --- building the custom ops (ops/_custom_op.py) ------------------------------------------

def _by_impl(f) -> dict[str, Launcher] | None:
    if f is None:
        return None
    return dict(f) if isinstance(f, Mapping) else {"triton": f}


# --- autograd -----------------------------------------------------------------------------

def _backward_plan(name, bparams, in_names, outputs, stats) -> dict[str, tuple[str, str]]:
    """backward parameter -> ("output" | "input" | "grad", the name it refers to)."""
    public = [o for o in outputs if o not in stats]
    plan = {}
    for p in bparams:
        if p.name == NEEDS_GRAD:
            plan[p.name] = ("needs_grad", p.name)
        elif p.name in outputs:
            plan[p.name] = ("output", p.name)
        elif p.name.startswith("d") and p.name[1:] in public:
            plan[p.name] = ("grad", p.name[1:])
        elif p.name in in_names:
            plan[p.name] = ("input", p.name)
        elif p.default is inspect.Parameter.empty:
            raise ValueError(
                f"{name}: backward parameter {p.name!r} is neither a forward input "
                f"({', '.join(in_names)}), an output ({', '.join(outputs)}) nor the gradient "
                f"d<output> of a public output ({', '.join(public)})")
    return plan


def _default_backward_fake(name, bparams, targets, mutates):
    """Each returned gradient shaped like the backward argument of its name (None where
    the backward's needs_grad says it is not wanted)."""
    first = len(mutates)  # the gradients written over arguments are not returned
    if not targets[first:]:
        return lambda *args: None
    names = [p.name for p in bparams]
    missing = [g[0] for g in targets[first:] if g[0] not in names]
    if missing:
        raise ValueError(f"{name}: give backward_fake: the gradients of {missing} are not "
                         f"shaped like a backward argument of the same name")

    def fake(*args):
        bound = dict(zip(names, args))
        wanted = bound.get(NEEDS_GRAD) or [True] * len(targets)
        out = tuple(like(bound[g[0]]) if wanted[i] else None
                    for i, g in enumerate(targets) if i >= first)
        return out[0] if len(out) == 1 else out
    return fake


class _AutogradRule:
    """setup_context and backward of one registered op, from the backward's plan."""

    def __init__(self, name, in_names, outputs, stats, plan, bnames, targets, bwd_op,
                 bmutates, optional_grads):
        self.name, self.in_names, self.outputs, self.stats = name, in_names, outputs, stats
        self.public = [o for o in outputs if o not in stats]
        self.plan, self.bnames, self.targets = plan, bnames, targets
        self.bwd_op, self.bmutates, self.optional_grads = bwd_op, bmutates, optional_grads
        self.saved = [n for n in bnames if plan[n][0] in ("input", "output")]
        # saved values the backward writes over: it can run once per forward
        self.consumes = [n for n in bmutates if plan[n][0] in ("input", "output")]

    def setup_context(self, ctx, inputs, output):
        output = output if isinstance(output, tuple) else (output,)
        values = dict(zip(self.in_names, inputs))
        values.update(zip(self.outputs, output))
        ctx.impl = inputs[-1]
        # the launch context, for the backward (ContextVar.get breaks a compiled graph: under
        # torch.compile launches are sized for the GPU they run on)
        ctx.launch_context = None if torch.compiler.is_compiling() else launch.current()
        tensors = [n for n in self.saved if isinstance(values[n], torch.Tensor)]
        plain = {n: values[n] for n in self.saved if n not in tensors}
        ctx.tensor_names, ctx.plain = tensors, plain
        ctx.save_for_backward(*(values[n] for n in tensors))
        ctx.input_is_none = {n: values[n] is None for n in self.in_names}
        stat_tensors = [v for v, o in zip(output, self.outputs) if o in self.stats]
        if stat_tensors:
            ctx.mark_non_differentiable(*stat_tensors)
        if self.optional_grads:
            ctx.set_materialize_grads(False)
        if self.bmutates:  # whether a gradient may be written over is decided at backward
            ctx.output_refs = {o: weakref.ref(t) for o, t in zip(self.outputs, output)
                               if isinstance(t, torch.Tensor)}

    def backward(self, ctx, *grad_outputs):
        grads = dict(zip(self.outputs, grad_outputs))
        n_in = len(self.in_names) + 1  # + impl
        if all(grads[o] is None for o in self.public):
            return (None,) * n_in
        if self.consumes:
            if getattr(ctx, "consumed", False):
                raise RuntimeError(
                    f"{self.name}'s backward ran twice on one forward (retain_graph=True): "
                    f"the first wrote the gradients over the forward's saved "
                    f"{', '.join(self.consumes)}; run the forward again")
            ctx.consumed = True
        needs = ctx.needs_input_grad
        values = dict(zip(ctx.tensor_names, ctx.saved_tensors))
        values.update(ctx.plain)
        values[NEEDS_GRAD] = [any(needs[self.in_names.index(n)] for n in group)
                              for group in self.targets]
        args = [grads[self.plan[n][1]] if self.plan[n][0] == "grad" else values[n]
                for n in self.bnames]
        written = ()
        if self.bmutates:
            for i, n in enumerate(self.bnames):
                if n in self.bmutates and self.plan[n][0] == "grad" and args[i] is not None:
                    output = ctx.output_refs.get(self.plan[n][1], lambda: None)()
                    if _writable_gradient(args[i], output):
                        args[i] = args[i].contiguous()  # written over: dense, in its own layout
                    else:  # someone else may read it: written into a copy instead
                        args[i] = args[i].clone(memory_format=torch.contiguous_format)
            written = tuple(args[self.bnames.index(n)] for n in self.bmutates)
        if ctx.launch_context is None:
            out = self.bwd_op(*args, ctx.impl)
        else:
            with launch.entered(ctx.launch_context):
                out = self.bwd_op(*args, ctx.impl)
        out = out if isinstance(out, tuple) else () if out is None else (out,)
        out = written + out
        result = [None] * n_in
        for group, g in zip(self.targets, out):
            for n in group:
                i = self.in_names.index(n)
                if needs[i] and not ctx.input_is_none[n]:
                    result[i] = g
        return tuple(result)


def _writable_gradient(grad: torch.Tensor, output: torch.Tensor | None) -> bool:
    """Whether a backward may write over `grad`, the gradient of `output` autograd handed
    it: only when nothing else can read it. Not when another C++ owner holds it (the caller's
    own tensor when output is the root of backward, `y.backward(g)`; an add's gradient that
    its other operand has yet to take), when another tensor views its memory (a hook on a
    view of output that kept its gradient), or when output has hooks of its own (which may
    keep the very tensor). retain_grad() keeps a copy, so it needs none. Under
    torch.compile the compiler owns the buffers: written over as declared."""
    if torch.compiler.is_compiling() or not isinstance(grad, torch.Tensor):
        return True
    if grad._use_count() > 1:
        return False
    # the storage's holders: grad, the Python storage object made to ask and, for a view
    # (a linear layer's 2-D gradient seen as [batch, seq, hidden]), its base; the base
    # held by nothing but grad (its view) and the wrapper made here, Python included
    base = grad._base
    if torch._C._storage_Use_Count(grad.untyped_storage()._cdata) > (2 if base is None else 3):
        return False
    if base is not None and (base._use_count() > 2 or sys.getrefcount(base) > 2):
        return False
    return output is None or not output._backward_hooks


def _function(name: str, fwd_op, rule: _AutogradRule):
    """The autograd.Function a mutating op's rule needs (torch registers no formula on a
    mutating custom op)."""

    def forward(ctx, *args):
        out = fwd_op(*args)
        rule.setup_context(ctx, args, out)
        return out

    def backward(ctx, *grads):
        return rule.backward(ctx, *grads)

    fn = type(f"_{name}_function", (torch.autograd.Function,),
              {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    return fn.apply
