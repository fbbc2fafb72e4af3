"""Correction bounds that follow the measured importance ratios instead of a fixed constant.

The trainer's correction for a sampler that differs from the trained policy weighs each token
by ``w = pi_old / mu`` (``exp(old_log_probs - behavior_log_probs)``): truncated importance
sampling caps ``w`` at ``c``, IcePop zeroes it outside ``[low, high]``. Fixed constants are
either too loose for a well-matched sampler or too tight for a drifting one.
``AdaptiveCorrection(quantile, decay)`` measures, on each batch's trained tokens, the
``quantile`` of ``w`` (and, for a band, the ``1 - quantile`` one), and keeps a running
estimate: the first batch's measurement, then ``decay * previous + (1 - decay) * measured``.
The bound a batch trains with is the estimate *after* its own measurement, so an outlier
batch moves it by at most ``1 - decay`` of the way. A cap never drops below 1 and a band's
low end never rises above 1, so on-policy tokens (``w = 1``) are always kept at full weight.

The rollout writes the bounds into the batch (``behavior_cap`` and, for a band,
``behavior_floor``, ``[N]`` rows of one value), where the GRPO/PPO loss reads them instead
of the constants of ``behavior_importance``; the estimate is the rollout's state
(``state_dict``), kept in each checkpoint and resumed exactly. ``last_metrics``:
``correction/cap`` (and ``correction/floor``), ``correction/measured_cap``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.checks import is_real

#: The log ratio is clamped to this magnitude before exponentiating, as the loss does.
LOG_RATIO_BOUND = 20.0


class AdaptiveCorrection:
    """A running quantile of the importance ratios, as the TIS cap or the IcePop band.

    Args:
      quantile: the share of trained tokens whose ratio the cap keeps below it, in
        ``(0.5, 1)`` (e.g. 0.99); a band keeps ``[1 - quantile, quantile]`` of them.
      band: False sets a TIS cap; True an IcePop band.
      decay: weight of the previous estimate, in ``[0, 1)`` (0: each batch its own).
    """

    def __init__(self, quantile: float, band: bool = False, decay: float = 0.9) -> None:
        if not is_real(quantile) or not 0.5 < float(quantile) < 1.0:
            raise ValueError(
                f"behavior_importance_quantile: expected a number in (0.5, 1), got {quantile!r}"
            )
        if not is_real(decay) or not 0.0 <= float(decay) < 1.0:
            raise ValueError(
                f"behavior_importance_decay: expected a number in [0, 1), got {decay!r}"
            )
        self.quantile = float(quantile)
        self.band = bool(band)
        self.decay = float(decay)
        self.cap: float | None = None
        self.floor: float | None = None

    def observe(
        self,
        batch: Mapping[str, Any],
        old_log_probs: Any,
        behavior_log_probs: Any,
        mask: str = "response_mask",
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Measure a packed batch; ``(columns to add to it, metrics)``.

        The trained entries are ``batch[mask] > 0`` (response tokens, or a flow batch's
        ``transition_mask``) and, when the batch numbers its sessions, ``session_index >=
        0``; a batch without any keeps the previous bounds (1 before the first measurement).
        """
        keep = np.asarray(batch[mask]) > 0
        if "session_index" in batch:
            keep &= np.asarray(batch["session_index"]) >= 0
        rows = keep.shape[0]
        log_ratio = np.asarray(old_log_probs, np.float64) - np.asarray(
            behavior_log_probs, np.float64
        )
        ratios = np.exp(np.clip(log_ratio[keep], -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        metrics: dict[str, float] = {}
        if ratios.size:
            high = max(1.0, float(np.quantile(ratios, self.quantile)))
            low = min(1.0, float(np.quantile(ratios, 1.0 - self.quantile)))
            metrics["correction/measured_cap"] = high
            self.cap = high if self.cap is None else self.decay * self.cap + (1 - self.decay) * high
            if self.band:
                self.floor = low if self.floor is None else (
                    self.decay * self.floor + (1 - self.decay) * low)  # fmt: skip
        cap = 1.0 if self.cap is None else self.cap
        columns = {"behavior_cap": np.full(rows, cap, np.float32)}
        metrics["correction/cap"] = cap
        if self.band:
            floor = 1.0 if self.floor is None else self.floor
            columns["behavior_floor"] = np.full(rows, floor, np.float32)
            metrics["correction/floor"] = floor
        return columns, metrics

    def state_dict(self) -> dict[str, Any]:
        """The running estimate, JSON-ready."""
        return {"cap": self.cap, "floor": self.floor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict``."""
        for name in ("cap", "floor"):
            value = state.get(name) if isinstance(state, Mapping) else None
            if value is not None and (not is_real(value) or not 0 < float(value) < math.inf):
                raise ValueError(
                    f"checkpoint extra.rollout.correction.{name}: expected None or a finite "
                    f"number > 0, got {value!r}"
                )
            setattr(self, name, None if value is None else float(value))


__all__ = ["AdaptiveCorrection"]
