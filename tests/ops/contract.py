"""What the contract and fuzz tests know about every registered op, derived from its OpSpec
alone: a new op is covered by registering it."""

from __future__ import annotations

import pytest
import torch

from speedlight import registry
from speedlight.spec import Case, OpSpec

SPECS = registry.builtin_specs()


def by_op(specs=SPECS) -> list:
    """One pytest.param per op, with the op's name as id."""
    return [pytest.param(s, id=s.name) for s in specs]


def quick_cases(seeds=(0, 1)) -> list:
    """(spec, case) of every op's quick suite in each of its dtypes and seeds, with the
    case id as test id."""
    out = []
    for spec in SPECS:
        for base in spec.cases("quick"):
            for dtype in spec.dtypes:
                for seed in seeds:
                    case = base.with_(dtype=dtype, seed=seed)
                    out.append(pytest.param(spec, case, id=f"{case.id}-seed{seed}"))
    return out


def tensors(inputs: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def is_empty(spec: OpSpec, case: Case) -> bool:
    """Whether a case's inputs include an empty tensor (read from its shape parameters,
    without building it: some shape parameter is 0)."""
    return any(v == 0 for _, v in case.params)


def example(spec: OpSpec, dtype: torch.dtype = torch.float32) -> Case:
    """A small, typical case of the op: the first of its quick suite that is contiguous,
    has no flags, no empty input and more than one row."""
    for case in spec.cases("quick"):
        if (case.layout == "contiguous" and not case.flags and not is_empty(spec, case)
                and spec.rows(case) > 1):
            return case.with_(dtype=dtype)
    raise AssertionError(f"{spec.name}'s quick suite has no contiguous case without flags "
                         f"and with more than one row; the contract tests need one")


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)
