"""What the contract and fuzz tests know about every registered op, derived from its OpSpec
alone: a new op is covered by registering it. The ops are the built-in ones and the example
of docs/adding-an-op.md, run from the page itself."""

from __future__ import annotations

import re
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from speedlight import registry
from speedlight.spec import Case, OpSpec

RECIPE = Path(__file__).resolve().parent.parent.parent / "docs" / "adding-an-op.md"
RECIPE_EXAMPLE = "## The example, whole: `scale_shift`"


def recipe_code() -> str:
    """The Python blocks of the recipe's example section, in order, as one file."""
    text = RECIPE.read_text()
    section = text[text.index(RECIPE_EXAMPLE):]
    following = re.search(r"^## ", section[len(RECIPE_EXAMPLE):], re.M)
    if following:
        section = section[:len(RECIPE_EXAMPLE) + following.start()]
    return "\n\n".join(re.findall(r"```python\n(.*?)```", section, re.S))


@lru_cache(maxsize=None)
def recipe_module():
    """The recipe's example run as a module (written to a file first: Triton reads a
    kernel's source from its file). Registers its op once per process."""
    path = Path(tempfile.mkdtemp(prefix="speedlight-recipe-")) / "scale_shift.py"
    path.write_text(recipe_code())
    return registry.import_file(path, "speedlight_recipe_scale_shift")


SPECS = registry.builtin_specs() + [recipe_module().SPEC]


def by_op(specs=SPECS) -> list:
    """One pytest.param per op, with the op's name as id."""
    return [pytest.param(s, id=s.name) for s in specs]


# a case moving more than this (its forward's compulsory bytes, OpSpec.cost) draws tens of
# thousands of values from one seed: a second seed adds more values, not other kinds of
# values, and under the interpreter it is most of the suite's CPU time; smaller cases (the
# odd, size-1 and tail shapes, where one draw can miss what another hits) take both seeds
ONE_SEED_BYTES = 256 * 1024


def quick_cases(seeds=(0, 1)) -> list:
    """(spec, case) of every op's quick suite in each of its dtypes and seeds (the first
    seed only past ONE_SEED_BYTES), with the case id as test id."""
    out = []
    for spec in SPECS:
        for base in spec.cases("quick"):
            for dtype in spec.dtypes:
                case = base.with_(dtype=dtype)
                drawn = seeds if spec.cost(case, "fwd").bytes <= ONE_SEED_BYTES else seeds[:1]
                for seed in drawn:
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
