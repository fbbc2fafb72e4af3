"""GRPO's policy loss over per-token log-probs, composed as correction -> surrogate -> aggregation.

``compute_policy_loss(log_probs, batch, options, ref_log_probs)`` runs four small steps over a packed
batch (``[B, W]`` columns as ``dew.sessions.pack`` writes them):

1. ``read_inputs``: the trainable mask, advantages, and which likelihoods play *old* and
   *proximal*, by mode (below).
2. ``correct``: the rollout correction. It shrinks the kept mask (bands, sequence masks),
   may weight tokens (TIS cap, IcePop band) and reports the mismatch metrics.
3. ``surrogate``: the per-token policy terms of the loss ``options.policy_loss`` names in
   ``dew.rl``'s registry (``"ppo"``, ``"gspo"``, ``"cispo"`` or one registered with
   ``dew.rl.register_policy_loss``), then the KL to the reference when ``beta > 0``, by the
   estimator ``options.kl_estimator`` names (``dew.rl.kl_penalty``; k3 by default).
4. ``aggregate``: the registered aggregation ``options.aggregation`` names (``"token-mean"``,
   ``"session-mean"``, ...) into ``(loss_sum, weight)``.

For ``"ppo"`` with ``"token-mean"``, no token weights and the k3 KL (or none), steps 3 and 4 are one call of
``dew.rl.policy_loss`` (``_fused_policy``): the same loss, metrics and gradient to float
rounding, from one elementwise pass that also yields the gradient.

``PolicyLossOptions`` (``dew.objectives.rl.policy_options``) holds the static options and
checks them once, when it is built (``GRPOObjective`` builds it in its constructor); the steps only branch on those options and
on which fields the batch holds, so everything stays jit-safe.

Two modes, as in verl 0.9.1:

- decoupled (the batch has ``old_log_probs``): the PPO ratio is current over old;
  ``behavior_importance`` weights each token by old over behavior (a TIS cap, or an IcePop
  band that zeroes weights outside it, ``compute_rollout_correction_weights``), and the
  sequence masks compare old with behavior and drop whole chains from the loss
  (``compute_rollout_rejection_mask`` ``seq_sum_k1`` / ``seq_mean_k1``), as verl's trainer
  does before the actor update.
- bypass (no ``old_log_probs``): the behavior likelihoods stand in for the old policy
  (``compute_policy_loss_bypass_mode`` with ``loss_type="ppo_clip"``). The ratio then already
  is current over behavior, so a band only masks tokens whose detached current/behavior ratio
  leaves it (verl ``token_k1`` with thresholds ``1/high_1/low``) and the sequence masks compare
  the detached current policy with behavior. A TIS cap is refused: it would count the same
  correction twice.

A batch may carry the bounds themselves (``behavior_cap``, and for a band ``behavior_floor``,
one value on every row, as ``dew.rollouts.correction_caps.AdaptiveCorrection`` measures them);
they then replace the constants of ``behavior_importance``, whose kind (cap or band) still
decides which correction applies.

Rejected tokens leave the loss and its denominator, the KL term included: the KL is averaged
over the same kept tokens as the policy term. That is verl's decoupled behaviour (its trainer
rewrites ``response_mask`` before the actor sees it); in bypass mode verl rejects inside the
policy loss only and averages its KL over the unrejected mask, which Dew does not copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from dew.objectives.rl._fused_policy import fused_applies, fused_token_mean
from dew.objectives.rl._mismatch import mismatch_metrics
from dew.objectives.rl.policy_options import PolicyLossOptions
from dew.rl import (
    behavior_importance_weights,
    get_aggregation,
    get_policy_loss,
    icepop_weights,
    kl_penalty,
    masked_mean,
    sequence_rejection_mask,
    token_rejection_mask,
)

Metrics = dict[str, jax.Array]
#: The metrics verl's loss_scale_factor divides along with the loss (its agg_loss results).
_SCALED = ("policy/loss", "policy/entropy")


class Inputs(NamedTuple):
    """What the steps read from the batch, aligned with ``log_probs`` ``[B, W]``."""

    mask: jax.Array  # bool: trainable (sampled, not padding)
    segments: jax.Array | None  # int32 chain ids, when the batch has them
    advantages: jax.Array
    behavior: jax.Array | None  # the engine's likelihoods, when the batch has them
    old: jax.Array  # the ratio's denominator
    proximal: jax.Array  # what the corrections compare with behavior
    bypass: bool  # no old_log_probs: behavior stands in for old
    bounds: tuple[jax.Array | None, jax.Array | None] = (None, None)  # adaptive (floor, cap)


def _field(batch: Mapping[str, jax.Array], name: str, like: jax.Array) -> jax.Array:
    if name not in batch:
        raise KeyError(f"batch[{name!r}]: missing; a packed GRPO batch needs it")
    value = jnp.asarray(batch[name])
    if value.shape != like.shape:
        raise ValueError(
            f"batch[{name!r}]: expected shape {like.shape} aligned with input_ids, got {value.shape}"
        )
    return value


def read_inputs(
    log_probs: jax.Array, batch: Mapping[str, jax.Array], options: PolicyLossOptions
) -> Inputs:
    """Step 1: the mask, advantages and the old/proximal likelihoods of the batch's mode."""
    dtype = log_probs.dtype
    mask = _field(batch, "response_mask", log_probs) > 0
    segments = None
    if "text_segment_ids" in batch:
        segments = _field(batch, "text_segment_ids", log_probs).astype(jnp.int32)
        mask = mask & (segments > 0)
    advantages = _field(batch, "advantages", log_probs).astype(dtype)
    bypass = "old_log_probs" not in batch
    has_behavior = "behavior_log_probs" in batch
    if (bypass or options.corrected) and not has_behavior:
        why = "the batch has no old_log_probs (bypass mode)" if bypass else "a correction is set"
        raise KeyError(f"batch['behavior_log_probs']: missing; required because {why}")
    behavior = None
    if has_behavior:
        behavior = _field(batch, "behavior_log_probs", log_probs).astype(dtype)
    if bypass:
        if isinstance(options.behavior_importance, float):
            raise ValueError(
                "behavior_importance: a TIS cap needs old_log_probs in the batch; without them "
                "(bypass mode) the PPO ratio already is current over behavior and a cap would "
                "count that correction twice. Use a (low, high) band or rescore old_log_probs."
            )
        assert behavior is not None
        old, proximal = behavior, jax.lax.stop_gradient(log_probs)
    else:
        old = _field(batch, "old_log_probs", log_probs).astype(dtype)
        proximal = old
    # adaptive bounds (dew.rollouts.correction_caps): one value repeated on every row
    floor, cap = (jnp.max(jnp.asarray(batch[k])) if k in batch else None
                  for k in ("behavior_floor", "behavior_cap"))  # fmt: skip
    return Inputs(mask, segments, advantages, behavior, old, proximal, bypass, (floor, cap))


def correct(
    inputs: Inputs, options: PolicyLossOptions
) -> tuple[jax.Array, jax.Array | None, Metrics]:
    """Step 2: ``(keep [B, W] bool, token weights or None, metrics)`` of the correction."""
    mask, behavior, proximal = inputs.mask, inputs.behavior, inputs.proximal
    metrics: Metrics = {}
    keep = mask
    weights = None
    importance: Any = options.behavior_importance
    floor, cap = inputs.bounds
    if isinstance(importance, tuple):  # the batch's adaptive band replaces the constants
        importance = (importance[0] if floor is None else floor,
                      importance[1] if cap is None else cap)  # fmt: skip
    elif importance is not None and cap is not None:
        importance = cap
    if behavior is not None:
        if inputs.bypass and isinstance(importance, tuple):
            low, high = importance
            band = token_rejection_mask(proximal, behavior, mask, 1.0 / high, 1.0 / low)
            metrics["mask/behavior_band"] = masked_mean((~band).astype(jnp.float32), mask)
            keep = keep & band
        elif isinstance(importance, tuple):
            weights = icepop_weights(proximal, behavior, mask, *importance)
            outside = (weights == 0) & mask
            metrics["mask/behavior_band"] = masked_mean(outside.astype(jnp.float32), mask)
        elif importance is not None:
            weights = behavior_importance_weights(proximal, behavior, mask, importance)
        for name, bounds, mean in (
            ("sequence", options.sequence_mask, False),
            ("geometric", options.geometric_mask, True),
        ):
            if bounds is None:
                continue
            kept = (
                sequence_rejection_mask(
                    proximal,
                    behavior,
                    mask,
                    bounds[0],
                    bounds[1],
                    mean=mean,
                    segments=inputs.segments,
                )
                > 0
            )
            metrics[f"mask/{name}"] = masked_mean((mask & ~kept).astype(jnp.float32), mask)
            keep = keep & kept
        metrics.update(mismatch_metrics(proximal, behavior, mask, weights, importance))
    metrics["mask/kept_share"] = masked_mean(keep.astype(jnp.float32), mask)
    return keep, weights, metrics


def surrogate(
    log_probs: jax.Array,
    inputs: Inputs,
    keep: jax.Array,
    weights: jax.Array | None,
    options: PolicyLossOptions,
    ref_log_probs: jax.Array | None,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """Step 3: ``(policy terms, per-token loss with the KL, metrics)``, both ``[B, W]``."""
    advantages = inputs.advantages
    terms, pg = get_policy_loss(options.policy_loss)(
        log_probs,
        inputs.old,
        advantages,
        keep,
        segments=inputs.segments,
        epsilon_low=options.epsilon_low,
        epsilon_high=options.epsilon_high,
        dual_clip=options.dual_clip,
    )
    if weights is not None:
        terms = terms * weights
    zero = jnp.zeros((), jnp.float32)  # what a loss without the metric reports
    metrics: Metrics = {
        f"policy/{name}": pg.get(key, zero)
        for name, key in (
            ("clip_fraction", "pg_clipfrac"),
            ("clip_fraction_lower", "pg_clipfrac_lower"),
            ("ppo_kl", "ppo_kl"),
        )
    }
    per_token = jnp.where(keep, terms, 0.0)
    metrics["policy/advantage"] = masked_mean(advantages, keep)
    if options.beta > 0:
        if ref_log_probs is None:
            raise ValueError("ref_log_probs: beta > 0 needs the reference's log-probs, got None")
        dtype = log_probs.dtype
        safe_ref = jnp.where(keep, ref_log_probs.astype(dtype), 0.0)
        safe = jnp.where(keep, log_probs, 0.0)
        kl = jnp.where(keep, kl_penalty(safe, safe_ref, options.kl_estimator), 0.0)
        metrics["kl/reference"] = masked_mean(kl, keep)
        per_token = per_token + jnp.asarray(options.beta, dtype) * kl
    return terms, per_token, metrics


def aggregate(
    terms: jax.Array,
    per_token: jax.Array,
    keep: jax.Array,
    batch: Mapping[str, jax.Array],
    options: PolicyLossOptions,
    dtype: Any,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """Step 4: ``(loss_sum, weight, {"policy/loss", "tokens"})`` under the aggregation.

    The registered aggregation gives ``(loss_sum, weight)`` of ``per_token`` over ``keep``,
    with the batch's ``session_index`` as its group ids when the batch has it (the
    ``"session-mean"`` sessions); ``policy/loss`` is its ``total / weight`` of the policy terms.
    """
    aggregation = get_aggregation(options.registry_aggregation)
    sessions = None
    if "session_index" in batch:
        sessions = _field(batch, "session_index", per_token).astype(jnp.int32)
    loss_sum, weight = aggregation(per_token.astype(dtype), keep, sessions)
    pg_total, pg_weight = aggregation(jnp.where(keep, terms, 0.0).astype(dtype), keep, sessions)
    policy = pg_total / jnp.maximum(pg_weight, 1)
    metrics = {"policy/loss": policy, "tokens": jnp.sum(keep).astype(jnp.float32)}
    return loss_sum, weight, metrics


def entropy_bonus(
    entropy: jax.Array | None,
    keep: jax.Array,
    batch: Mapping[str, jax.Array],
    options: PolicyLossOptions,
    dtype: Any,
) -> tuple[jax.Array, Metrics]:
    """``(entropy_coeff * total, {"policy/entropy"})``: the amount the loss sum loses.

    ``total`` is the registered aggregation's total of ``entropy`` ``[B, W]`` over ``keep``
    (the batch's ``session_index`` as its groups, as in ``aggregate``). Its weight is the
    loss's own weight (the same mask and groups give the same weight), so ``loss_sum -
    entropy_coeff * total`` over that weight is verl's ``pg_loss - entropy_coeff *
    agg_loss(entropy)``, and it adds up over microbatches like the rest of the loss.
    ``policy/entropy`` is ``total / weight`` (verl's ``actor/entropy_loss``).
    """
    if entropy is None:
        raise ValueError("entropy: entropy_coeff != 0 needs the [B, W] token entropies, got None")
    entropy = _field({"entropy": entropy}, "entropy", keep).astype(dtype)
    sessions = None
    if "session_index" in batch:
        sessions = _field(batch, "session_index", keep).astype(jnp.int32)
    zero = jnp.zeros((), dtype)
    total, weight = get_aggregation(options.registry_aggregation)(
        jnp.where(keep, entropy, zero), keep, sessions
    )
    metrics = {"policy/entropy": total / jnp.maximum(weight, 1)}
    return jnp.asarray(options.entropy_coeff, dtype) * total, metrics


def compute_policy_loss(
    log_probs: jax.Array,
    batch: Mapping[str, jax.Array],
    options: PolicyLossOptions,
    ref_log_probs: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """``(loss_sum, weight, metrics)`` of the policy loss; the four steps in order.

    With ``options.entropy_coeff != 0`` the loss sum also loses ``entropy_coeff`` times the
    aggregated ``entropy`` (``[B, W]``, aligned with ``log_probs``; see ``entropy_bonus``);
    with 0 (the default) ``entropy`` is not read and the loss is unchanged.
    """
    inputs = read_inputs(log_probs, batch, options)
    keep, weights, metrics = correct(inputs, options)
    if fused_applies(options, weights):  # steps 3-4 in one pass: dew.rl.policy_loss
        loss_sum, weight, more = fused_token_mean(
            log_probs, inputs.old, inputs.advantages, keep, options, ref_log_probs
        )
    else:
        terms, per_token, surrogate_metrics = surrogate(
            log_probs, inputs, keep, weights, options, ref_log_probs
        )
        loss_sum, weight, aggregate_metrics = aggregate(
            terms, per_token, keep, batch, options, log_probs.dtype
        )
        more = {**surrogate_metrics, **aggregate_metrics}
    if options.entropy_coeff != 0:
        bonus, entropy_metrics = entropy_bonus(entropy, keep, batch, options, loss_sum.dtype)
        loss_sum = loss_sum - bonus
        more = {**more, **entropy_metrics}
    if options.loss_scale_factor is not None:  # seq-mean-token-sum-norm: every term
        scale = jnp.asarray(options.loss_scale_factor, loss_sum.dtype)
        loss_sum = loss_sum / scale
        more = {k: more[k] / scale if k in _SCALED else more[k] for k in more}
    return loss_sum, weight, jax.lax.stop_gradient({**metrics, **more})


def scored_policy_loss(
    score: Callable[[Mapping[str, Any], Mapping[str, jax.Array]], jax.Array],
    variables: Mapping[str, Any],
    batch: Mapping[str, jax.Array],
    options: PolicyLossOptions,
    reference: Mapping[str, Any] | None,
    score_reference: Callable[[Mapping[str, Any], Mapping[str, jax.Array]], jax.Array]
    | None = None,
    score_entropy: Callable[[Mapping[str, Any], Mapping[str, jax.Array]], tuple[jax.Array, ...]]
    | None = None,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """The policy loss of ``variables``: ``score`` them (and, when ``beta > 0``, the frozen
    ``reference`` under ``stop_gradient``) into ``[B, W]`` log-probs, then
    ``compute_policy_loss``. ``score(variables, batch)`` is the objective's
    ``packed_log_probs``; ``score_reference`` scores the reference when its tree differs
    (default: ``score``). With ``entropy_coeff != 0``, ``score_entropy(variables, batch)``
    (the objective's ``packed_log_probs_and_entropy``) replaces ``score``: log-probs and
    token entropies from one forward."""
    if options.beta > 0 and reference is None:
        raise ValueError(
            "reference: beta > 0 needs the frozen reference (TrainState.ema), got None"
        )
    entropy = None
    if options.entropy_coeff != 0:
        if score_entropy is None:
            raise ValueError("score_entropy: entropy_coeff != 0 needs it, got None")
        log_probs, entropy = score_entropy(variables, batch)
    else:
        log_probs = score(variables, batch)
    ref_log_probs = None
    if reference is not None and options.beta > 0:
        ref_score = score if score_reference is None else score_reference
        ref_log_probs = jax.lax.stop_gradient(ref_score(reference, batch))
    return compute_policy_loss(log_probs, batch, options, ref_log_probs, entropy)


def policy_loss_from_log_probs(
    log_probs: jax.Array,
    batch: Mapping[str, jax.Array],
    *,
    ref_log_probs: jax.Array | None = None,
    **options: Any,
) -> tuple[jax.Array, jax.Array, Metrics]:
    """GRPO's ``(loss_sum, weight, metrics)`` from per-token log-probs ``[B, W]``.

    ``log_probs`` is aligned with ``batch["input_ids"]`` (what ``packed_log_probs``
    returns); ``ref_log_probs`` likewise, needed when ``beta > 0``. ``options`` are the
    fields of ``PolicyLossOptions`` (``policy_loss``, ``aggregation``, ``beta``, the clip
    range, ``dual_clip`` and the corrections), meaning what they mean on
    ``GRPOObjective``; an unknown one is a ``TypeError`` naming it. They are checked on every
    call, so a caller that computes the loss repeatedly builds a ``PolicyLossOptions`` once
    and calls ``compute_policy_loss`` instead. Pure and jit-safe.
    """
    return compute_policy_loss(log_probs, batch, PolicyLossOptions(**options), ref_log_probs)


__all__ = [
    "PolicyLossOptions",
    "aggregate",
    "correct",
    "compute_policy_loss",
    "entropy_bonus",
    "policy_loss_from_log_probs",
    "read_inputs",
    "scored_policy_loss",
    "surrogate",
]
