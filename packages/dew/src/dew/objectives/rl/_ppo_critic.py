"""PPO's critic half: the value of the state before each packed id, and the value loss.

Both work on packed batches ``[B, W]`` (``W = seq_len + 1``, every column aligned with
``input_ids``): ``packed_values`` runs the critic and aligns its output with the policy's
log-probs; ``value_loss_terms`` is verl 0.9.1's clipped value loss
(``compute_value_loss``, through ``dew.rl.clipped_value_loss_terms``) with the critic's
metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.scoring import same_chain
from dew.rl import clipped_value_loss_terms, masked_mean


def packed_values(
    critic: Any, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
) -> jax.Array:
    """``[B, W]`` float32 critic value of the state before each id, 0 where no state is.

    The critic reads ``input_ids[:, :-1]`` with the rows' segment ids and positions and
    returns ``[B, W - 1]``; column ``t`` of the result is its output at column ``t - 1``, the
    same alignment as ``packed_log_probs``. The first id of every chain, padding and column 0
    get 0.
    """
    ids = jnp.asarray(batch["input_ids"])
    segments = jnp.asarray(batch["text_segment_ids"])
    positions = jnp.asarray(batch["text_positions"])
    values = critic.apply(
        variables, ids[:, :-1], segment_ids=segments[:, :-1], positions=positions[:, :-1]
    )
    expected = (ids.shape[0], ids.shape[1] - 1)
    if tuple(values.shape) != expected:
        raise ValueError(
            f"critic: expected one value per position, shape {expected} for input_ids "
            f"{tuple(ids.shape[:1]) + (ids.shape[1] - 1,)}, got {tuple(values.shape)}"
        )
    values = values.astype(jnp.float32)
    values = jnp.where(same_chain(segments), values, 0.0)
    return jnp.concatenate([jnp.zeros_like(values[:, :1]), values], axis=1)


def value_loss_terms(
    values: jax.Array,
    batch: Mapping[str, jax.Array],
    mask: jax.Array,
    value_clip: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``[B, W]`` clipped half-squared value errors (0 off ``mask``) and critic metrics.

    ``values`` are ``packed_values``' ``[B, W]`` float32 predictions; ``batch`` holds
    ``returns`` and ``old_values`` of that shape and ``mask`` ``[B, W]`` marks the tokens
    that train. Every input is replaced with 0 off the mask before any arithmetic, so a nan
    in padding reaches neither the terms nor the metrics (token means over the mask, without
    gradient): ``critic/loss``, ``critic/clip_fraction`` (verl ``vf_clipfrac``: the share
    where the clipped error is the larger), ``critic/error`` (``(V - R)^2``),
    ``critic/value`` and ``critic/return``.
    """
    returns = jnp.where(mask, jnp.asarray(batch["returns"]).astype(jnp.float32), 0.0)
    old = jnp.where(mask, jnp.asarray(batch["old_values"]).astype(jnp.float32), 0.0)
    predicted = jnp.where(mask, values, 0.0)
    terms = jnp.where(mask, clipped_value_loss_terms(predicted, returns, old, value_clip), 0.0)
    clipped = jnp.maximum(jnp.minimum(predicted, old + value_clip), old - value_clip)
    plain = (predicted - returns) ** 2
    metrics = {
        "critic/loss": masked_mean(terms, mask),
        "critic/clip_fraction": masked_mean(
            ((clipped - returns) ** 2 > plain).astype(jnp.float32), mask
        ),
        "critic/error": masked_mean(plain, mask),
        "critic/value": masked_mean(predicted, mask),
        "critic/return": masked_mean(returns, mask),
    }
    return terms, jax.lax.stop_gradient(metrics)


__all__ = ["packed_values", "value_loss_terms"]
