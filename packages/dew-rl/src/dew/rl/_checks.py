"""Input checks shared by the dew.rl functions (private).

One of the two foundations of ``dew.rl`` (with :mod:`dew.rl._masking`): every themed
module may import it, and it imports no other part of ``dew.rl``.

They run on static facts only (shapes, dtypes, Python numbers), so they work under
``jax.jit``. Each error names the argument, what was expected and what came.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp


def require_float(name: str, x: jax.Array) -> None:
    """Raise unless ``x`` holds floating-point values."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise TypeError(f"{name}: expected a floating-point array, got dtype {jnp.result_type(x)}")


def require_rank(name: str, x: jax.Array, rank: int, layout: str) -> None:
    """Raise unless ``x`` has ``rank`` axes (``layout`` says which, e.g. ``[B, T]``)."""
    if jnp.ndim(x) != rank:
        raise ValueError(f"{name}: expected shape {layout}, got shape {jnp.shape(x)}")


def require_same_shape(name: str, x: jax.Array, ref_name: str, ref: jax.Array) -> None:
    """Raise unless ``x`` has exactly the shape of ``ref``."""
    if jnp.shape(x) != jnp.shape(ref):
        raise ValueError(
            f"{name}: expected the shape of {ref_name} {jnp.shape(ref)}, got {jnp.shape(x)}"
        )


def require_same_dtype(name: str, x: jax.Array, ref_name: str, ref: jax.Array) -> None:
    """Raise unless ``x`` has the dtype of ``ref`` (dew.rl never promotes silently)."""
    if jnp.result_type(x) != jnp.result_type(ref):
        raise TypeError(
            f"{name}: expected the dtype of {ref_name} ({jnp.result_type(ref)}), "
            f"got {jnp.result_type(x)}"
        )


def require_segments(segments: jax.Array, ref_name: str, ref: jax.Array) -> None:
    """Raise unless ``segments`` is an integer ``[B, T]`` array shaped like ``ref``."""
    require_rank("segments", segments, 2, "[B, T]")
    require_same_shape("segments", segments, ref_name, ref)
    if not jnp.issubdtype(jnp.result_type(segments), jnp.integer):
        raise TypeError(
            f"segments: expected integer chain ids, got dtype {jnp.result_type(segments)}"
        )


def is_python_number(value: object) -> bool:
    """True for a concrete Python/NumPy number (not a traced array)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def require_positive_band(low: object, high: object) -> None:
    """Raise unless ``0 < low <= high`` for concrete numbers (traced values pass)."""
    if is_python_number(low) and float(low) <= 0.0:  # type: ignore[arg-type]
        raise ValueError(f"low: expected a positive ratio bound, got {low}")
    if is_python_number(high) and float(high) <= 0.0:  # type: ignore[arg-type]
        raise ValueError(f"high: expected a positive ratio bound, got {high}")
    if is_python_number(low) and is_python_number(high) and float(low) > float(high):  # type: ignore[arg-type]
        raise ValueError(f"low: expected low <= high, got low={low} and high={high}")
