"""Type checks for option values: a ``bool`` is never taken for a number.

Python's ``True`` is an ``int`` (``isinstance(True, int)`` holds), so a flag passed where a
count belongs would slip through a plain ``isinstance`` check. These helpers refuse it.

This module imports only the standard library and numpy, so every part of ``dew`` may use it
(``dew.data`` and ``dew.models`` included, which otherwise import nothing else of ``dew``).
"""

from __future__ import annotations

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


__all__ = ["is_int", "is_integer", "is_real"]
