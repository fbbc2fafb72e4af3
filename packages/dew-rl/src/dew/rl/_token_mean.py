"""Token-mean reduction."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_shape
from dew.rl._masking import count_kept, divide, keep_of, select


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Average ``x`` over every position ``mask`` keeps, across the whole batch.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="token-mean")`` (single data-parallel
    rank): the masked sum divided by the exact number of kept tokens, with no 1e-8 added
    (that belongs to :func:`masked_mean`; the two are kept apart as in verl and Tunix).

    Args:
      x: ``[B, T]`` (any shape) floating values.
      mask: same shape as ``x``; non-zero keeps a position.

    Returns:
      A scalar in ``x``'s dtype. Positions outside the mask never reach it, nan included.
      When the mask keeps nothing the result is 0/0 = nan, on purpose: an empty batch is a
      bug upstream and should show.
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    keep = keep_of(mask)
    total = jnp.sum(select(x, keep))
    return divide(total, count_kept(keep), x.dtype)
