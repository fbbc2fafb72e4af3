"""GRPO's PPO token-mean loss through ``dew.rl.policy_loss``, the fused library path.

``compute_policy_loss`` takes this path when it applies (``fused_applies``): the ``"ppo"``
surrogate, ``"token-mean"`` aggregation and no token weights (no TIS cap, no IcePop band;
the sequence and band masks only shrink ``keep`` and are fine). Then the surrogate, the k3
KL to the reference (``beta > 0``) and their gradient in ``log_probs`` come from one
elementwise pass instead of ``surrogate`` and ``aggregate``'s per-term arrays.

It returns what those two steps return, ``(loss_sum, weight, metrics)`` with the same
metric names, up to float rounding: ``loss_sum`` is the token mean times the kept count
(0 when nothing is kept, with a zero gradient) instead of the direct sum, and
``kl/reference`` is the exact token mean of the KL (verl's ``actor/kl_loss``) instead of
``masked_mean``'s division by ``count + 1e-8``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.rl.policy_options import PolicyLossOptions
from dew.rl import masked_mean, policy_loss

Metrics = dict[str, jax.Array]


def fused_applies(options: PolicyLossOptions, weights: jax.Array | None) -> bool:
    """True when ``dew.rl.policy_loss`` computes this loss: PPO, token mean, no weights, and
    the k3 KL (``kl_estimator`` ``"low_var_kl"``/``"k3"``, or ``beta == 0``: no KL term).

    The one place that compares loss names: ``"ppo"`` and ``"token-mean"`` are built-in
    registry entries, which no registration can replace, so the names pin the functions the
    fused loss stands in for.
    """
    k3 = options.beta == 0 or options.kl_estimator in ("low_var_kl", "k3")
    return (
        options.policy_loss == "ppo"
        and options.aggregation == "token-mean"
        and weights is None
        and k3
    )


def fused_token_mean(
    log_probs: jax.Array,
    old: jax.Array,
    advantages: jax.Array,
    keep: jax.Array,
    options: PolicyLossOptions,
    ref_log_probs: jax.Array | None,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """``(loss_sum, weight, metrics)`` of the PPO token-mean loss over ``keep`` ([B, W] bool).

    ``old`` and ``advantages`` are ``[B, W]`` in ``log_probs``' dtype (``read_inputs``);
    ``ref_log_probs`` is required when ``beta > 0`` and cast to that dtype.
    """
    dtype: Any = log_probs.dtype
    ref = None
    if options.beta > 0:
        if ref_log_probs is None:
            raise ValueError("ref_log_probs: beta > 0 needs the reference's log-probs, got None")
        ref = ref_log_probs.astype(dtype)
    loss, pg = policy_loss(
        log_probs,
        old,
        advantages,
        keep,
        ref,
        options.epsilon_low,
        options.epsilon_high,
        options.dual_clip,
        options.beta if ref is not None else 0.0,
    )
    weight = jnp.sum(keep).astype(dtype)
    present = weight > 0
    zero = jnp.zeros((), dtype)
    # An empty batch has a nan mean; the select keeps nan out of the sum and the gradient.
    loss_sum = jnp.where(present, loss * weight, zero)
    metrics: Metrics = {
        "policy/clip_fraction": pg["pg_clipfrac"],
        "policy/clip_fraction_lower": pg["pg_clipfrac_lower"],
        "policy/ppo_kl": pg["ppo_kl"],
        "policy/advantage": masked_mean(advantages, keep),
        "policy/loss": jnp.where(present, pg["pg_loss"], zero),
        "tokens": jnp.sum(keep).astype(jnp.float32),
    }
    if ref is not None:
        metrics["kl/reference"] = jnp.where(present, pg["kl_loss"], zero)
    return loss_sum, weight, metrics
