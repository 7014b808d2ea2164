"""Every argument of every registered op, mutated through one fixed list.

Each argument `make_inputs` gives the op's example case is replaced, one at a time, by a
wrong or unusual value (another dtype, device or rank, a size of 0 or 1, a stride of 0, a
non-contiguous layout, NaN and Inf, 2^63 for integers). The op must either raise an error
that names the argument (TypeError, ValueError or RuntimeError) before any launch, or
return what the reference returns on the same inputs, judged by verify's pass rule.
A new op inherits this by being registered.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import pytest
import torch

from speedlight.verify.harness import LaunchCounter, judge_outputs, references
from tests.helpers import assert_verified
from tests.ops.contract import SPECS, as_tuple, example, is_empty


def _first(t: torch.Tensor, value) -> torch.Tensor:
    t = t.clone()
    if t.numel():
        t.view(-1)[0] = value
    return t


def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values and shape in another memory order (the innermost dim strided)."""
    if t.dim() >= 2:
        return t.mT.contiguous().mT
    return torch.stack([t, t], -1)[..., 0]


def _lower_rank(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1) if t.dim() >= 2 else t.reshape(-1)[0]


# name -> (applies to this value?, the mutated value)
TENSOR_MUTATIONS: dict[str, tuple[Callable[[torch.Tensor], bool], Callable[[torch.Tensor], Any]]] = {
    "int32": (lambda t: t.dtype != torch.int32, lambda t: t.to(torch.int32)),
    "int64": (lambda t: t.dtype != torch.int64, lambda t: t.to(torch.int64)),
    "bool": (lambda t: True, lambda t: t.to(torch.bool)),
    "float16": (lambda t: t.dtype != torch.float16, lambda t: t.to(torch.float16)),
    "float64": (lambda t: True, lambda t: t.to(torch.float64)),
    "meta": (lambda t: True, lambda t: t.to("meta")),
    "rank+1": (lambda t: True, lambda t: t.unsqueeze(0)),
    "rank-1": (lambda t: t.dim() >= 1, _lower_rank),
    "size0": (lambda t: t.dim() >= 1, lambda t: t.narrow(-1, 0, 0)),
    "size1": (lambda t: t.dim() >= 1, lambda t: t.narrow(-1, 0, 1)),
    "stride0": (lambda t: t.dim() >= 1 and t.shape[-1] > 1,
                lambda t: t.narrow(-1, 0, 1).expand(t.shape)),
    "noncontiguous": (lambda t: True, _non_contiguous),
    "nan": (lambda t: t.is_floating_point(), lambda t: _first(t, float("nan"))),
    "inf": (lambda t: t.is_floating_point(), lambda t: _first(t, float("inf"))),
    "2^63-1": (lambda t: t.dtype == torch.int64, lambda t: _first(t, 2 ** 63 - 1)),
    "sparse": (lambda t: t.dim() >= 1, lambda t: t.to_sparse()),
    "nested": (lambda t: t.dim() >= 2 and t.shape[0] > 0,
               lambda t: torch.nested.nested_tensor(list(t.unbind(0)))),
    "list": (lambda t: True, lambda t: t.tolist()),
    "None": (lambda t: True, lambda t: None),
}

SCALAR_MUTATIONS: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any]]] = {
    "2^63": (lambda v: isinstance(v, int) and not isinstance(v, bool), lambda v: 2 ** 63),
    "-1": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), lambda v: -1),
    "nan": (lambda v: isinstance(v, float), lambda v: float("nan")),
    "inf": (lambda v: isinstance(v, float), lambda v: float("inf")),
    "str": (lambda v: not isinstance(v, str), lambda v: "1"),
    "bogus": (lambda v: isinstance(v, str), lambda v: "bogus"),
    "sequence-2^63": (lambda v: isinstance(v, tuple), lambda v: (2 ** 63,) * len(v)),
}

def fuzz_cases(spec) -> dict:
    """argument -> the case its mutations start from: the op's example for every argument
    the example gives a value; an argument the example leaves None or out (a packed input,
    a softcap, a window) from the first non-empty quick case that gives it one, so every
    argument any case uses is fuzzed."""
    first = example(spec)
    out = {name: first for name, value in spec.make_inputs(first, "cpu").items()
           if value is not None}
    for case in spec.cases("quick"):
        if is_empty(spec, case):
            continue
        for name, value in spec.make_inputs(case, "cpu").items():
            if value is not None:
                out.setdefault(name, case)
    return out


def mutations() -> list:
    out = []
    for spec in SPECS:
        for name, case in fuzz_cases(spec).items():
            value = spec.make_inputs(case, "cpu")[name]
            table = TENSOR_MUTATIONS if isinstance(value, torch.Tensor) else SCALAR_MUTATIONS
            for what, (applies, _) in table.items():
                if value is None or not applies(value):
                    continue
                out.append(pytest.param(spec, name, what, id=f"{spec.name}-{name}-{what}"))
    return out


def _tensor_outputs(out) -> list[torch.Tensor]:
    return [o for o in as_tuple(out) if isinstance(o, torch.Tensor)]


@pytest.mark.parametrize("spec,name,what", mutations())
def test_mutated_argument_is_named_or_matches_torch(spec, name, what, device):
    inputs = spec.make_inputs(fuzz_cases(spec)[name], device)
    table = TENSOR_MUTATIONS if isinstance(inputs[name], torch.Tensor) else SCALAR_MUTATIONS
    inputs[name] = table[what][1](inputs[name])
    counter = LaunchCounter()
    try:
        with counter.active():
            ours = as_tuple(spec.impl(**inputs))
    except (TypeError, ValueError, RuntimeError) as e:
        assert re.search(rf"\b{re.escape(name)}\b", str(e)), \
            f"{name} as {what}: {type(e).__name__}: {e} (does not name {name})"
        assert counter.count == 0, f"{name} as {what}: launched {counter.kernels}, then: {e}"
        return
    try:
        refs = references(spec, inputs)
    except Exception as e:  # torch rejects what speedlight accepted
        pytest.fail(f"{name} as {what}: speedlight returned a result where the reference "
                    f"raises {type(e).__name__}: {e}")
    if any(o.device.type == "meta" for o in _tensor_outputs(ours)):
        got = [(tuple(o.shape), o.dtype) for o in _tensor_outputs(ours)]
        want = [(tuple(r.shape), r.dtype) for r in _tensor_outputs(refs[1])]
        assert got == want, f"{name} as {what}: meta outputs {got}, reference {want}"
        return
    dtype = next((r.dtype for r in _tensor_outputs(refs[1]) if r.is_floating_point()),
                 torch.float32)
    failed = [c for c in judge_outputs(ours, refs, spec.tolerance(dtype)) if not c.passed]
    assert not failed, f"{name} as {what}: " + "; ".join(f"{c.name}: {c.reason}" for c in failed)


# Every bool and enum (str) option of every public op function, read from its signature,
# so an op's new flag is covered by being declared: a flag given as "False" (truthy), None,
# 1 or a tensor, and an enum given as a non-string, are TypeErrors naming it (as torch's
# scaled_dot_product_attention refuses is_causal="False"); an unknown name is a ValueError.
WRONG_OPTIONS = {
    "bool": {"str": ("False", TypeError), "None": (None, TypeError), "int": (1, TypeError),
             "tensor": (torch.tensor(True), TypeError)},
    "str": {"None": (None, TypeError), "int": (1, TypeError), "list": (["x"], TypeError),
            "bogus": ("bogus", ValueError)},
    "str | None": {"int": (1, TypeError), "list": (["x"], TypeError),
                   "bogus": ("bogus", ValueError)},
}

def _wrong_options(target, function, label: str) -> list:
    """(target, option, its annotation, a WRONG_OPTIONS key) for each wrong value of each
    bool and enum option of function's signature, with the id <label>-<option>-<key>."""
    return [pytest.param(target, param.name, str(param.annotation), what,
                         id=f"{label}-{param.name}-{what}")
            for param in inspect.signature(function).parameters.values()
            for what in WRONG_OPTIONS.get(str(param.annotation), ())]


def options() -> list:
    return [p for spec in SPECS for p in _wrong_options(spec, spec.impl, spec.name)]


@pytest.mark.parametrize("spec,name,kind,what", options())
def test_wrongly_typed_option_is_named(spec, name, kind, what, device):
    inputs = spec.make_inputs(example(spec), device)
    value, error = WRONG_OPTIONS[kind][what]
    counter = LaunchCounter()
    with pytest.raises(error) as raised, counter.active():
        spec.impl(**{**inputs, name: value})
    assert re.search(rf"\b{re.escape(name)}\b", str(raised.value)), \
        f"{name}={value!r}: {raised.value} (does not name {name})"
    assert counter.count == 0, f"{name}={value!r}: launched {counter.kernels}"


# the same for the options of speedlight.nn's modules, checked when the module is built
_MODULE_SIZES = {"normalized_shape": 8, "hidden_size": 8, "intermediate_size": 16}


def module_options() -> list:
    import speedlight.nn as snn

    modules = [cls for cls in vars(snn).values() if isinstance(cls, type)
               and issubclass(cls, torch.nn.Module) and cls.__module__ == snn.__name__]
    return [p for cls in modules for p in _wrong_options(cls, cls.__init__, cls.__name__)]


@pytest.mark.parametrize("cls,name,kind,what", module_options())
def test_wrongly_typed_module_option_is_named(cls, name, kind, what):
    required = {p.name: _MODULE_SIZES[p.name]
                for p in inspect.signature(cls.__init__).parameters.values()
                if p.name in _MODULE_SIZES and p.default is inspect.Parameter.empty}
    value, error = WRONG_OPTIONS[kind][what]
    with pytest.raises(error) as raised:
        cls(**required, **{name: value})
    assert re.search(rf"\b{re.escape(name)}\b", str(raised.value)), \
        f"{cls.__name__}({name}={value!r}): {raised.value} (does not name {name})"


# The shape parameters of an op's case, each set to 0 in turn, and the ones its SIZE_FUZZED
# entry names to 1 and past its other sizes: the same outcome classes as the mutations
# above, gradients included (a ValueError or TypeError naming an argument before any
# launch, or verify's pass against float64, forward and every gradient, with no launch on
# an empty input). moe_experts starts from its example with biases (with I = 0 each
# expert's output is its down_bias); H and I of 1 are a tile's edges, k past the experts
# an expert-parallel rank holding fewer experts than the router picks.
SIZE_FUZZED = {"moe_experts": ({"bias": True}, {"hidden": 1, "inter": 1, "k": 4})}


def size_mutations() -> list:
    out = []
    for spec in SPECS:
        if spec.name not in SIZE_FUZZED:
            continue
        flags, more = SIZE_FUZZED[spec.name]
        base = example(spec)
        base = base.with_(flags={**dict(base.flags), **flags})
        for name, value in [(name, 0) for name, _ in base.params] + list(more.items()):
            params = tuple((n, value if n == name else v) for n, v in base.params)
            out.append(pytest.param(spec, base.with_(params=params),
                                    id=f"{spec.name}-{name}{value}"))
    return out


@pytest.mark.parametrize("spec,case", size_mutations())
def test_size_is_named_or_verified(spec, case, device):
    inputs = spec.make_inputs(case, device)
    counter = LaunchCounter()
    try:
        with counter.active():
            spec.impl(**inputs)
    except (TypeError, ValueError) as e:
        named = [n for n in inputs if re.search(rf"\b{re.escape(n)}\b", str(e))]
        assert named, f"{case.id}: {type(e).__name__}: {e} (names no argument)"
        assert counter.count == 0, f"{case.id}: launched {counter.kernels}, then: {e}"
        return
    assert_verified(spec, case, device)
