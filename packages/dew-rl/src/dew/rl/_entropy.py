"""Entropy of the next-token distribution."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float


def token_entropy(logits: jax.Array) -> jax.Array:
    """Shannon entropy of ``softmax(logits)`` over the last axis.

    Port of verl 0.9.1 ``verl.utils.torch_functional.entropy_from_logits``:
    ``logsumexp(logits) - sum(softmax(logits) * logits)``, in the logits' dtype, with
    gradients through both terms.

    One deliberate difference: a logit of ``-inf`` (a vocabulary entry removed by top-k
    or top-p filtering) has probability zero and contributes zero here, where verl's
    ``0 * -inf`` gives nan. Finite logits give verl's numbers.

    Args:
      logits: ``[..., V]``, e.g. ``[B, T, V]``.

    Returns:
      ``[...]``, e.g. ``[B, T]``, in the logits' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import numpy as np
      >>> import dew.rl as rl
      >>> logits = jnp.array([[[0.0, 0.0], [0.0, -jnp.inf]]])  # [B=1, T=2, V=2]
      >>> print(np.asarray(rl.token_entropy(logits)).round(4))  # log 2, then a sure token
      [[0.6931 0.    ]]

    References:
      verl 0.9.1, ``verl/utils/torch_functional.py``, ``entropy_from_logits``.
    """
    require_float("logits", logits)
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits: expected shape [..., V], got shape {jnp.shape(logits)}")
    removed = jnp.isneginf(logits)
    safe_logits = jnp.where(removed, jnp.zeros((), logits.dtype), logits)
    probs = jax.nn.softmax(logits, axis=-1)
    weighted = jnp.where(removed, jnp.zeros((), logits.dtype), probs * safe_logits)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(weighted, axis=-1)
