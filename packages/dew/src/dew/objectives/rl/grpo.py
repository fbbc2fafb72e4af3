"""GRPO over packed session rows, composed from ``dew.rl``.

The batch is what ``dew.sessions.pack`` writes: ``[B, W]`` rows of chains with
``input_ids``, ``text_segment_ids``, ``text_positions``, ``response_mask``, ``advantages``,
``behavior_log_probs``, ``session_index`` and, when a proximal policy was recorded or
rescored, ``old_log_probs``. ``W = seq_len + 1``: the objective predicts ``seq_len`` next
tokens per row.

The loss itself (its two modes, decoupled and bypass, the rollout corrections and the
aggregations) is composed in ``dew.objectives.rl.policy_loss``.

``loss`` returns ``(loss_sum, weight, metrics)``: for ``aggregation="token-mean"`` the sum of
per-token losses over kept tokens and their count (verl ``token-mean``); for
``"session-mean"`` the sum over sessions of each session's token mean and the number of
sessions with a kept token (verl ``seq-mean-token-mean`` when a session is one chain; with
several chains a session still counts once, Agent Lightning's per-rollout mean), also
spelled ``"seq-mean-token-mean"``; for ``"seq-mean-token-sum"`` the sum of every kept
token's loss (each session's token sum, summed) and the number of sessions with a kept
token (verl ``seq-mean-token-sum``), divided by ``loss_scale_factor`` for
``"seq-mean-token-sum-norm"``. With ``Trainer(microbatches=k)`` or several devices
the sums add up across the parts; a session whose chains land in two parts then counts
once in each.

Metrics (scalars, no gradient): ``policy/loss``, ``policy/clip_fraction`` and
``policy/clip_fraction_lower`` (verl ``pg_clipfrac``/``pg_clipfrac_lower``), ``policy/ppo_kl``,
``policy/advantage``, ``policy/entropy`` (the aggregated token entropy, when
``entropy_coeff != 0``), ``kl/reference`` (token mean of the ``kl_estimator``, k3 by default,
when ``beta > 0``), ``tokens``;
with behavior likelihoods ``mismatch/kl``, ``mismatch/k3_kl``, ``mismatch/ess``; each active
mask's share of trainable tokens removed (``mask/behavior_band``, ``mask/sequence``,
``mask/geometric``) and ``mask/kept_share``; ``reward/mean`` when the batch has ``rewards``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.checks import is_int
from dew.objectives.base import initial_variables, validate_pretrained
from dew.objectives.rl.policy_loss import (
    PolicyLossOptions,
    policy_loss_from_log_probs,
    scored_policy_loss,
)
from dew.objectives.scoring import (
    packed_log_probs,
    packed_log_probs_and_entropy,
    positions_from_segments,
    summarize_nll,
    target_log_probs,
)

_UNSET = object()


def _option(name: str) -> Any:
    """A read-only attribute of the objective that reads ``loss_options.<name>``."""
    return property(lambda self: getattr(self.loss_options, name), doc=f"``{name}`` of the loss.")


class GRPOObjective:
    """Group-relative policy optimisation on packed session rows.

    Args:
      model: a ``dew.models`` decoder (``apply(variables, ids, segment_ids=, positions=)``).
      seq_len: predicted positions per row; batches are ``[B, seq_len + 1]``.
      beta: coefficient of the KL to the frozen reference; ``> 0`` keeps the starting
        policy in ``TrainState.ema`` (``ema_decay`` is then fixed at 1.0), 0 keeps none.
      pretrained: full variables mapping (``{"params": ...}``) the policy starts from.
      epsilon_low, epsilon_high: PPO clip range ``[1 - low, 1 + high]``.
      dual_clip: verl's ``clip_ratio_c`` (> 1) capping negative-advantage tokens; None
        disables it. GSPO never dual-clips.
      policy_loss: ``"ppo"`` (dual-clipped token surrogate, verl ``compute_policy_loss_vanilla``),
        ``"gspo"`` (sequence ratio pooled per chain, ``compute_policy_loss_gspo``),
        ``"cispo"`` (``-sg(clip(r)) * A * log pi``, ``compute_policy_loss_cispo``), or a
        name registered with ``dew.rl.register_policy_loss``.
      aggregation: ``"token-mean"``, ``"session-mean"`` (alias ``"seq-mean-token-mean"``),
        ``"seq-mean-token-sum"``, ``"seq-mean-token-sum-norm"`` (the previous one divided by
        ``loss_scale_factor``) or a name registered with ``dew.rl.register_aggregation``.
      loss_scale_factor: verl's constant normaliser of ``"seq-mean-token-sum-norm"`` (a
        positive number such as the response budget); required by that mode, refused by
        the others.
      behavior_importance: None; a cap ``c`` (token TIS weight ``min(pi_old / mu, c)``); or
        ``(low, high)`` (IcePop: weight zero outside the band; in bypass mode the band masks).
      sequence_mask: ``(low, high)``: drop a chain whose summed k1 ``log(mu / pi_old)``
        leaves ``[log low, log high]`` (verl ``seq_sum_k1``).
      geometric_mask: the same with the chain's mean k1 (verl ``seq_mean_k1``).
      kl_estimator: the per-token KL estimate the ``beta`` term averages, by verl's name
        (``dew.rl.kl_penalty``): ``"low_var_kl"``/``"k3"`` (default, clamped k3),
        ``"kl"``/``"k1"``, ``"abs"`` or ``"mse"``/``"k2"``; anything else is refused.
      entropy_coeff: verl's ``entropy_coeff``: the loss loses this times the token entropy of
        the policy's (temperature-scaled) next-token distributions, aggregated like the loss
        over the same tokens, from the same forward as the log-probs. 0 (default) computes
        no entropy and leaves the loss as it was.
      sampling_temperature: score ids at this temperature (and over ``support_ids`` when the
        batch has them), matching what the sampler drew from.
      ema_decay: refused unless it equals the fixed value above.
    """

    #: The metrics the console line shows (``dew.progress.Progress``).
    key_metrics = ("loss", "reward/mean")

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
        kl_estimator: str = "low_var_kl",
        entropy_coeff: float = 0.0,
        loss_scale_factor: float | None = None,
    ) -> None:
        if not is_int(seq_len) or seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {seq_len!r}")
        # The loss keywords of the constructor's documented signature; PolicyLossOptions, their
        # one definition, checks them once.
        options = PolicyLossOptions(
            policy_loss=policy_loss,
            aggregation=aggregation,
            beta=beta,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            dual_clip=dual_clip,
            behavior_importance=behavior_importance,
            sequence_mask=sequence_mask,
            geometric_mask=geometric_mask,
            kl_estimator=kl_estimator,
            entropy_coeff=entropy_coeff,
            loss_scale_factor=loss_scale_factor,
        )
        if sampling_temperature is not None and not float(sampling_temperature) > 0.0:
            raise ValueError(
                f"sampling_temperature: expected None or a value > 0, got {sampling_temperature!r}"
            )
        validate_pretrained(pretrained)
        fixed = 1.0 if options.beta > 0 else None
        if ema_decay is not _UNSET and ema_decay != fixed:
            raise ValueError(
                f"ema_decay: GRPO fixes it at {fixed!r} (a frozen reference when beta > 0, none "
                f"otherwise); got {ema_decay!r}"
            )
        self.model = model
        self.seq_len = seq_len
        self.pretrained = pretrained
        self.loss_options = options
        self.sampling_temperature = (
            None if sampling_temperature is None else float(sampling_temperature)
        )

    token_fields = ("input_ids",)  # the batch column counted as tokens (see objectives.base)
    policy_loss = _option("policy_loss")
    aggregation = _option("aggregation")
    beta = _option("beta")
    epsilon_low = _option("epsilon_low")
    epsilon_high = _option("epsilon_high")
    dual_clip = _option("dual_clip")
    behavior_importance = _option("behavior_importance")
    sequence_mask = _option("sequence_mask")
    geometric_mask = _option("geometric_mask")
    kl_estimator = _option("kl_estimator")
    entropy_coeff = _option("entropy_coeff")
    loss_scale_factor = _option("loss_scale_factor")

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
        return initial_variables(self.model, self.pretrained, key, self.width)

    def packed_log_probs(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> jax.Array:
        """``[B, W]`` log-probs of every id given its own chain (see :func:`packed_log_probs`)."""
        self._check_width(batch)
        return packed_log_probs(self.model, variables, batch, self.sampling_temperature)

    def packed_log_probs_and_entropy(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        """``[B, W]`` log-probs and next-token entropies from one forward
        (see :func:`packed_log_probs_and_entropy`)."""
        self._check_width(batch)
        return packed_log_probs_and_entropy(self.model, variables, batch, self.sampling_temperature)

    def _check_width(self, batch: Mapping[str, jax.Array]) -> None:
        shape = tuple(jnp.shape(batch["input_ids"]))
        if len(shape) != 2 or shape[1] != self.width:
            raise ValueError(
                f"batch['input_ids']: expected [B, seq_len + 1] = [B, {self.width}], got {shape}"
            )

    def options(self) -> dict[str, Any]:
        """The loss options, as :func:`policy_loss_from_log_probs` takes them."""
        return dataclasses.asdict(self.loss_options)

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, jax.Array],
        key: jax.Array,
        reference: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(loss_sum, weight, metrics)`` for one packed (micro)batch."""
        del key
        loss_sum, weight, metrics = scored_policy_loss(
            self.packed_log_probs,
            variables,
            batch,
            self.loss_options,
            reference,
            score_entropy=self.packed_log_probs_and_entropy,
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
    "GRPOObjective",
    "packed_log_probs",
    "policy_loss_from_log_probs",
]
