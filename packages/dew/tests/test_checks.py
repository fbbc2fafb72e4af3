"""dew.checks: a bool never passes for a number."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import dew.checks
from dew.checks import is_int, is_integer, is_real, tolerance


@pytest.mark.parametrize("value", [0, 7, -3])
def test_python_integers_pass_every_check(value) -> None:
    assert is_int(value) and is_integer(value) and is_real(value)


@pytest.mark.parametrize("value", [np.int8(1), np.uint64(2)])
def test_numpy_integers_pass_only_is_integer(value) -> None:
    assert is_integer(value) and not is_int(value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 1.0, "1", None, np.float32(2)])
def test_bools_and_non_integers_fail_the_integer_checks(value) -> None:
    assert not is_int(value) and not is_integer(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), "0.5", None, 1j])
def test_bools_and_non_reals_fail_is_real(value) -> None:
    assert not is_real(value)


@pytest.mark.parametrize("value", [-1e-9, float("nan"), float("inf"), True, "0", None])
def test_a_tolerance_is_a_finite_number_at_least_zero(value) -> None:
    assert tolerance(0, "t") == 0.0 and tolerance(2, "t") == 2.0
    with pytest.raises(
        ValueError, match=r"^regrade\.tolerance: expected a finite number >= 0, got "
    ):
        tolerance(value, "regrade.tolerance")


def test_the_docstring_examples_hold() -> None:
    result = doctest.testmod(dew.checks)
    assert result.attempted == 7 and result.failed == 0


def test_an_objective_refuses_a_flag_for_a_length() -> None:
    from dew.objectives.rl.grpo import GRPOObjective

    with pytest.raises(ValueError, match="seq_len: expected a positive integer, got True"):
        GRPOObjective(object(), seq_len=True)
