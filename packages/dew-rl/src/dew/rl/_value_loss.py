"""The critic's clipped value loss, per token ``[B, T]``, before any mask reduction."""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_dtype, require_same_shape


def clipped_value_loss_terms(
    predicted: jax.Array,
    returns: jax.Array,
    old_values: jax.Array,
    clip: float = 0.2,
) -> jax.Array:
    """Half the larger of the plain and the clipped squared value error, per token.

    Port of verl 0.9.1 ``compute_value_loss`` before its mask reduction: the prediction is
    clipped to ``old_values +- clip`` (verl's ``clip_by_value``, a min then a max, whose
    ties share the gradient evenly like ``jnp.minimum``), both squared errors against the
    returns are taken and the larger is multiplied by 0.5. Reduce with
    :func:`token_mean` for verl's default ``token-mean`` (0.5 is a power of two, so
    halving before or after the mean gives identical bits).

    ``returns`` and ``old_values`` are rollout data and carry no gradient.

    Args:
      predicted: ``[B, T]`` live value predictions.
      returns: ``[B, T]`` return targets (e.g. from :func:`gae`), same dtype.
      old_values: ``[B, T]`` values recorded at rollout time, same dtype.
      clip: verl's ``cliprange_value``.

    Returns:
      ``[B, T]`` in the inputs' dtype. No mask is taken; mask the reduction.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> predicted = jnp.array([[1.0, -0.25]])
      >>> returns = jnp.array([[1.0, 0.5]])
      >>> old_values = jnp.array([[0.0, 0.0]])  # 1.0 is clipped to 0.5, -0.25 is inside
      >>> print(rl.clipped_value_loss_terms(predicted, returns, old_values, clip=0.5))
      [[0.125   0.28125]]

    References:
      Schulman et al., `Proximal Policy Optimization Algorithms
      <https://arxiv.org/abs/1707.06347>`_, 2017.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_value_loss``.
    """
    require_float("predicted", predicted)
    for name, value in (("returns", returns), ("old_values", old_values)):
        require_same_shape(name, value, "predicted", predicted)
        require_same_dtype(name, value, "predicted", predicted)
    returns = jax.lax.stop_gradient(returns)
    old_values = jax.lax.stop_gradient(old_values)
    clipped = jnp.maximum(jnp.minimum(predicted, old_values + clip), old_values - clip)
    plain_error = (predicted - returns) ** 2
    clipped_error = (clipped - returns) ** 2
    return 0.5 * jnp.maximum(plain_error, clipped_error)
