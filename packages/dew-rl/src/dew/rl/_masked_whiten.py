"""Masked whitening (zero mean, unit unbiased deviation over the kept positions)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_shape
from dew.rl._masked_mean import masked_mean
from dew.rl._masking import at_least_float32, count_dtype, count_kept, keep_of

#: verl adds this to the variance before the reciprocal square root.
WHITEN_EPS = 1e-8


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Centre ``x`` on its masked mean and divide by its masked, Bessel-corrected deviation.

    Port of verl 0.9.1 ``verl.utils.torch_functional.masked_whiten`` with ``masked_var``
    (``unbiased=True``): ``(x - mean) * rsqrt(var * n / (n - 1) + 1e-8)``, where the mean
    and the variance are :func:`masked_mean` over all axes and ``n`` is the kept count.
    verl's ``n / (n - 1)`` divides two int64 tensors, which torch does in float32; that is
    reproduced, so float64 input matches verl bit for bit.

    The arithmetic runs in at least float32: bfloat16 or float16 input is upcast and the
    result stays float32 (the centring subtracts close numbers that half precision would
    round to zero). float64 stays float64.

    Edge cases, which verl refuses with an exception and a jitted function cannot:
    one kept position gives 0 * inf = nan everywhere; no kept position gives ``x * 1e4``.
    Positions outside the mask are whitened with the same statistics and left in the
    output for the caller to mask again.

    Args:
      x: ``[B, T]`` (any shape) floating values.
      mask: same shape; non-zero keeps a position.

    Returns:
      Same shape as ``x``, dtype ``promote(x.dtype, float32)``.
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    x = x.astype(at_least_float32(x.dtype))
    keep = keep_of(mask)
    mean = masked_mean(x, mask)
    centred = x - mean
    variance = masked_mean(centred**2, mask)
    n = count_kept(keep)
    cdtype = count_dtype(mask)
    bessel = n.astype(cdtype) / (n - 1).astype(cdtype)
    variance = variance * bessel.astype(x.dtype)
    return centred * jax.lax.rsqrt(variance + jnp.asarray(WHITEN_EPS, x.dtype))
