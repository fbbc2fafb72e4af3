"""Reward functions with the rollout signature ``reward(data_source, completion, ground_truth,
extra_info) -> float``, and held-out accuracy by greedy decoding (``dew.rewards.accuracy``:
``Evaluator``, ``Accuracy``, ``standard_error``, ``changed``, imported lazily so
``MathReward`` stays free of JAX).
"""

from dew.lazy import lazy_exports
from dew.rewards.math_reward import MathReward

__getattr__, __dir__, _lazy = lazy_exports(
    __name__,
    {
        "Accuracy": ".accuracy",
        "Evaluator": ".accuracy",
        "changed": ".accuracy",
        "standard_error": ".accuracy",
    },
)

__all__ = ["Accuracy", "Evaluator", "MathReward", "changed", "standard_error"]
