"""The built-in entries of :mod:`dew.rl._registry`: policy losses, estimators, aggregations.

A composition layer like ``dew.rl.__init__``, not a theme: each entry adapts functions of
the themed modules to the one signature its registry fixes (see ``_registry``), so it
imports from the themes, which themes never do from each other. Nothing here is new math.

Policy losses, ``loss(log_probs, old_log_probs, advantages, mask, *, segments,
epsilon_low, epsilon_high, dual_clip) -> (terms [B, T], metrics)``:

- ``"ppo"``: :func:`token_log_ratio` then :func:`clipped_surrogate_terms` with the dual
  clip (verl ``compute_policy_loss_vanilla``);
- ``"gspo"``: :func:`sequence_log_ratio` (per chain when ``segments`` is given) then the
  surrogate without the dual clip (verl ``compute_policy_loss_gspo``); its ``ppo_kl`` is the
  token log ratio's, not the sequence one's, as verl reports it;
- ``"cispo"``: :func:`cispo_terms` (no dual clip, no segments).

Estimators, ``estimator(rewards [B], group_ids [B], mask, eps) -> [B]``: the estimators of
:func:`ragged_group_advantage`, one entry each.

Aggregations, ``aggregation(x [B, T], mask, group_ids) -> (total, weight)``, the loss being
``total / weight`` and, over microbatches, ``sum(total) / sum(weight)``:

- ``"token-mean"``: the kept sum over the kept count (verl ``agg_loss`` ``"token-mean"``);
- ``"session-mean"``: the sum of each group's mean (its kept sum over its kept count +
  1e-8, verl's ``"seq-mean-token-mean"`` with groups by id for sequences, see
  :func:`group_sums`) over the number of groups holding a kept position;
- ``"seq-mean-token-mean"``: the same function under verl's name (a sequence is a group);
- ``"seq-mean-token-sum"``: the kept sum over the number of groups holding a kept position
  (each group's token sum, averaged over groups; verl ``"seq-mean-token-sum"``).

Weights, and so micro-batches and devices: ``"token-mean"``'s weight is the kept token
count and the group modes' the number of groups with a kept position, both additive, so
summing ``(total, weight)`` over micro-batches or devices gives the whole batch's loss as
long as no group is split between them (a split group counts once in each part: its
``"session-mean"`` mean becomes two means, its ``"seq-mean-token-sum"`` sum stays whole
but its count doubles).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.rl._cispo import cispo_terms
from dew.rl._clipped_surrogate import clipped_surrogate_terms
from dew.rl._group import ESTIMATORS, GROUP_EPS, ragged_group_advantage
from dew.rl._masking import COUNT_EPS, keep_of, select
from dew.rl._ratios import sequence_log_ratio, token_log_ratio
from dew.rl._reductions import group_sums, masked_mean

Metrics = dict[str, jax.Array]


def ppo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    segments: jax.Array | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, Metrics]:
    """PPO/GRPO: the dual-clipped surrogate of the token log ratio (``segments`` unused)."""
    del segments
    log_ratio = token_log_ratio(log_probs, old_log_probs)
    return clipped_surrogate_terms(
        log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
    )


def gspo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    segments: jax.Array | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, Metrics]:
    """GSPO: the surrogate of the sequence log ratio, never dual-clipped (``dual_clip`` unused).

    ``ppo_kl`` is the masked mean of the negated token log ratio (unclamped), the value
    verl 0.9.1 ``compute_policy_loss_gspo`` reports, not the sequence ratio's.
    """
    del dual_clip
    log_ratio = sequence_log_ratio(log_probs, old_log_probs, mask, segments)
    terms, metrics = clipped_surrogate_terms(
        log_ratio, advantages, mask, epsilon_low, epsilon_high, None
    )
    return terms, {**metrics, "ppo_kl": masked_mean(-(log_probs - old_log_probs), mask)}


def cispo_policy_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    segments: jax.Array | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, Metrics]:
    """CISPO: :func:`cispo_terms` (``segments`` and ``dual_clip`` unused)."""
    del segments, dual_clip
    return cispo_terms(log_probs, old_log_probs, advantages, mask, epsilon_low, epsilon_high)


POLICY_LOSSES: dict[str, Callable[..., tuple[jax.Array, Metrics]]] = {
    "ppo": ppo_terms,
    "gspo": gspo_terms,
    "cispo": cispo_policy_terms,
}


def _ragged_estimator(estimator: str) -> Callable[..., jax.Array]:
    """``ragged_group_advantage`` with ``estimator`` fixed, in the registry's signature."""

    def estimate(
        rewards: jax.Array,
        group_ids: jax.Array,
        mask: jax.Array | None = None,
        eps: float = GROUP_EPS,
    ) -> jax.Array:
        return ragged_group_advantage(rewards, group_ids, mask, estimator, eps)

    estimate.__name__ = estimate.__qualname__ = f"{estimator}_advantage"
    estimate.__doc__ = f"``ragged_group_advantage(..., estimator={estimator!r})``."
    return estimate


ADVANTAGE_ESTIMATORS = {name: _ragged_estimator(name) for name in ESTIMATORS}


def token_mean_total(
    x: jax.Array, mask: jax.Array, group_ids: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """``(kept sum, kept count)``, the count in ``x``'s dtype (``group_ids`` unused)."""
    del group_ids
    keep = keep_of(mask)
    return jnp.sum(select(x, keep)), jnp.sum(keep).astype(x.dtype)


def _present_groups(
    x: jax.Array, mask: jax.Array, group_ids: jax.Array | None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(sums, counts, present)`` per group id (``group_sums``), ``present`` the groups with a
    kept position; a missing ``group_ids`` is refused."""
    if group_ids is None:
        raise ValueError(
            "group_ids: expected [B, T] integer ids of the sessions to aggregate over "
            "(the GRPO objective passes the batch's session_index), got None"
        )
    sums, counts = group_sums(x, mask, group_ids)
    return sums, counts, counts > 0


def session_mean_total(
    x: jax.Array, mask: jax.Array, group_ids: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """``(sum of the groups' means, number of groups with a kept position)`` in ``x``'s dtype.

    A group's mean is its kept sum over its kept count + 1e-8 (that constant added in
    ``x``'s dtype). ``group_ids`` is required.
    """
    sums, counts, present = _present_groups(x, mask, group_ids)
    means = sums / (counts.astype(x.dtype) + jnp.asarray(COUNT_EPS, x.dtype))
    return jnp.sum(jnp.where(present, means, 0.0)), jnp.sum(present).astype(x.dtype)


def session_sum_total(
    x: jax.Array, mask: jax.Array, group_ids: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """``(kept sum, number of groups with a kept position)`` in ``x``'s dtype: the mean over
    groups of each group's token sum. ``group_ids`` is required."""
    sums, _, present = _present_groups(x, mask, group_ids)
    return jnp.sum(jnp.where(present, sums, 0.0)), jnp.sum(present).astype(x.dtype)


AGGREGATIONS = {
    "token-mean": token_mean_total,
    "session-mean": session_mean_total,
    "seq-mean-token-mean": session_mean_total,
    "seq-mean-token-sum": session_sum_total,
}
