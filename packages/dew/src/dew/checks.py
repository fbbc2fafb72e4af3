"""Type checks for option values: a ``bool`` is never taken for a number.

Python's ``True`` is an ``int`` (``isinstance(True, int)`` holds), so a flag passed where a
count belongs would slip through a plain ``isinstance`` check. These helpers refuse it.

This module imports only the standard library and numpy, so every part of ``dew`` may use it
(``dew.data`` and ``dew.models`` included, which otherwise import nothing else of ``dew``).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import numpy as np


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is a Python ``int`` and not a bool.

    >>> is_int(3), is_int(True), is_int(np.int32(3)), is_int(3.0)
    (True, False, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_integer(value: Any) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is an integer, Python or numpy (token ids, counts from arrays), not a bool.

    >>> is_integer(3), is_integer(np.int32(3)), is_integer(True), is_integer(np.bool_(True))
    (True, True, False, False)
    """
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_real(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a Python ``int`` or ``float`` and not a bool.

    >>> is_real(0.5), is_real(2), is_real(False), is_real("1")
    (True, True, False, False)
    """
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite_float(value: Any, who: str) -> float:
    """``value`` as a finite float (a reward, a score), or a ValueError naming ``who``.

    Bools, NaN, infinities and values ``float()`` cannot read are refused:

    >>> finite_float(np.float32(0.5), "reward")
    0.5
    >>> finite_float(True, "reward")
    Traceback (most recent call last):
    ...
    ValueError: reward: expected a finite float, got True
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool | np.bool_) or not math.isfinite(number):
        raise ValueError(f"{who}: expected a finite float, got {value!r}")
    return number


def tolerance(value: Any, who: str) -> float:
    """``value`` as a float tolerance (a finite number >= 0), or a ValueError naming ``who``.

    >>> tolerance(0, "regrade.tolerance")
    0.0
    >>> tolerance(-1e-3, "regrade.tolerance")
    Traceback (most recent call last):
    ...
    ValueError: regrade.tolerance: expected a finite number >= 0, got -0.001
    """
    if not is_real(value) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{who}: expected a finite number >= 0, got {value!r}")
    return float(value)


__all__ = ["finite_float", "is_int", "is_integer", "is_real", "tolerance"]
