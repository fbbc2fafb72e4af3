"""The static options of GRPO's policy loss, checked once when they are built.

``policy_loss`` and ``aggregation`` name entries of ``dew.rl``'s registries
(``dew.rl.registered("policy_loss")``, ``dew.rl.registered("aggregation")``): the built-in
ones or any registered with ``dew.rl.register_policy_loss`` / ``register_aggregation``
before the options are built.

One aggregation is the objective's own rather than a registry entry:
``"seq-mean-token-sum-norm"`` (verl's mode of that name) is ``"seq-mean-token-sum"`` with
the loss divided by a fixed ``loss_scale_factor`` (verl's ``loss_scale_factor``; Dr.GRPO's
constant normaliser, for example the response budget), which it requires and which no
other aggregation takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dew.rl as rl


def _band(value: Any, field: str) -> tuple[float, float] | None:
    """``None`` or a ``(low, high)`` pair with ``0 < low <= high < inf``."""
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
    """``None``, a positive finite TIS cap or an IcePop ``(low, high)`` band."""
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


NORM = "seq-mean-token-sum-norm"


def _scale_factor(aggregation: str, value: Any) -> float | None:
    """``loss_scale_factor``: a positive finite number with ``NORM``, None otherwise."""
    if aggregation != NORM:
        if value is not None:
            raise ValueError(
                f"loss_scale_factor: only aggregation {NORM!r} takes it; expected None with "
                f"{aggregation!r}, got {value!r}"
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"loss_scale_factor: aggregation {NORM!r} needs a positive number (verl's "
            f"loss_scale_factor, e.g. the response budget), got {value!r}"
        )
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"loss_scale_factor: expected a positive finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PolicyLossOptions:
    """The static options of the GRPO policy loss, checked once when built.

    The fields mean what they mean on ``GRPOObjective``; ``kl_estimator`` is one of
    ``dew.rl.KL_ESTIMATORS`` (verl's names; ``"low_var_kl"``, k3, is the default) and
    ``entropy_coeff`` any finite number (verl's entropy bonus; 0, the default, is none). Numbers are stored as floats and the
    band options as ``(low, high)`` tuples of floats.
    """

    policy_loss: str = "ppo"
    aggregation: str = "token-mean"
    beta: float = 0.0
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = 3.0
    behavior_importance: float | tuple[float, float] | None = None
    sequence_mask: tuple[float, float] | None = None
    geometric_mask: tuple[float, float] | None = None
    kl_estimator: str = "low_var_kl"
    entropy_coeff: float = 0.0
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        beta = float(self.beta)
        if not (beta >= 0.0 and math.isfinite(beta)):
            raise ValueError(f"beta: expected a finite value >= 0, got {self.beta!r}")
        for name in ("epsilon_low", "epsilon_high"):
            eps = getattr(self, name)
            if not (float(eps) >= 0.0 and math.isfinite(float(eps))):
                raise ValueError(f"{name}: expected a finite value >= 0, got {eps!r}")
        if self.dual_clip is not None and not float(self.dual_clip) > 1.0:
            raise ValueError(
                f"dual_clip: expected None or a value above 1.0, got {self.dual_clip!r}"
            )
        coeff = self.entropy_coeff
        if (
            isinstance(coeff, bool)
            or not isinstance(coeff, int | float)
            or not math.isfinite(coeff)
        ):
            raise ValueError(f"entropy_coeff: expected a finite number, got {coeff!r}")
        rl.get_policy_loss(self.policy_loss)  # a ValueError naming the field when unknown
        rl.get_aggregation(self.registry_aggregation)
        factor = _scale_factor(self.aggregation, self.loss_scale_factor)
        if not isinstance(self.kl_estimator, str) or self.kl_estimator not in rl.KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator: expected one of {', '.join(rl.KL_ESTIMATORS)} (verl's names), "
                f"got {self.kl_estimator!r}"
            )
        normal = {
            "beta": beta,
            "entropy_coeff": float(coeff),
            "loss_scale_factor": factor,
            "epsilon_low": float(self.epsilon_low),
            "epsilon_high": float(self.epsilon_high),
            "dual_clip": None if self.dual_clip is None else float(self.dual_clip),
            "behavior_importance": _behavior_importance(self.behavior_importance),
            "sequence_mask": _band(self.sequence_mask, "sequence_mask"),
            "geometric_mask": _band(self.geometric_mask, "geometric_mask"),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    @property
    def registry_aggregation(self) -> str:
        """The ``dew.rl`` aggregation computing the totals (``"seq-mean-token-sum-norm"``
        is ``"seq-mean-token-sum"``, divided by ``loss_scale_factor`` afterwards)."""
        return "seq-mean-token-sum" if self.aggregation == NORM else self.aggregation

    @property
    def corrected(self) -> bool:
        """Whether any rollout correction is set (it then needs behavior likelihoods)."""
        return (
            self.behavior_importance is not None
            or self.sequence_mask is not None
            or self.geometric_mask is not None
        )


__all__ = ["PolicyLossOptions"]
