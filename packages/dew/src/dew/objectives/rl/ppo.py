"""PPO with a learned critic over packed rows: one loss for the policy and the critic.

The variables tree holds two subtrees, ``{"params": {"policy": ..., "critic": ...}}``, trained
by the one optimizer the Trainer owns. ``PPOObjective.policy_variables(variables)`` picks the
policy's own variables (``{"params": policy}``), which is what the policy model and the
reference read, ``critic_variables`` the critic's, and ``policy(variables)`` gives a sampling
policy for ``EpisodeRollout`` whose ``bind`` picks the policy subtree of the Trainer's
snapshot.

The batch is a packed batch (``[B, W]``, ``W = seq_len + 1``, every column aligned with
``input_ids``) as the rollout machinery writes it, with ``old_log_probs`` (the policy's raw
likelihoods when the ids were sampled), ``response_mask``, ``text_segment_ids``,
``text_positions``, optionally ``behavior_log_probs``, and the PPO targets:
``old_values`` (the critic's values when the ids were sampled), ``advantages`` and
``returns`` (GAE over each episode, see ``dew.rollouts.ppo``).

The loss, summed over the kept tokens ``mask = response_mask & segment > 0`` and divided by
their count by the Trainer (verl ``token-mean`` for every term)::

    pg    = clipped dual-clip surrogate of exp(log_probs - old_log_probs) and advantages
            (verl 0.9.1 compute_policy_loss_vanilla, optional token TIS weights)
    kl    = kl_penalty(log_probs, reference log_probs, kl_estimator)
                                                (verl kl_penalty, "low_var_kl" = k3 by default)
    vf    = 0.5 * max((V - R)^2, (clip(V, V_old +- value_clip) - R)^2)
                                                           (verl compute_value_loss)
    ent   = token entropy of the policy's logits            (verl entropy_from_logits)
    loss  = pg - entropy_coeff * ent + beta * kl + value_coefficient * vf

``V`` at token ``t`` is the critic's output at column ``t - 1`` (the state before the token,
as verl's critic reads it), the same alignment as the policy's log-probs. Both losses reduce
over the same token mass, so only token-mean aggregation exists; sequence and geometric masks,
which would drop policy tokens but not value tokens, are refused.

Metrics beyond GRPO's (``policy/*``, ``kl/reference``, ``mismatch/*``, ``tokens``):
``critic/loss`` (token mean of the clipped half-squared error), ``critic/clip_fraction``
(verl ``vf_clipfrac``), ``critic/error`` (token mean of ``(V - R)^2``), ``critic/value`` and
``critic/return`` (token means).

The critic's half (``packed_values``, ``value_loss_terms``) lives in ``_ppo_critic`` and the
two-subtree variables tree (``subtree``, ``join``) in ``_ppo_tree``; the two public names are
re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.checks import is_real
from dew.objectives.base import validate_pretrained
from dew.objectives.rl._ppo_critic import packed_values, value_loss_terms
from dew.objectives.rl._ppo_tree import CRITIC, POLICY, join, subtree
from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rl.policy_loss import scored_policy_loss
from dew.objectives.scoring import packed_log_probs, packed_log_probs_and_entropy

_UNSET = object()
TARGETS = ("old_values", "advantages", "returns")


class PPOObjective:
    """Proximal policy optimisation with a learned critic, one loss and one optimizer.

    Args:
      model: the policy, a ``dew.models`` decoder or any module called as
        ``apply(variables, ids, segment_ids=, positions=) -> logits [B, T, V]``.
      seq_len: predicted positions per row; batches are ``[B, seq_len + 1]``.
      critic: a module called the same way that returns one value per position ``[B, T]``,
        for example ``ValueHead(backbone)``.
      value_coefficient: weight of the critic's loss (verl ``vf_coef``), > 0.
      value_clip: predictions are clipped to ``old_values +- value_clip`` (verl
        ``cliprange_value``), > 0.
      beta: coefficient of the KL to the frozen policy reference; ``> 0`` keeps the
        starting policy subtree (``reference_variables``) in ``TrainState.ema``; the critic
        has no reference.
      pretrained: full policy variables (``{"params": ...}``) the policy starts from.
      critic_pretrained: full critic variables the critic starts from.
      epsilon_low, epsilon_high: PPO clip range ``[1 - low, 1 + high]``.
      dual_clip: verl's ``clip_ratio_c`` (> 1) for negative advantages; None disables it.
      behavior_importance: None, a TIS cap ``c`` or an IcePop ``(low, high)`` band, as on
        ``GRPOObjective``.
      sampling_temperature: score ids at the temperature they were sampled at.
      kl_estimator: the KL estimate by verl's name, as on ``GRPOObjective`` (default
        ``"low_var_kl"``, k3).
      entropy_coeff: verl's entropy bonus on the policy, as on ``GRPOObjective`` (token mean
        of the policy's entropy times this, subtracted; 0 by default: none).
      aggregation, sequence_mask, geometric_mask: accepted only at their defaults
        (``"token-mean"``, None, None); anything else is refused, because the value loss
        shares the policy loss's token mass.
      ema_decay: refused unless it equals the fixed value (1.0 when ``beta > 0``, else None).
    """

    #: The metrics the console line shows (``dew.progress.Progress``).
    key_metrics = ("loss", "reward/mean", "critic/loss")

    def __init__(
        self,
        model: Any,
        seq_len: int,
        critic: Any,
        value_coefficient: float = 0.5,
        value_clip: float = 0.2,
        beta: float = 0.0,
        pretrained: Mapping[str, Any] | None = None,
        critic_pretrained: Mapping[str, Any] | None = None,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        dual_clip: float | None = 3.0,
        behavior_importance: float | tuple[float, float] | None = None,
        sampling_temperature: float | None = None,
        aggregation: str = "token-mean",
        sequence_mask: tuple[float, float] | None = None,
        geometric_mask: tuple[float, float] | None = None,
        ema_decay: Any = _UNSET,
        kl_estimator: str = "low_var_kl",
        entropy_coeff: float = 0.0,
    ) -> None:
        if aggregation != "token-mean":
            raise ValueError(
                f"aggregation: PPO supports only 'token-mean' (the policy and value losses "
                f"share one token count), got {aggregation!r}"
            )
        for name, band in (("sequence_mask", sequence_mask), ("geometric_mask", geometric_mask)):
            if band is not None:
                raise ValueError(
                    f"{name}: PPO refuses sequence masks (they would drop policy tokens but not "
                    f"value tokens from the shared token mean); expected None, got {band!r}"
                )
        if critic is None or not hasattr(critic, "apply") or not hasattr(critic, "init"):
            raise TypeError(
                f"critic: expected a flax module returning one value per position (for example "
                f"ValueHead(backbone)), got {type(critic).__name__}"
            )
        for name, value in (("value_coefficient", value_coefficient), ("value_clip", value_clip)):
            if not is_real(value):
                raise TypeError(f"{name}: expected a positive finite float, got {value!r}")
            if not (float(value) > 0.0 and math.isfinite(float(value))):
                raise ValueError(f"{name}: expected a positive finite float, got {value!r}")
        validate_pretrained(critic_pretrained, field="critic_pretrained")
        fixed = 1.0 if float(beta) > 0 else None
        if ema_decay is not _UNSET and ema_decay != fixed:
            raise ValueError(
                f"ema_decay: PPO fixes it at {fixed!r} (a frozen policy reference when beta > 0, "
                f"none otherwise); got {ema_decay!r}"
            )
        # The policy half is GRPO's: same checks, scoring and surrogate.
        self._policy = GRPOObjective(
            model,
            seq_len,
            beta=beta,
            pretrained=pretrained,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            dual_clip=dual_clip,
            behavior_importance=behavior_importance,
            sampling_temperature=sampling_temperature,
            kl_estimator=kl_estimator,
            entropy_coeff=entropy_coeff,
        )
        self.model = model
        self.critic = critic
        self.seq_len = seq_len
        self.value_coefficient = float(value_coefficient)
        self.value_clip = float(value_clip)
        self.beta = self._policy.beta
        self.pretrained = pretrained
        self.critic_pretrained = critic_pretrained
        self.epsilon_low = self._policy.epsilon_low
        self.epsilon_high = self._policy.epsilon_high
        self.dual_clip = self._policy.dual_clip
        self.behavior_importance = self._policy.behavior_importance
        self.kl_estimator = self._policy.kl_estimator
        self.entropy_coeff = self._policy.entropy_coeff
        self.sampling_temperature = self._policy.sampling_temperature
        self.aggregation = "token-mean"

    @property
    def ema_decay(self) -> float | None:
        """1.0 (frozen reference) when ``beta > 0``, else None."""
        return self._policy.ema_decay

    @property
    def width(self) -> int:
        """Row width of the batches this objective trains on (``seq_len + 1``)."""
        return self.seq_len + 1

    @property
    def policy_objective(self) -> Any:
        """The ``GRPOObjective`` of the policy half (the same model, width, temperature and
        behaviour correction), whose methods take the policy's own variables
        (``policy_variables``): what a sampler or an asynchronous scheduler rescores with."""
        return self._policy

    def on_policy_model(self, model: Any, pretrained: Mapping[str, Any] | None) -> PPOObjective:
        """A copy whose policy (and ``policy_objective``) runs ``model`` and starts from
        ``pretrained``; the critic, the options and ``init`` stay this objective's. LoRA
        (``dew.objectives.lora_ppo``) puts its ``LoraDecoder`` here."""
        import copy

        out = copy.copy(self)
        out._policy = copy.copy(self._policy)
        out._policy.model = out.model = model
        out._policy.pretrained = out.pretrained = pretrained
        return out

    # ------------------------------------------------------------------ variables

    def init(self, key: jax.Array) -> dict[str, Any]:
        """``{"params": {"policy": ..., "critic": ...}}``; each half fresh or pretrained.

        The critic is initialised from its own key (split from ``key``), never from the
        policy's weights.
        """
        policy_key, critic_key = jax.random.split(key)
        policy = dict(self._policy.init(policy_key))
        if self.critic_pretrained is not None:
            critic = dict(self.critic_pretrained)
        else:
            ids = jnp.zeros((1, self.width), jnp.int32)
            positions = jnp.arange(self.width, dtype=jnp.int32)[None, :]
            critic = dict(
                self.critic.init(
                    critic_key, ids, segment_ids=jnp.ones_like(ids), positions=positions
                )
            )
        return join(policy, critic)

    def policy_variables(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """The policy's own variables (``{"params": policy}``) out of a PPO variables tree."""
        return subtree(variables, POLICY)

    def reference_variables(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """What the Trainer keeps as the frozen reference: the policy subtree only."""
        return self.policy_variables(variables)

    def _as_policy(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """The policy variables of a whole PPO tree, or a policy-only tree as it is."""
        params: Any = variables.get("params")
        if isinstance(params, Mapping) and POLICY in params:
            return self.policy_variables(variables)
        return dict(variables)

    def policy(self, variables: Mapping[str, Any]) -> Any:
        """A sampling policy over the policy subtree of ``variables``, for ``EpisodeRollout``.

        It has ``bind(snapshot)``, which picks the policy subtree out of the Trainer's
        snapshot (a policy-only tree is taken as it is), and ``__call__(contexts, budgets,
        key, sampling)``; its ``variables`` attribute holds the bound policy variables.
        """
        from dew.rollouts.policy import SubtreePolicy

        return SubtreePolicy(
            self.model,
            self.policy_variables(variables),
            self.policy_variables,
            lambda tree: hasattr(tree["params"], "keys") and POLICY in tree["params"],
        )

    def critic_variables(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """The critic's own variables (``{"params": critic}``) out of a PPO variables tree."""
        return subtree(variables, CRITIC)

    # ------------------------------------------------------------------ scoring

    def packed_log_probs(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> jax.Array:
        """``[B, W]`` policy log-probs of every id given its own chain (PPO variables tree)."""
        self._policy._check_width(batch)
        return packed_log_probs(
            self.model, self.policy_variables(variables), batch, self.sampling_temperature
        )

    def packed_log_probs_and_entropy(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, jax.Array]:
        """``[B, W]`` policy log-probs and next-token entropies from one forward."""
        self._policy._check_width(batch)
        return packed_log_probs_and_entropy(
            self.model, self.policy_variables(variables), batch, self.sampling_temperature
        )

    def packed_values(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> jax.Array:
        """``[B, W]`` critic values of the state before each id (PPO variables tree)."""
        self._policy._check_width(batch)
        return packed_values(self.critic, self.critic_variables(variables), batch)

    def options(self) -> dict[str, Any]:
        """The policy-loss options, as ``policy_loss_from_log_probs`` takes them."""
        return self._policy.options()

    # ------------------------------------------------------------------ loss

    def _check_batch(self, batch: Mapping[str, jax.Array]) -> None:
        self._policy._check_width(batch)
        shape = tuple(jnp.shape(batch["input_ids"]))
        needed = ("old_log_probs", "response_mask", "text_segment_ids", "text_positions")
        for name in (*needed, *TARGETS):
            if name not in batch:
                why = (
                    "PPORollout adds it"
                    if name in TARGETS
                    else "PPO compares the current policy with the recorded old one"
                    if name == "old_log_probs"
                    else "a packed batch carries it"
                )
                raise KeyError(f"batch[{name!r}]: missing; {why}")
            if tuple(jnp.shape(batch[name])) != shape:
                raise ValueError(
                    f"batch[{name!r}]: expected shape {shape} aligned with input_ids, got "
                    f"{tuple(jnp.shape(batch[name]))}"
                )

    def _reference_log_probs(
        self, reference: Mapping[str, Any], batch: Mapping[str, jax.Array]
    ) -> jax.Array:
        # the frozen reference holds the policy subtree only (reference_variables)
        return packed_log_probs(
            self.model, self._as_policy(reference), batch, self.sampling_temperature
        )

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, jax.Array],
        key: jax.Array,
        reference: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(loss_sum, weight, metrics)`` for one packed (micro)batch; see the module doc."""
        del key
        self._check_batch(batch)
        policy_sum, weight, metrics = scored_policy_loss(
            self.packed_log_probs,
            variables,
            batch,
            self._policy.loss_options,
            reference,
            score_reference=self._reference_log_probs,
            score_entropy=self.packed_log_probs_and_entropy,
        )
        mask = (jnp.asarray(batch["response_mask"]) > 0) & (
            jnp.asarray(batch["text_segment_ids"]) > 0
        )
        values = self.packed_values(variables, batch)
        terms, critic_metrics = value_loss_terms(values, batch, mask, self.value_clip)
        value_sum = jnp.sum(terms)
        loss_sum = policy_sum + jnp.asarray(self.value_coefficient, policy_sum.dtype) * value_sum
        metrics = {**metrics, **critic_metrics}
        if "rewards" in batch:
            metrics["reward/mean"] = jnp.mean(jnp.asarray(batch["rewards"]).astype(jnp.float32))
        return loss_sum, weight, metrics

    # ------------------------------------------------------------------ evaluation

    def evaluate(
        self, variables: Mapping[str, Any], batch: Mapping[str, jax.Array], key: jax.Array
    ) -> dict[str, jax.Array]:
        """The policy's prompt perplexity sums (as ``GRPOObjective.evaluate``)."""
        return self._policy.evaluate(self.policy_variables(variables), batch, key)

    @staticmethod
    def summarize_evaluation(totals: dict[str, float]) -> dict[str, float]:
        """Prompt NLL per transition and its perplexity from summed ``evaluate`` outputs."""
        return GRPOObjective.summarize_evaluation(totals)


__all__ = ["PPOObjective", "packed_values", "value_loss_terms"]
