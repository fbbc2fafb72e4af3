"""Ready-made processes: ``presets.Flow()`` is a preset, calling it builds the ``Process``."""

from __future__ import annotations

from dataclasses import dataclass

from dew.flow.process import Process


@dataclass(frozen=True)
class Flow:
    """Rectified flow with velocity prediction, logit-normal training times and Flow-GRPO's SDE.

    ``Flow()()`` returns ``Process(time_sampler="logit-normal", loc=0, scale=1, shift=1,
    noise_level=0.7)``; change any field here first, e.g. ``Flow(shift=3.0)()``.
    """

    loc: float = 0.0
    scale: float = 1.0
    shift: float = 1.0
    noise_level: float = 0.7
    sde_window: tuple[int, int] | None = None

    def __call__(self) -> Process:
        return Process(
            time_sampler="logit-normal",
            loc=self.loc,
            scale=self.scale,
            shift=self.shift,
            noise_level=self.noise_level,
            sde_window=self.sde_window,
        )


__all__ = ["Flow"]
