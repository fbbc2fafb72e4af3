"""The stage factory: a stage kind and its options -> the objective and (RL) the rollout.

Both front ends go through ``build_stage``: ``dew train`` (``dew.recipes.train``, options
from the ``objective`` section) and ``dew chain`` / ``Recipe`` (``dew.recipes.chain``,
options from a ``Stage``). Each passes a mapping of the kind's option keys:

=========  =========================================================================
lm, sft    ``all_tokens`` (sft: count every token, not only the assistant's), ``ema_decay``;
           lm also ``name`` (``next_token``, ``masked_diffusion`` or ``block_diffusion``),
           ``noise_schedule``, ``mask_id``, ``real_tokens``, ``block_size``,
           ``mask_rate_min``, ``mask_rate_max`` (``dew.recipes.diffusion_config``)
dpo        ``beta`` (default 0.1), ``nll_weight`` (default 0)
grpo       ``beta`` (default 0), ``groups``, ``max_new_tokens``, ``temperature``, ``top_k``,
           ``eos_id``, ``estimator`` (the advantage estimator: ``group``, ``mean`` or
           ``rloo``) and the loss keys of ``GRPOLoss`` (``policy_loss``, ``aggregation``,
           ``epsilon_low``, ``epsilon_high``, ``dual_clip``, ``behavior_importance``,
           ``sequence_mask``, ``geometric_mask``, ``kl_estimator``, ``entropy_coeff``,
           ``loss_scale_factor``) and the reward-shaping keys
           (``dew.recipes.shaping_config``: KL in the reward, DAPO's overlong penalty)
ppo        ``dew.recipes.ppo_stage.PPO_KEYS``: GRPO's rollout keys (``groups`` defaults to
           1), ``gamma``, ``lam``, ``value_coefficient``, ``value_clip``, the clip keys,
           ``critic_from_policy`` and the shaping keys (see ``dew.recipes.ppo_stage``)
=========  =========================================================================

The rollout corrections are tuple-valued: ``behavior_importance`` is a TIS cap (one number)
or an IcePop band ``(low, high)``, ``sequence_mask`` and ``geometric_mask`` are ``(low,
high)`` bands. A config spells a band as a list of two numbers (JSON and YAML have no
tuples); ``dew.recipes.schema.check_value`` turns it into a tuple, and ``build_stage`` checks
the values as ``GRPOObjective`` would, naming the key of a malformed one.

``GRPOLoss`` is the one schema of ``GRPOObjective``'s loss options: ``dew train grpo``'s
``objective`` section and a chain ``Stage`` both inherit its fields, so a loss option added
there is settable as ``--set objective.<name>=...`` and as a chain stage key at once.
An unknown option key is refused naming it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

from dew.recipes.diffusion_config import DIFFUSION_KEYS
from dew.recipes.ppo_stage import PPO_KEYS, build_ppo
from dew.recipes.schema import ConfigError, check_value, unknown_key
from dew.recipes.shaping_config import SHAPING_KEYS, check_kl_reference, shaping_parts

KINDS = ("lm", "sft", "dpo", "grpo", "ppo")
DEFAULT_DPO_BETA = 0.1
DEFAULT_GRPO_BETA = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOLoss:
    """``GRPOObjective``'s loss options (see its docstring; the defaults are its own).

    Attributes:
      policy_loss: a name registered with ``dew.rl.register_policy_loss``: built in,
        ``"ppo"`` (dual-clipped token surrogate), ``"gspo"`` or ``"cispo"``.
      aggregation: ``"seq-mean-token-sum-norm"`` or a name registered with
        ``dew.rl.register_aggregation``: built in, ``"token-mean"``, ``"session-mean"``,
        ``"seq-mean-token-mean"`` (the same) or ``"seq-mean-token-sum"``.
      epsilon_low, epsilon_high: the PPO clip range ``[1 - low, 1 + high]``.
      dual_clip: verl's ``clip_ratio_c`` (> 1); None disables it.
      behavior_importance: the behavior-policy correction: a TIS cap ``c`` (token weights
        ``min(ratio, c)``) or an IcePop band ``(low, high)`` (tokens outside it masked);
        None: no correction.
      sequence_mask, geometric_mask: ``(low, high)`` bands on a session's summed or
        geometric-mean ratio; sessions outside are masked. None: no mask.
      kl_estimator: the KL estimate of the ``beta`` term by verl's name: ``"low_var_kl"``
        (or ``"k3"``, the default), ``"kl"``/``"k1"``, ``"abs"``, ``"mse"``/``"k2"``.
      entropy_coeff: verl's entropy bonus: the loss loses this times the aggregated token
        entropy of the policy (0: none).
      loss_scale_factor: the constant divisor ``"seq-mean-token-sum-norm"`` requires (and
        the other aggregations refuse), verl's ``loss_scale_factor``.
    """

    policy_loss: str = "ppo"
    aggregation: str = "token-mean"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = 3.0
    behavior_importance: float | tuple[float, float] | None = None
    sequence_mask: tuple[float, float] | None = None
    geometric_mask: tuple[float, float] | None = None
    kl_estimator: str = "low_var_kl"
    entropy_coeff: float = 0.0
    loss_scale_factor: float | None = None

    def loss_options(self) -> dict[str, Any]:
        """The loss keys and their values, as ``GRPOObjective`` takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(GRPOLoss)}

    def changed_loss_options(self) -> list[str]:
        """The loss keys set away from their defaults."""
        return [f.name for f in dataclasses.fields(GRPOLoss) if getattr(self, f.name) != f.default]

    def check_loss(self, label: Callable[[str], str]) -> None:
        """Check the loss keys as ``GRPOObjective`` would; ``label(key)`` names a bad one."""
        from dew.objectives.rl.policy_options import PolicyLossOptions

        try:
            PolicyLossOptions(**self.loss_options())
        except (TypeError, ValueError) as err:
            key, _, rest = str(err).partition(": ")
            raise ConfigError(f"{label(key)}: {rest}") from None


LOSS_KEYS = tuple(f.name for f in dataclasses.fields(GRPOLoss))
#: The loss keys that take a tuple (a list in a config).
TUPLE_KEYS = ("behavior_importance", "sequence_mask", "geometric_mask")
ROLLOUT_KEYS = ("groups", "max_new_tokens", "temperature", "top_k", "eos_id", "estimator")
OPTION_KEYS = {
    "lm": ("ema_decay", *DIFFUSION_KEYS),
    "sft": ("all_tokens", "ema_decay"),
    "dpo": ("beta", "nll_weight"),
    "grpo": ("beta", *ROLLOUT_KEYS, *LOSS_KEYS, *SHAPING_KEYS),
    "ppo": PPO_KEYS,
}


def build_stage(
    kind: str,
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
    """The objective of a ``kind`` stage over rows of ``width`` ids (it predicts
    ``width - 1``), and its rollout (None unless GRPO or PPO, which need ``reward``).

    ``adapter`` wraps the objective before its rollout is built (``LoraObjective``, or
    ``LoraPPOObjective`` for PPO, from ``dew.recipes.lora_config.adapter_wrapper``).

    ``options`` holds the kind's keys (``OPTION_KEYS``); a key left out takes the default, an
    unknown one is refused naming ``where``.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    for key in options:
        if key not in OPTION_KEYS[kind]:
            raise unknown_key(where, str(key), OPTION_KEYS[kind])
    o = dict(options)
    wrap = (lambda objective: objective) if adapter is None else adapter
    if kind == "ppo":
        return build_ppo(model, width, o, pretrained=pretrained, reward=reward, decode=decode,
                         where=where, adapter=adapter)  # fmt: skip
    if kind in ("lm", "sft"):
        return wrap(_token_objective(kind, model, width, o, pretrained, where)), None
    beta = o.get("beta")
    objective: Any
    if kind == "dpo":
        from dew.objectives.rl.dpo import DPOObjective

        objective = DPOObjective(
            model,
            width - 1,
            beta=DEFAULT_DPO_BETA if beta is None else beta,
            pretrained=pretrained,
            nll_weight=o.get("nll_weight") or 0.0,
        )
        return wrap(objective), None
    from dew.objectives.rl.grpo import GRPOObjective
    from dew.rollouts.sampled import SampledRollout
    from dew.sampling import Sampling
    from dew.sessions.advantages import check_estimator

    if reward is None:
        raise ConfigError(f"{where}.reward: a GRPO stage needs a reward")
    estimator = o.get("estimator", "group")
    try:
        check_estimator(estimator)
    except ValueError as err:
        raise ConfigError(f"{where}.{err}") from None
    hints = typing.get_type_hints(GRPOLoss)
    for key in TUPLE_KEYS:  # a list from JSON or YAML becomes a tuple; a bad value names key
        if key in o:
            o[key] = check_value(o[key], hints[key], f"{where}.{key}")
    loss = GRPOLoss(**{k: o[k] for k in LOSS_KEYS if k in o})
    loss.check_loss(lambda key: f"{where}.{key}")
    temperature = o.get("temperature")
    max_new_tokens = o.get("max_new_tokens", 16)
    shaping = shaping_parts(o, lambda key: f"{where}.{key}", max_new_tokens)
    check_kl_reference(shaping, pretrained, where)
    objective = GRPOObjective(
        model,
        width - 1,
        beta=DEFAULT_GRPO_BETA if beta is None else beta,
        pretrained=pretrained,
        sampling_temperature=temperature,
        **loss.loss_options(),
    )
    objective = wrap(objective)  # before the rollout, which samples from its model
    rollout = SampledRollout(
        objective,
        reward,
        groups=o.get("groups", 4),
        max_new_tokens=max_new_tokens,
        sampling=Sampling(
            temperature=1.0 if temperature is None else float(temperature),
            top_k=o.get("top_k"),
            eos_id=o.get("eos_id"),
        ),
        decode=decode,
        estimator=estimator,
        **shaping,
    )
    return objective, rollout


def _token_objective(
    kind: str, model: Any, width: int, o: Mapping[str, Any], pretrained: Any, where: str
) -> Any:
    """The objective of an ``lm`` or ``sft`` stage: ``LMObjective``, or (``lm`` with
    ``name: masked_diffusion`` / ``block_diffusion``) ``MaskedDiffusionObjective`` /
    ``BlockDiffusionObjective``."""
    name = o.get("name", "next_token")
    if name != "next_token":
        from dew.recipes.diffusion_config import DIFFUSION_NAMES, build_masked_diffusion

        if name not in DIFFUSION_NAMES:
            raise ConfigError(f"{where}.name: expected next_token, masked_diffusion or "
                              f"block_diffusion, got {name!r}")  # fmt: skip
        return build_masked_diffusion(model, width, o, pretrained=pretrained, where=where)
    from dew.data.chat import Role
    from dew.objectives.lm import LMObjective

    loss_role = None if kind == "lm" or o.get("all_tokens") else Role.ASSISTANT
    return LMObjective(model, width - 1, pretrained=pretrained, loss_role=loss_role,
                       ema_decay=o.get("ema_decay"))  # fmt: skip


__all__ = ["DEFAULT_DPO_BETA", "DEFAULT_GRPO_BETA", "GRPOLoss", "KINDS", "LOSS_KEYS",
           "OPTION_KEYS", "build_stage"]  # fmt: skip
