"""Deprecated alias of ``dew.objectives.rollouts.sampled`` (``SampledRollout``), for one release."""

from dew.objectives.rollouts.sampled import RewardError, SampledRollout, default_decode

__all__ = ["RewardError", "SampledRollout", "default_decode"]
