"""The reward-shaping keys of a GRPO or PPO stage (``dew.rollouts.shaping``), shared by
``dew train``'s ``objective`` section and a ``dew chain`` stage.

==========================  ===============================================================
``kl_in_reward``            KL charge coefficient in the reward, verl's ``use_kl_in_reward``
                            with ``kl_ctrl.kl_coef`` (0: off, the default)
``kl_in_reward_estimator``  the charge's KL estimate by verl's name (``kl``, k1, the default;
                            ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``)
``kl_target``,              the adaptive controller's target KL and horizon (in samples);
``kl_horizon``              both or neither (neither: the coefficient stays fixed)
``overlong_buffer``         DAPO's overlong buffer in tokens, ``1..max_new_tokens`` (None: off)
``overlong_penalty``        the penalty at the budget (verl's ``penalty_factor``, 1.0)
``dynamic_sampling_groups`` DAPO's dynamic sampling: train on this many groups whose scores
                            differ, at most the step's prompts (None: off)
``dynamic_sampling_draws``  sampling rounds per step before uniform groups fill in (3)
``behavior_importance_``    the TIS cap (or IcePop band) follows this running quantile of
``quantile``                the measured importance ratios, in (0.5, 1) (None: the constants
                            of ``behavior_importance``, which must be set: it picks the kind)
``behavior_importance_``    weight of the previous estimate in the running quantile (0.9)
``decay``
==========================  ===============================================================

Where they apply: GRPO on prompts (``rollout.mode: sync``) takes all of them; PPO on prompts
takes all but dynamic sampling (its critic, not the group, is the baseline). With
``mode: async`` the scheduler measures the correction bounds (both kinds), GRPO's dynamic
sampling moves into the scheduler's admission (a uniform group is drawn again; ``rollout.admit``
must then stay unset) and PPO keeps its KL keys; the rest is refused there. PPO on tool episodes takes the KL keys only. Anywhere
else a key set away from its default is refused, naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from dew.recipes.schema import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardShapingOptions:
    """The reward-shaping keys (see the module docstring); defaults shape nothing."""

    kl_in_reward: float = 0.0
    kl_in_reward_estimator: str = "kl"
    kl_target: float | None = None
    kl_horizon: float | None = None
    overlong_buffer: int | None = None
    overlong_penalty: float = 1.0
    dynamic_sampling_groups: int | None = None
    dynamic_sampling_draws: int = 3
    behavior_importance_quantile: float | None = None
    behavior_importance_decay: float = 0.9

    def shaping_options(self) -> dict[str, Any]:
        """The shaping keys and their values."""
        return {key: getattr(self, key) for key in SHAPING_KEYS}

    def changed_shaping_options(self) -> list[str]:
        """The shaping keys set away from their defaults."""
        fields = dataclasses.fields(RewardShapingOptions)
        return [f.name for f in fields if getattr(self, f.name) != f.default]


SHAPING_KEYS = tuple(f.name for f in dataclasses.fields(RewardShapingOptions))
KL_KEYS = ("kl_in_reward", "kl_in_reward_estimator", "kl_target", "kl_horizon")
DYNAMIC_KEYS = ("dynamic_sampling_groups", "dynamic_sampling_draws")
CORRECTION_KEYS = ("behavior_importance_quantile", "behavior_importance_decay")


def changed(options: Mapping[str, Any], keys: tuple[str, ...] = SHAPING_KEYS) -> list[str]:
    """Which of ``keys`` ``options`` sets away from the default."""
    defaults = RewardShapingOptions()
    return [k for k in keys if k in options and options[k] != getattr(defaults, k)]


def refuse_shaping(
    options: Mapping[str, Any], label: Callable[[str], str], why: str, keys: tuple[str, ...]
) -> None:
    """Raise ``ConfigError`` naming the first of ``keys`` set in ``options``: ``why`` says
    where shaping does not apply."""
    for key in changed(options, keys):
        raise ConfigError(f"{label(key)}: {why}, got {options[key]!r}")


def shaping_parts(
    options: Mapping[str, Any], label: Callable[[str], str], max_new_tokens: int
) -> dict[str, Any]:
    """``{"overlong", "kl_in_reward", "dynamic_sampling", "correction"}`` (each None when off)
    from the shaping keys in ``options`` (and its ``behavior_importance``, which the adaptive
    correction needs), as ``SampledRollout`` takes them; a bad value is a ``ConfigError``
    naming its key through ``label``."""
    from dew.rollouts.correction_caps import AdaptiveCorrection
    from dew.rollouts.dynamic_sampling import DynamicSampling
    from dew.rollouts.shaping import KLInReward, Overlong

    o = {**RewardShapingOptions().shaping_options(), **{k: options[k] for k in SHAPING_KEYS
                                                       if k in options}}  # fmt: skip
    parts: dict[str, Any] = {"overlong": None, "kl_in_reward": None, "dynamic_sampling": None,
                             "correction": None}  # fmt: skip
    try:
        if o["overlong_buffer"] is not None:
            parts["overlong"] = Overlong(o["overlong_buffer"], o["overlong_penalty"])
            parts["overlong"].penalties([0], max_new_tokens)
        elif o["overlong_penalty"] != 1.0:
            raise ValueError("overlong_penalty: needs overlong_buffer (the ramp's length)")
        if o["kl_in_reward"] != 0:
            parts["kl_in_reward"] = KLInReward(o["kl_in_reward"], o["kl_in_reward_estimator"],
                                               o["kl_target"], o["kl_horizon"])  # fmt: skip
        else:
            refuse_shaping(o, lambda k: k, "needs kl_in_reward > 0", KL_KEYS[1:])
        if o["dynamic_sampling_groups"] is not None:
            parts["dynamic_sampling"] = DynamicSampling(o["dynamic_sampling_groups"],
                                                        o["dynamic_sampling_draws"])  # fmt: skip
        else:
            refuse_shaping(o, lambda k: k, "needs dynamic_sampling_groups", DYNAMIC_KEYS[1:])
        if o["behavior_importance_quantile"] is not None:
            kind = options.get("behavior_importance")
            if kind is None:
                raise ValueError("behavior_importance_quantile: needs behavior_importance (a cap "
                                 "or a [low, high] band: the correction it adapts)")  # fmt: skip
            parts["correction"] = AdaptiveCorrection(
                o["behavior_importance_quantile"], band=isinstance(kind, tuple | list),
                decay=o["behavior_importance_decay"])  # fmt: skip
        else:
            refuse_shaping(
                o, lambda k: k, "needs behavior_importance_quantile", CORRECTION_KEYS[1:]
            )
    except (TypeError, ValueError, ConfigError) as err:
        key, _, rest = str(err).partition(": ")
        raise ConfigError(f"{label(key)}: {rest}") from None
    return parts


def check_kl_reference(parts: Mapping[str, Any], pretrained: Any, where: str) -> None:
    """Refuse a KL charge (``shaping_parts``' ``kl_in_reward``) with no starting policy to
    charge it against; ``where`` names the stage's section."""
    if parts["kl_in_reward"] is not None and pretrained is None:
        raise ConfigError(f"{where}.kl_in_reward: needs a starting policy to charge the KL "
                          "against (model.pretrained, or an earlier chain stage); got none")  # fmt: skip


__all__ = ["CORRECTION_KEYS", "DYNAMIC_KEYS", "KL_KEYS", "SHAPING_KEYS", "RewardShapingOptions",
           "changed", "check_kl_reference", "refuse_shaping", "shaping_parts"]  # fmt: skip
