"""docs/adding-an-op.md states every rule the contract and fuzz tests hold an op to; its
example op is run from the page by tests/ops/contract.py and held to them all."""

from __future__ import annotations

import inspect

from tests.ops import contract, test_contract, test_fuzz


def _tests(module) -> list[str]:
    return [name for name, fn in vars(module).items()
            if name.startswith("test_") and inspect.isfunction(fn)]


def test_the_page_names_every_contract_and_fuzz_test():
    page = contract.RECIPE.read_text()
    tests = _tests(test_contract) + _tests(test_fuzz)
    assert len(tests) >= 10
    assert [t for t in tests if f"`{t}`" not in page] == []


def test_the_page_names_every_mutation():
    page = contract.RECIPE.read_text()
    names = list(test_fuzz.TENSOR_MUTATIONS) + list(test_fuzz.SCALAR_MUTATIONS)
    assert [n for n in names if f"`{n}`" not in page] == []


def test_the_example_is_one_of_the_ops_held_to_the_contract():
    spec = contract.recipe_module().SPEC
    assert spec in contract.SPECS and spec.name == "scale_shift"
    assert "@triton.jit" in contract.recipe_code()
