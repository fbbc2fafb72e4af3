"""Masked mean with verl's 1e-8 guard."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_shape
from dew.rl._masking import (
    count_dtype,
    count_kept,
    divide,
    eps_denominator,
    keep_of,
    select,
    wider,
)


def masked_mean(
    x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None
) -> jax.Array:
    """Mean of ``x`` over the positions ``mask`` keeps, along ``axis`` (all axes by default).

    Port of verl 0.9.1 ``verl.utils.torch_functional.masked_mean`` (through its
    ``masked_sum``): dropped positions are replaced by zero with ``jnp.where`` (a multiply
    by a zero mask would keep a nan), and the sum is divided by ``count + 1e-8``. As in
    torch, that 1e-8 is added in float32 for a boolean or integer mask and in the mask's
    dtype for a floating mask, so with a boolean mask it only matters when nothing is kept,
    where the mean is 0 instead of nan.

    Args:
      x: floating values of any shape, e.g. ``[B, T]``.
      mask: same shape as ``x``; non-zero keeps a position.
      axis: axes to reduce, None for all.

    Returns:
      ``x`` reduced over ``axis``. The dtype is torch's for verl's expression: ``x``'s,
      except that half-precision ``x`` with a boolean, integer or float32 mask gives
      float32 (the count's dtype wins the promotion).
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    keep = keep_of(mask)
    total = jnp.sum(select(x, keep), axis=axis)
    count = count_kept(keep, axis=axis)
    return divide(total, eps_denominator(count, mask), wider(x.dtype, count_dtype(mask)))
