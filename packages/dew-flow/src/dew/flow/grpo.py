"""FlowGRPOObjective: the clipped policy loss over a flow model's stochastic transitions.

The batch is what ``FlowRollout`` writes, ``N`` trajectories of ``S`` selected transitions:
``states`` / ``next_states`` ``[N, S, ...]``, ``times`` / ``next_times`` / ``scales``
``[N, S]``, ``transition_mask`` ``[N, S]`` (stochastic, selected and with a non-zero
advantage), ``advantages`` ``[N, S]`` (the row's advantage repeated), ``behavior_log_probs``
``[N, S]`` (per-coordinate log densities recorded while sampling), optionally
``old_log_probs`` (rescored), ``rewards`` ``[N]`` and the adaptive bounds ``behavior_cap`` /
``behavior_floor`` ``[N]`` (``AdaptiveCorrection`` through ``RolloutScheduler``), plus the
encoders' condition fields. ``FlowSource`` sessions packed by ``FlowPacker`` give the same
batch.

For each kept transition the current model gives the SDE mean, and the per-coordinate log
density of the recorded next state; the ratio to the old density enters dew's GRPO policy
loss (``compute_policy_loss`` with ``PolicyLossOptions`` built once: verl's clipped
surrogate and no dual clip, the transitions in the place of tokens, averaged over the kept transitions), so
``behavior_importance`` means exactly what it means for language models: a TIS cap on
``old / behavior`` (needs ``old_log_probs``) or an IcePop band. With ``beta > 0`` the
starting policy stays frozen in the Trainer's EMA slot and ``beta * transition_kl`` to it is
added per kept transition.

With ``guidance`` set, the velocity is classifier-free guided; as in Flow-GRPO's trainer the
unconditional branch carries no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from dew.flow.inputs import InputSpec
from dew.flow.objective import Autoencoder, FlowModel
from dew.flow.process import Process, coordinate_log_density, transition_kl
from dew.objectives.rl.policy_loss import compute_policy_loss
from dew.objectives.rl.policy_options import PolicyLossOptions
from dew.rl import masked_mean, token_rejection_mask

FIELDS = ("states", "next_states", "times", "next_times", "scales", "transition_mask", "advantages")
_UNSET = object()


class FlowGRPOObjective(FlowModel):
    """Flow-GRPO on rectified flow.

    Args:
      model: the flow model, as for ``DiffusionObjective``.
      process: the ``Process``.
      inputs: the ``InputSpec`` of the source batches.
      guidance: classifier-free guidance scale, or ``None`` for the plain conditional velocity.
      beta: weight of ``transition_kl`` to the frozen starting policy; ``> 0`` keeps that
        policy in ``TrainState.ema`` (``ema_decay`` 1.0), ``0`` keeps none.
      steps: time points (both ends) of :meth:`preview` and the default rollout length.
      encoders: ``{condition field: flax module}``, as for ``DiffusionObjective``.
      autoencoder: optional frozen ``encode``/``decode`` pair (latent space).
      pretrained: full variables mapping the policy starts from.
      epsilon_low: lower clip range, the ratio is clipped at ``1 - epsilon_low`` (Flow-GRPO's
        released SD3 configuration uses ``1e-4``).
      epsilon_high: upper clip range, the ratio is clipped at ``1 + epsilon_high``.
      advantage_clip: advantages are clipped to ``[-c, c]`` (Flow-GRPO's ``adv_clip_max``, 5);
        ``None`` disables it.
      behavior_importance: ``None``, a TIS cap or an IcePop ``(low, high)`` band, as in
        ``GRPOObjective``.
      ema_decay: refused unless it equals the value ``beta`` fixes.
    """

    def __init__(
        self,
        model: Any,
        process: Process,
        inputs: InputSpec,
        guidance: float | None = None,
        beta: float = 0.0,
        steps: int = 10,
        encoders: Mapping[str, Any] | None = None,
        autoencoder: Autoencoder | None = None,
        pretrained: Mapping[str, Any] | None = None,
        epsilon_low: float = 1e-4,
        epsilon_high: float = 1e-4,
        advantage_clip: float | None = 5.0,
        behavior_importance: float | tuple[float, float] | None = None,
        ema_decay: Any = _UNSET,
    ) -> None:
        super().__init__(model, process, inputs, encoders, autoencoder, pretrained)
        beta = float(beta)
        if not (beta >= 0.0 and math.isfinite(beta)):
            raise ValueError(f"beta: expected a finite value >= 0, got {beta!r}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
            raise ValueError(f"steps: expected an integer >= 2 (both endpoints), got {steps!r}")
        if guidance is not None and not math.isfinite(float(guidance)):
            raise ValueError(f"guidance: expected None or a finite scale, got {guidance!r}")
        if advantage_clip is not None and not float(advantage_clip) > 0:
            raise ValueError(
                f"advantage_clip: expected None or a value > 0, got {advantage_clip!r}"
            )
        fixed = 1.0 if beta > 0 else None
        if ema_decay is not _UNSET and ema_decay != fixed:
            raise ValueError(
                f"ema_decay: Flow-GRPO fixes it at {fixed!r} (a frozen starting policy when "
                f"beta > 0, none otherwise); got {ema_decay!r}"
            )
        self.guidance = None if guidance is None else float(guidance)
        self.beta = beta
        self.steps = steps
        self.advantage_clip = None if advantage_clip is None else float(advantage_clip)
        # checked once here; the loss reuses them on every call
        self.loss_options = PolicyLossOptions(
            policy_loss="ppo",
            aggregation="token-mean",
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            dual_clip=None,
            behavior_importance=behavior_importance,
        )
        self.epsilon_low = self.loss_options.epsilon_low
        self.epsilon_high = self.loss_options.epsilon_high
        self.behavior_importance = self.loss_options.behavior_importance

    @property
    def ema_decay(self) -> float | None:
        """1.0 (frozen starting policy) when ``beta > 0``, else None."""
        return 1.0 if self.beta > 0 else None

    def transition_means(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any]
    ) -> tuple[jax.Array, jax.Array]:
        """``(means [N, S, ...], stds [N, S])`` of the batch's transitions under ``variables``."""
        for name in FIELDS:
            if name not in batch:
                raise KeyError(f"batch[{name!r}]: missing; a Flow-GRPO batch (FlowRollout) has it")
        states = jnp.asarray(batch["states"], jnp.float32)
        n, s = states.shape[:2]
        if tuple(states.shape[2:]) != self.state_shape:
            raise ValueError(
                f"batch['states']: expected [N, S, {', '.join(map(str, self.state_shape))}], got "
                f"{list(states.shape)}"
            )
        for name in ("times", "next_times", "scales", "transition_mask", "advantages"):
            if tuple(jnp.shape(batch[name])) != (n, s):
                raise ValueError(
                    f"batch[{name!r}]: expected shape [N, S] = [{n}, {s}], got "
                    f"{list(jnp.shape(batch[name]))}"
                )
        flat = states.reshape(n * s, *self.state_shape)
        t = jnp.asarray(batch["times"], jnp.float32).reshape(-1)
        fields = {k: jnp.repeat(jnp.asarray(v), s, axis=0) for k, v in self.fields(batch).items()}
        v = self.velocity(variables, flat, t, fields, self.guidance, detach_unconditional=True)
        mean, std = self.process.sde_step(
            flat,
            v,
            t,
            jnp.asarray(batch["next_times"], jnp.float32).reshape(-1),
            jnp.asarray(batch["scales"], jnp.float32).reshape(-1),
        )
        return mean.reshape(states.shape), std.reshape(n, s)

    def log_densities(self, variables: Mapping[str, Any], batch: Mapping[str, Any]) -> jax.Array:
        """``[N, S]`` per-coordinate log densities of ``next_states`` under ``variables``."""
        mean, std = self.transition_means(variables, batch)
        n, s = std.shape
        nxt = jnp.asarray(batch["next_states"], jnp.float32).reshape(n * s, *self.state_shape)
        lp = coordinate_log_density(nxt, mean.reshape(nxt.shape), std.reshape(-1))
        return lp.reshape(n, s)

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, Any],
        key: jax.Array,
        reference: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """``(loss_sum, kept transitions, metrics)`` for one (micro)batch; jit-safe."""
        del key
        mean, std = self.transition_means(variables, batch)
        n, s = std.shape
        nxt = jnp.asarray(batch["next_states"], jnp.float32).reshape(n * s, *self.state_shape)
        log_probs = coordinate_log_density(nxt, mean.reshape(nxt.shape), std.reshape(-1)).reshape(
            n, s
        )
        mask = (jnp.asarray(batch["transition_mask"]) > 0) & (std > 0)
        advantages = jnp.asarray(batch["advantages"], jnp.float32)
        if self.advantage_clip is not None:
            advantages = jnp.clip(advantages, -self.advantage_clip, self.advantage_clip)
        fields: dict[str, Any] = {"response_mask": mask, "advantages": advantages}
        for name in ("behavior_log_probs", "old_log_probs", "behavior_cap", "behavior_floor"):
            if name in batch:
                fields[name] = jnp.asarray(batch[name], jnp.float32)
        loss_sum, weight, metrics = compute_policy_loss(log_probs, fields, self.loss_options)
        metrics = dict(metrics)
        if self.beta > 0:
            if reference is None:
                raise ValueError(
                    "reference: beta > 0 needs the frozen starting policy (TrainState.ema), got None"
                )
            keep = mask
            if "old_log_probs" not in fields and isinstance(self.behavior_importance, tuple):
                low, high = self.behavior_importance
                proximal = jax.lax.stop_gradient(log_probs)
                keep = keep & token_rejection_mask(
                    proximal, fields["behavior_log_probs"], mask, 1.0 / high, 1.0 / low
                )
            ref_mean, _ = self.transition_means(reference, batch)
            ref_mean = jax.lax.stop_gradient(ref_mean)
            kl = transition_kl(
                mean.reshape(n * s, -1), ref_mean.reshape(n * s, -1), std.reshape(-1)
            ).reshape(n, s)
            kl = jnp.where(keep, kl, 0.0)
            loss_sum = loss_sum + self.beta * jnp.sum(kl)
            metrics["kl/reference"] = jax.lax.stop_gradient(masked_mean(kl, keep))
        metrics["transitions"] = metrics.pop("tokens")
        if "rewards" in batch:
            metrics["reward/mean"] = jnp.mean(jnp.asarray(batch["rewards"], jnp.float32))
        return loss_sum, weight, metrics

    def evaluate(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, jax.Array]:
        """Validation on the live policy: the flow-matching ``loss`` (summed) and ``weight``.

        The batch needs real images in the target field (a prompt-only batch has nothing to
        compare with); one time and one noise per row come from ``key``.
        """
        self.inputs.check(batch, target=True)
        x0 = self.to_latent(batch[self.inputs.target])
        k_time, k_noise = jax.random.split(key)
        t = self.process.sample_times(k_time, x0.shape[0])
        noise = jax.random.normal(k_noise, x0.shape, jnp.float32)
        xt = self.process.interpolate(x0, noise, t)
        v = self.velocity(variables, xt, t, self.fields(batch), None)
        losses = self.process.loss(v, x0, noise)
        return {"loss": jnp.sum(losses), "weight": jnp.asarray(losses.shape[0], jnp.float32)}

    def preview(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> jax.Array:
        """``[B, H, W, C]`` images in ``[-1, 1]`` from the live policy (Euler, ``steps`` points)."""
        return self.generate(variables, batch, key, self.steps, self.guidance)


__all__ = ["FlowGRPOObjective"]
