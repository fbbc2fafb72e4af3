"""The trainer/sampler mismatch metrics GRPO's rollout correction reports (``correct``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl import masked_mean

Metrics = dict[str, jax.Array]


def mismatch_metrics(
    proximal: jax.Array,
    behavior: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None,
    behavior_importance: float | tuple[float, float] | None,
) -> Metrics:
    """verl ``compute_offpolicy_metrics`` kl/k3_kl and ``compute_is_metrics`` ESS.

    ``mismatch/kl`` is the token mean of ``behavior - proximal`` (KL(behavior || proximal)),
    ``mismatch/k3_kl`` that of ``exp(r) - r - 1`` with ``r = proximal - behavior``, and
    ``mismatch/ess`` ``1 / mean((w / mean(w))^2)`` over the IS weights clamped to
    ``[0, upper]`` (verl's effective sample size); without an IS setting the raw token
    ratios (log clamped to +-20) stand in.
    """
    proximal = jax.lax.stop_gradient(proximal)
    log_ratio = jnp.where(mask, proximal - behavior, 0.0)
    out = {
        "mismatch/kl": masked_mean(-log_ratio, mask),
        "mismatch/k3_kl": masked_mean(jnp.exp(log_ratio) - log_ratio - 1.0, mask),
    }
    if weights is None:
        w = jnp.where(mask, jnp.exp(jnp.clip(log_ratio, -20.0, 20.0)), 0.0)
    else:
        upper = (
            behavior_importance[1]
            if isinstance(behavior_importance, tuple)
            else behavior_importance
        )
        w = jnp.clip(weights, 0.0, upper)
    mean = masked_mean(w, mask)
    normalised = w / (mean + 1e-8)
    out["mismatch/ess"] = 1.0 / masked_mean(normalised * normalised, mask)
    return out
