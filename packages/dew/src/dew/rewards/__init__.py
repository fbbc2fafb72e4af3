"""Reward functions with the rollout signature ``reward(data_source, completion, ground_truth,
extra_info) -> float``."""

from dew.rewards.math_reward import MathReward

__all__ = ["MathReward"]
