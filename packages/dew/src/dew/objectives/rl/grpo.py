"""GRPO over packed session rows, composed from ``dew.rl``.

The batch is what ``dew.objectives.rollouts.pack`` writes: ``[B, W]`` rows of chains with
``input_ids``, ``text_segment_ids``, ``text_positions``, ``response_mask``, ``advantages``,
``behavior_log_probs``, ``session_index`` and, when a proximal policy was recorded or
rescored, ``old_log_probs``. ``W = seq_len + 1``: the objective predicts ``seq_len`` next
tokens per row.

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

Rejected tokens leave the loss and its denominator, the KL term included: the KL is averaged
over the same kept tokens as the policy term. That is verl's decoupled behaviour (its trainer
rewrites ``response_mask`` before the actor sees it); in bypass mode verl rejects inside the
policy loss only and averages its KL over the unrejected mask, which Dew does not copy.

``loss`` returns ``(loss_sum, weight, metrics)``: for ``aggregation="token-mean"`` the sum of
per-token losses over kept tokens and their count (verl ``token-mean``); for
``"session-mean"`` the sum over sessions of each session's token mean and the number of
sessions with a kept token (verl ``seq-mean-token-mean`` when a session is one chain; with
several chains a session still counts once, Agent Lightning's per-rollout mean). With
``Trainer(microbatches=k)`` the sums add up across microbatches; a session whose chains land
in two microbatches then counts once in each.

Metrics (scalars, no gradient): ``policy/loss``, ``policy/clip_fraction`` and
``policy/clip_fraction_lower`` (verl ``pg_clipfrac``/``pg_clipfrac_lower``), ``policy/ppo_kl``,
``policy/advantage``, ``kl/reference`` (token mean of k3, when ``beta > 0``), ``tokens``;
with behavior likelihoods ``mismatch/kl``, ``mismatch/k3_kl``, ``mismatch/ess``; each active
mask's share of trainable tokens removed (``mask/behavior_band``, ``mask/sequence``,
``mask/geometric``) and ``mask/kept_share``; ``reward/mean`` when the batch has ``rewards``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.objectives.base import validate_pretrained
from dew.objectives.scoring import (
    packed_log_probs,
    positions_from_segments,
    summarize_nll,
    target_log_probs,
)
from dew.rl import (
    behavior_importance_weights,
    cispo_terms,
    clipped_surrogate_terms,
    icepop_weights,
    k3_kl,
    masked_mean,
    sequence_log_ratio,
    sequence_rejection_mask,
    token_log_ratio,
    token_rejection_mask,
)

POLICY_LOSSES = ("ppo", "gspo", "cispo")
AGGREGATIONS = ("token-mean", "session-mean")
SESSION_EPS = 1e-8  # verl's per-sequence ``count + 1e-8`` in seq-mean-token-mean
_UNSET = object()


def _band(value: Any, field: str) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{field}: expected None or a (low, high) pair, got {value!r}") from err
    if not (0.0 < low <= high) or not math.isfinite(high):
        raise ValueError(f"{field}: expected 0 < low <= high < inf, got ({low}, {high})")
    return low, high


def _behavior_importance(value: Any) -> float | tuple[float, float] | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"behavior_importance: expected None, a cap or (low, high), got {value!r}")
    if isinstance(value, int | float):
        cap = float(value)
        if not (cap > 0.0 and math.isfinite(cap)):
            raise ValueError(f"behavior_importance: expected a positive finite cap, got {value!r}")
        return cap
    return _band(value, "behavior_importance")


def _session_totals(
    values: jax.Array, keep: jax.Array, session_index: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per-session sum of ``values`` over ``keep`` and kept count, over dense session slots."""
    flat = jnp.where(keep, session_index, -1).reshape(-1)
    _, dense = jnp.unique(flat, size=flat.size, fill_value=-1, return_inverse=True)
    dense = dense.reshape(-1)
    totals = jax.ops.segment_sum(
        jnp.where(keep, values, 0.0).reshape(-1), dense, num_segments=flat.size
    )
    counts = jax.ops.segment_sum(keep.reshape(-1).astype(jnp.int32), dense, num_segments=flat.size)
    return totals, counts


def _field(batch: Mapping[str, jax.Array], name: str, like: jax.Array) -> jax.Array:
    if name not in batch:
        raise KeyError(f"batch[{name!r}]: missing; a packed GRPO batch needs it")
    value = jnp.asarray(batch[name])
    if value.shape != like.shape:
        raise ValueError(
            f"batch[{name!r}]: expected shape {like.shape} aligned with input_ids, got {value.shape}"
        )
    return value


def policy_loss_from_log_probs(
    log_probs: jax.Array,
    batch: Mapping[str, jax.Array],
    *,
    policy_loss: str = "ppo",
    aggregation: str = "token-mean",
    beta: float = 0.0,
    ref_log_probs: jax.Array | None = None,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
    behavior_importance: float | tuple[float, float] | None = None,
    sequence_mask: tuple[float, float] | None = None,
    geometric_mask: tuple[float, float] | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """GRPO's ``(loss_sum, weight, metrics)`` from per-token log-probs ``[B, W]``.

    ``log_probs`` is aligned with ``batch["input_ids"]`` (what :func:`packed_log_probs`
    returns); ``ref_log_probs`` likewise, needed when ``beta > 0``. The options mean what
    they mean on :class:`GRPOObjective`. Pure and jit-safe; Python only branches on which
    fields the batch holds and on the static options.
    """
    if policy_loss not in POLICY_LOSSES:
        raise ValueError(f"policy_loss: expected one of {POLICY_LOSSES}, got {policy_loss!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: expected one of {AGGREGATIONS}, got {aggregation!r}")
    behavior_importance = _behavior_importance(behavior_importance)
    sequence_mask = _band(sequence_mask, "sequence_mask")
    geometric_mask = _band(geometric_mask, "geometric_mask")
    dtype = log_probs.dtype
    response = _field(batch, "response_mask", log_probs)
    mask = response > 0
    if "text_segment_ids" in batch:
        segments = _field(batch, "text_segment_ids", log_probs).astype(jnp.int32)
        mask = mask & (segments > 0)
    else:
        segments = None
    advantages = _field(batch, "advantages", log_probs).astype(dtype)
    bypass = "old_log_probs" not in batch
    corrected = behavior_importance is not None or sequence_mask or geometric_mask
    has_behavior = "behavior_log_probs" in batch
    if (bypass or corrected) and not has_behavior:
        why = "the batch has no old_log_probs (bypass mode)" if bypass else "a correction is set"
        raise KeyError(f"batch['behavior_log_probs']: missing; required because {why}")
    behavior = (
        _field(batch, "behavior_log_probs", log_probs).astype(dtype) if has_behavior else None
    )
    if bypass:
        if isinstance(behavior_importance, float):
            raise ValueError(
                "behavior_importance: a TIS cap needs old_log_probs in the batch; without them "
                "(bypass mode) the PPO ratio already is current over behavior and a cap would "
                "count that correction twice. Use a (low, high) band or rescore old_log_probs."
            )
        assert behavior is not None
        old = behavior
        proximal = jax.lax.stop_gradient(log_probs)
    else:
        old = _field(batch, "old_log_probs", log_probs).astype(dtype)
        proximal = old

    metrics: dict[str, jax.Array] = {}
    keep = mask
    weights = None
    if behavior is not None:
        if bypass and isinstance(behavior_importance, tuple):
            low, high = behavior_importance
            band = token_rejection_mask(proximal, behavior, mask, 1.0 / high, 1.0 / low)
            metrics["mask/behavior_band"] = masked_mean((~band).astype(jnp.float32), mask)
            keep = keep & band
        elif isinstance(behavior_importance, tuple):
            weights = icepop_weights(proximal, behavior, mask, *behavior_importance)
            outside = (weights == 0) & mask
            metrics["mask/behavior_band"] = masked_mean(outside.astype(jnp.float32), mask)
        elif behavior_importance is not None:
            weights = behavior_importance_weights(proximal, behavior, mask, behavior_importance)
        for name, bounds, mean in (
            ("sequence", sequence_mask, False),
            ("geometric", geometric_mask, True),
        ):
            if bounds is None:
                continue
            kept = (
                sequence_rejection_mask(
                    proximal, behavior, mask, bounds[0], bounds[1], mean=mean, segments=segments
                )
                > 0
            )
            metrics[f"mask/{name}"] = masked_mean((mask & ~kept).astype(jnp.float32), mask)
            keep = keep & kept
        metrics.update(_mismatch_metrics(proximal, behavior, mask, weights, behavior_importance))
    metrics["mask/kept_share"] = masked_mean(keep.astype(jnp.float32), mask)

    if policy_loss == "ppo":
        log_ratio = token_log_ratio(log_probs, old)
        terms, pg = clipped_surrogate_terms(
            log_ratio, advantages, keep, epsilon_low, epsilon_high, dual_clip
        )
    elif policy_loss == "gspo":
        log_ratio = sequence_log_ratio(log_probs, old, keep, segments)
        terms, pg = clipped_surrogate_terms(
            log_ratio, advantages, keep, epsilon_low, epsilon_high, None
        )
        pg = {**pg, "ppo_kl": masked_mean(-(log_probs - old), keep)}
    else:
        terms, pg = cispo_terms(log_probs, old, advantages, keep, epsilon_low, epsilon_high)
    if weights is not None:
        terms = terms * weights
    metrics["policy/clip_fraction"] = pg["pg_clipfrac"]
    metrics["policy/clip_fraction_lower"] = pg.get("pg_clipfrac_lower", jnp.zeros((), jnp.float32))
    metrics["policy/ppo_kl"] = pg["ppo_kl"]
    per_token = jnp.where(keep, terms, 0.0)
    metrics["policy/advantage"] = masked_mean(advantages, keep)
    if beta > 0:
        if ref_log_probs is None:
            raise ValueError("ref_log_probs: beta > 0 needs the reference's log-probs, got None")
        safe_ref = jnp.where(keep, ref_log_probs.astype(dtype), 0.0)
        kl = jnp.where(keep, k3_kl(jnp.where(keep, log_probs, 0.0), safe_ref), 0.0)
        metrics["kl/reference"] = masked_mean(kl, keep)
        per_token = per_token + jnp.asarray(beta, dtype) * kl

    if aggregation == "token-mean":
        loss_sum = jnp.sum(per_token)
        weight = jnp.sum(keep).astype(dtype)
        metrics["policy/loss"] = jnp.sum(jnp.where(keep, terms, 0.0)) / jnp.maximum(weight, 1)
    else:
        session_index = _field(batch, "session_index", log_probs).astype(jnp.int32)
        totals, counts = _session_totals(per_token, keep, session_index)
        present = counts > 0
        means = totals / (counts.astype(dtype) + jnp.asarray(SESSION_EPS, dtype))
        loss_sum = jnp.sum(jnp.where(present, means, 0.0))
        weight = jnp.sum(present).astype(dtype)
        pg_totals, _ = _session_totals(terms, keep, session_index)
        pg_means = pg_totals / (counts.astype(dtype) + jnp.asarray(SESSION_EPS, dtype))
        metrics["policy/loss"] = jnp.sum(jnp.where(present, pg_means, 0.0)) / jnp.maximum(weight, 1)
    metrics["tokens"] = jnp.sum(keep).astype(jnp.float32)
    return loss_sum, weight, jax.lax.stop_gradient(metrics)


def _mismatch_metrics(
    proximal: jax.Array,
    behavior: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None,
    behavior_importance: float | tuple[float, float] | None,
) -> dict[str, jax.Array]:
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


class GRPOObjective:
    """Group-relative policy optimisation on packed session rows.

    Args:
      model: a ``dew.models`` decoder (``apply(variables, ids, segment_ids=, positions=)``).
      seq_len: predicted positions per row; batches are ``[B, seq_len + 1]``.
      beta: coefficient of the k3 KL to the frozen reference; ``> 0`` keeps the starting
        policy in ``TrainState.ema`` (``ema_decay`` is then fixed at 1.0), 0 keeps none.
      pretrained: full variables mapping (``{"params": ...}``) the policy starts from.
      epsilon_low, epsilon_high: PPO clip range ``[1 - low, 1 + high]``.
      dual_clip: verl's ``clip_ratio_c`` (> 1) capping negative-advantage tokens; None
        disables it. GSPO never dual-clips.
      policy_loss: ``"ppo"`` (dual-clipped token surrogate, verl ``compute_policy_loss_vanilla``),
        ``"gspo"`` (sequence ratio pooled per chain, ``compute_policy_loss_gspo``) or
        ``"cispo"`` (``-sg(clip(r)) * A * log pi``, ``compute_policy_loss_cispo``).
      aggregation: ``"token-mean"`` or ``"session-mean"``.
      behavior_importance: None; a cap ``c`` (token TIS weight ``min(pi_old / mu, c)``); or
        ``(low, high)`` (IcePop: weight zero outside the band; in bypass mode the band masks).
      sequence_mask: ``(low, high)``: drop a chain whose summed k1 ``log(mu / pi_old)``
        leaves ``[log low, log high]`` (verl ``seq_sum_k1``).
      geometric_mask: the same with the chain's mean k1 (verl ``seq_mean_k1``).
      sampling_temperature: score ids at this temperature (and over ``support_ids`` when the
        batch has them), matching what the sampler drew from.
      ema_decay: refused unless it equals the fixed value above.
    """

    def __init__(
        self,
        model: Any,
        seq_len: int,
        beta: float = 0.0,
        pretrained: Mapping[str, Any] | None = None,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        dual_clip: float | None = 3.0,
        policy_loss: str = "ppo",
        aggregation: str = "token-mean",
        behavior_importance: float | tuple[float, float] | None = None,
        sequence_mask: tuple[float, float] | None = None,
        geometric_mask: tuple[float, float] | None = None,
        sampling_temperature: float | None = None,
        ema_decay: Any = _UNSET,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        beta = float(beta)
        if not (beta >= 0.0 and math.isfinite(beta)):
            raise ValueError(f"beta: expected a finite value >= 0, got {beta!r}")
        for name, eps in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
            if not (float(eps) >= 0.0 and math.isfinite(float(eps))):
                raise ValueError(f"{name}: expected a finite value >= 0, got {eps!r}")
        if dual_clip is not None and not float(dual_clip) > 1.0:
            raise ValueError(f"dual_clip: expected None or a value above 1.0, got {dual_clip!r}")
        if policy_loss not in POLICY_LOSSES:
            raise ValueError(f"policy_loss: expected one of {POLICY_LOSSES}, got {policy_loss!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation: expected one of {AGGREGATIONS}, got {aggregation!r}")
        if sampling_temperature is not None and not float(sampling_temperature) > 0.0:
            raise ValueError(
                f"sampling_temperature: expected None or a value > 0, got {sampling_temperature!r}"
            )
        validate_pretrained(pretrained)
        fixed = 1.0 if beta > 0 else None
        if ema_decay is not _UNSET and ema_decay != fixed:
            raise ValueError(
                f"ema_decay: GRPO fixes it at {fixed!r} (a frozen reference when beta > 0, none "
                f"otherwise); got {ema_decay!r}"
            )
        self.model = model
        self.seq_len = seq_len
        self.beta = beta
        self.pretrained = pretrained
        self.epsilon_low = float(epsilon_low)
        self.epsilon_high = float(epsilon_high)
        self.dual_clip = None if dual_clip is None else float(dual_clip)
        self.policy_loss = policy_loss
        self.aggregation = aggregation
        self.behavior_importance = _behavior_importance(behavior_importance)
        self.sequence_mask = _band(sequence_mask, "sequence_mask")
        self.geometric_mask = _band(geometric_mask, "geometric_mask")
        self.sampling_temperature = (
            None if sampling_temperature is None else float(sampling_temperature)
        )

    @property
    def ema_decay(self) -> float | None:
        """1.0 (frozen reference) when ``beta > 0``, else None."""
        return 1.0 if self.beta > 0 else None

    @property
    def width(self) -> int:
        """Row width of the batches this objective trains on (``seq_len + 1``)."""
        return self.seq_len + 1

    def init(self, key: jax.Array) -> dict[str, Any]:
        """``pretrained`` when given, else fresh model variables."""
        if self.pretrained is not None:
            return dict(self.pretrained)
        dummy = jnp.zeros((1, self.width), jnp.int32)
        return dict(self.model.init(key, dummy))

    def packed_log_probs(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> jax.Array:
        """``[B, W]`` log-probs of every id given its own chain (see :func:`packed_log_probs`)."""
        self._check_width(batch)
        return packed_log_probs(self.model, variables, batch, self.sampling_temperature)

    def _check_width(self, batch: Mapping[str, jax.Array]) -> None:
        shape = tuple(jnp.shape(batch["input_ids"]))
        if len(shape) != 2 or shape[1] != self.width:
            raise ValueError(
                f"batch['input_ids']: expected [B, seq_len + 1] = [B, {self.width}], got {shape}"
            )

    def options(self) -> dict[str, Any]:
        """The loss options, as :func:`policy_loss_from_log_probs` takes them."""
        return {
            "policy_loss": self.policy_loss,
            "aggregation": self.aggregation,
            "beta": self.beta,
            "epsilon_low": self.epsilon_low,
            "epsilon_high": self.epsilon_high,
            "dual_clip": self.dual_clip,
            "behavior_importance": self.behavior_importance,
            "sequence_mask": self.sequence_mask,
            "geometric_mask": self.geometric_mask,
        }

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, jax.Array],
        key: jax.Array,
        reference: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(loss_sum, weight, metrics)`` for one packed (micro)batch."""
        del key
        log_probs = self.packed_log_probs(variables, batch)
        ref_log_probs = None
        if self.beta > 0:
            if reference is None:
                raise ValueError(
                    "reference: beta > 0 needs the frozen reference (TrainState.ema), got None"
                )
            ref_log_probs = jax.lax.stop_gradient(self.packed_log_probs(reference, batch))
        loss_sum, weight, metrics = policy_loss_from_log_probs(
            log_probs, batch, ref_log_probs=ref_log_probs, **self.options()
        )
        if "rewards" in batch:  # SampledRollout's per-completion rewards, for the log
            metrics = {**metrics, "reward/mean": jnp.mean(jnp.asarray(batch["rewards"]))}
        return loss_sum, weight, metrics

    def evaluate(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Prompt perplexity sums over real next-token transitions of a ``Prompts`` batch.

        ``prompt`` is ``[B, P]`` left-padded and ``prompt_length`` ``[B]`` its real lengths.
        Returns ``loss`` (summed negative log-likelihood) and ``weight`` (transitions).
        """
        del key
        prompt = jnp.asarray(batch["prompt"]).astype(jnp.int32)
        lengths = jnp.asarray(batch["prompt_length"]).astype(jnp.int32)
        width = prompt.shape[1]
        start = (width - lengths)[:, None]
        column = jnp.arange(width)[None, :]
        real = column >= start
        segments = real.astype(jnp.int32)
        positions = jnp.where(real, positions_from_segments(segments), 0)
        logits = self.model.apply(
            variables, prompt, segment_ids=segments, positions=positions
        ).astype(jnp.float32)
        targets = prompt[:, 1:]
        scored = target_log_probs(logits[:, :-1], targets)
        valid = real[:, 1:] & real[:, :-1]
        return {
            "loss": -jnp.sum(jnp.where(valid, scored, 0.0)),
            "weight": jnp.sum(valid).astype(jnp.float32),
        }

    @staticmethod
    def summarize_evaluation(totals: dict[str, float]) -> dict[str, float]:
        """Prompt NLL per transition and its perplexity from summed ``evaluate`` outputs."""
        return summarize_nll(totals, accuracy=False)


__all__ = [
    "AGGREGATIONS",
    "GRPOObjective",
    "POLICY_LOSSES",
    "packed_log_probs",
    "policy_loss_from_log_probs",
]
