"""The shared argument checks of the public op functions (ops/_checks.py)."""

import pytest

from speedlight.ops._checks import check_bool, check_choice


@pytest.mark.parametrize("value", ["False", None, 0, 1, 1.0, [True]])
def test_check_bool_refuses_what_is_not_a_bool(value):
    with pytest.raises(TypeError, match=r"causal must be a bool \(True or False\), got"):
        check_bool("causal", value)


@pytest.mark.parametrize("value", [True, False])
def test_check_bool_takes_a_bool(value):
    assert check_bool("causal", value) is None


@pytest.mark.parametrize("value", ["bogus", 1, True, None, "MEAN"])
def test_check_choice_names_the_choices(value):
    with pytest.raises(ValueError, match=r"reduction must be one of 'mean', 'sum', 'none', got"):
        check_choice("reduction", value, ("mean", "sum", "none"))


def test_check_choice_takes_a_listed_value_none_included():
    assert check_choice("activation", None, (None, "silu")) is None
    assert check_choice("activation", "silu", (None, "silu")) is None
    with pytest.raises(ValueError):
        check_choice("dim", True, (1, 2))
