"""Test configuration for dew-rl: float64 available and strict dtype promotion.

Both are entered as JAX config contexts around each test module rather than set
globally, so running these tests in one session with another package's tests does not
change how that package's code promotes dtypes.
"""

from __future__ import annotations

from collections.abc import Iterator

import jax
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dew-rl",
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("dew-rl")


@pytest.fixture(autouse=True, scope="module")
def strict_x64() -> Iterator[None]:
    """Enable float64 and strict promotion for every test in the module."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("strict"):
        yield
