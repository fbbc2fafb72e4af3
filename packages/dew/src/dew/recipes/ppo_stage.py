"""The PPO stage: its options, their checks, and the objective and rollout they build.

``dew train ppo`` (its ``objective`` section, ``PPOObjectiveConfig``) and a ``dew chain``
stage of ``kind: ppo`` both reach ``build_ppo`` through ``dew.recipes.stages.build_stage``.
A PPO stage trains on ``Prompts`` as GRPO does: each prompt gets ``groups`` sampled
completions (default 1: the critic, not the group, is the baseline) scored by the reward;
``dew.rollouts.ppo.PPORollout`` adds the critic's values and GAE targets to the packed batch
(``SampledRollout`` samples with the policy half of the variables).

The critic is ``ValueHead(model)``: a copy of the policy's decoder with a scalar head. With
``critic_from_policy`` (the default) and a starting policy (``pretrained``: a pretrained
model, or the previous stage of a chain), the critic's decoder starts from the policy's
weights and its head from a small random kernel; otherwise the critic starts fresh. The
variables tree holds both halves (``{"params": {"policy": ..., "critic": ...}}``), so a
checkpoint holds the critic and its optimizer state, and a resumed run continues exactly.

Options (defaults are ``PPOObjective``'s and ``PPORollout``'s):

====================  ==================================================================
``beta``              KL coefficient to the starting policy (0)
``kl_estimator``      the KL estimate by verl's name (``low_var_kl``, k3; or ``kl``/``k1``,
                      ``abs``, ``mse``/``k2``)
``entropy_coeff``     the policy's entropy bonus, verl's ``entropy_coeff`` (0: none)
``groups``            completions per prompt (1)
``max_new_tokens``    response budget R (16)
``temperature``       sampling temperature; the loss scores at the same one (1)
``top_k``, ``eos_id`` the sampler's top-k and end id (None: all ids, no end id)
``gamma``, ``lam``    GAE discount and lambda, each in [0, 1] (1, 0.95)
``value_coefficient`` weight of the critic's loss (0.5)
``value_clip``        critic predictions clipped to ``old_values +- value_clip`` (0.2)
``epsilon_low``,      the clip range, dual clip and behaviour correction of the policy
``epsilon_high``,     loss, as GRPO's (0.2, 0.2, 3.0, None)
``dual_clip``,
``behavior_importance``
``critic_from_policy`` start the critic's decoder from the starting policy (True)
shaping keys          KL in the reward (charged per action before GAE) and DAPO's
                      overlong penalty (``dew.recipes.shaping_config``)
====================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any

from dew.recipes.schema import ConfigError, check_value, positive
from dew.recipes.shaping_config import (
    DYNAMIC_KEYS,
    RewardShapingOptions,
    check_kl_reference,
    refuse_shaping,
    shaping_parts,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOOptions(RewardShapingOptions):
    """A PPO stage's options (see the module docstring); ``check(label)`` checks them."""

    beta: float = 0.0
    groups: int = 1
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    eos_id: int | None = None
    gamma: float = 1.0
    lam: float = 0.95
    value_coefficient: float = 0.5
    value_clip: float = 0.2
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = 3.0
    behavior_importance: float | tuple[float, float] | None = None
    kl_estimator: str = "low_var_kl"
    entropy_coeff: float = 0.0
    critic_from_policy: bool = True

    def check(self, label: Callable[[str], str]) -> None:
        """Check every option as ``PPOObjective`` and ``PPORollout`` would; ``label(key)``
        names a bad one (``objective.gamma``, ``Stage (ppo).gamma``)."""
        from dew.objectives.rl.policy_options import PolicyLossOptions

        positive(self.beta, label("beta"), allow_zero=True)
        for key in ("groups", "max_new_tokens", "temperature", "top_k", "value_coefficient",
                    "value_clip"):  # fmt: skip
            positive(getattr(self, key), label(key))
        if not isinstance(self.eos_id, tuple):
            positive(self.eos_id, label("eos_id"), allow_zero=True)
        for key in ("gamma", "lam"):
            value = getattr(self, key)
            if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                raise ConfigError(f"{label(key)}: expected a number in [0, 1], got {value!r}")
        for key in ("value_coefficient", "value_clip"):
            if not math.isfinite(getattr(self, key)):
                raise ConfigError(f"{label(key)}: expected a finite number > 0, got "
                                  f"{getattr(self, key)!r}")  # fmt: skip
        loss = {k: getattr(self, k) for k in LOSS_KEYS}
        try:
            PolicyLossOptions(**loss)
        except (TypeError, ValueError) as err:
            key, _, rest = str(err).partition(": ")
            raise ConfigError(f"{label(key)}: {rest}") from None
        self.shaping(label)

    def shaping(self, label: Callable[[str], str]) -> dict[str, Any]:
        """The shaping parts of the keys (``shaping_parts``), checked; dynamic sampling is
        refused (the critic, not the group, is PPO's baseline)."""
        refuse_shaping(self.shaping_options(), label, "PPO's baseline is its critic, not the "
                       "group; dynamic sampling applies to GRPO", DYNAMIC_KEYS)  # fmt: skip
        given = {**self.shaping_options(), "behavior_importance": self.behavior_importance}
        return shaping_parts(given, label, self.max_new_tokens)


LOSS_KEYS = ("epsilon_low", "epsilon_high", "dual_clip", "behavior_importance", "kl_estimator",
             "entropy_coeff")  # fmt: skip
PPO_KEYS = tuple(f.name for f in dataclasses.fields(PPOOptions))


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOObjectiveConfig(PPOOptions):
    """``dew train ppo``'s ``objective`` section: ``reward`` (``math`` or ``module:object``,
    a class made with ``reward_args``, as GRPO's) and the ``PPOOptions`` keys."""

    reward: str = "math"
    reward_args: Any = None

    def __post_init__(self) -> None:
        self.check(lambda key: f"objective.{key}")


def _critic_start(critic: Any, pretrained: Mapping[str, Any], width: int) -> dict[str, Any]:
    """Critic variables whose decoder is ``pretrained``'s and whose head is freshly drawn."""
    import jax
    import jax.numpy as jnp

    from dew.objectives.rl.value_head import HEAD_INIT_STD

    ids = jnp.zeros((1, width), jnp.int32)
    shapes = jax.eval_shape(
        lambda: critic.init(
            jax.random.key(0),
            ids,
            segment_ids=ids + 1,
            positions=jnp.arange(width, dtype=jnp.int32)[None, :],
        )  # fmt: skip
    )
    head = shapes["params"]["value"]
    kernel = HEAD_INIT_STD * jax.random.normal(jax.random.key(0), head["kernel"].shape)
    value = {"kernel": kernel.astype(jnp.float32), "bias": jnp.zeros(head["bias"].shape)}
    return {"params": {"backbone": pretrained["params"], "value": value}}


def checked_options(options: Mapping[str, Any], label: Callable[[str], str]) -> PPOOptions:
    """``options`` (``PPO_KEYS``, from a config or a chain stage) typed and checked as
    ``PPOOptions``; ``label(key)`` names a bad one."""
    hints = typing.get_type_hints(PPOOptions)
    # a chain may give a tuple of end ids, which Sampling checks
    typed = {k: v if k == "eos_id" else check_value(v, hints[k], label(k))
             for k, v in options.items()}  # fmt: skip
    opts = PPOOptions(**typed)
    opts.check(label)
    return opts


def build_ppo(
    model: Any,
    width: int,
    options: Mapping[str, Any],
    *,
    pretrained: Any = None,
    reward: Callable[..., float] | None = None,
    decode: Callable[[Any], str] | None = None,
    where: str = "objective",
    adapter: Callable[[Any], Any] | None = None,
) -> tuple[Any, Any]:
    """``PPOObjective`` over rows of ``width`` ids and its ``PPORollout`` (see the module
    docstring); ``options`` holds ``PPO_KEYS`` (missing ones take the defaults).

    ``adapter`` (``dew.recipes.lora_config.adapter_wrapper``'s) wraps the objective in a
    ``LoraPPOObjective`` before the rollout is built: the policy trains an adapter on the
    frozen ``pretrained`` (or fresh) base, the critic trains in full, and the sampler runs
    the adapter's ``LoraDecoder``."""
    from dew.objectives.rl import GRPOObjective, PPOObjective, PPORollout, ValueHead
    from dew.rollouts.sampled import SampledRollout
    from dew.sampling import Sampling

    if reward is None:
        raise ConfigError(f"{where}.reward: a PPO stage needs a reward")
    opts = checked_options(options, lambda key: f"{where}.{key}")
    critic = ValueHead(model)
    critic_start = None
    if opts.critic_from_policy and pretrained is not None:
        critic_start = _critic_start(critic, pretrained, width)
    temperature = None if options.get("temperature") is None else float(opts.temperature)
    loss = {k: getattr(opts, k) for k in LOSS_KEYS}
    objective = PPOObjective(model, width - 1, critic, value_coefficient=opts.value_coefficient,
                             value_clip=opts.value_clip, beta=opts.beta, pretrained=pretrained,
                             critic_pretrained=critic_start, sampling_temperature=temperature,
                             **loss)  # fmt: skip
    if adapter is not None:
        objective = adapter(objective)
    # the sampler sees the policy half only (LoRA: its adapter and base); it scores at the
    # objective's temperature
    sampler = GRPOObjective(objective.model, width - 1, sampling_temperature=temperature)
    sampling = Sampling(temperature=float(opts.temperature), top_k=opts.top_k, eos_id=opts.eos_id)
    shaping = opts.shaping(lambda key: f"{where}.{key}")
    check_kl_reference(shaping, pretrained, where)
    episodes = SampledRollout(sampler, reward, groups=opts.groups,
                              max_new_tokens=opts.max_new_tokens, sampling=sampling,
                              decode=decode, baseline=False, overlong=shaping["overlong"],
                              correction=shaping["correction"])  # fmt: skip
    return objective, PPORollout(objective, episodes, gamma=opts.gamma, lam=opts.lam,
                                 kl_in_reward=shaping["kl_in_reward"])  # fmt: skip


__all__ = ["LOSS_KEYS", "PPO_KEYS", "PPOObjectiveConfig", "PPOOptions", "build_ppo",
           "checked_options"]  # fmt: skip
