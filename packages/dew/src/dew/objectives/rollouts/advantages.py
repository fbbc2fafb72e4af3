"""Group-relative advantages of session rewards, ragged groups allowed (host side, numpy)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from dew.objectives.rollouts.records import check_choice

ESTIMATORS = ("group", "mean", "rloo")
GROUP_EPSILON = 1e-6


def group_advantages(
    rewards: Sequence[float], keys: Sequence[Hashable], estimator: str
) -> np.ndarray:
    """Advantages of ``[S]`` rewards grouped by ``keys`` (ragged groups allowed), float64.

    Ported from verl 0.9.1 ``compute_grpo_outcome_advantage`` and
    ``compute_rloo_outcome_advantage``: a group of one keeps its reward (baseline 0, deviation
    1); ``"group"`` divides by the unbiased deviation plus 1e-6, so a group of equal rewards gets
    zero advantages.
    """
    check_choice(estimator, ESTIMATORS, "estimator")
    values = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(values)
    members: dict[Hashable, list[int]] = {}
    for position, key in enumerate(keys):
        members.setdefault(key, []).append(position)
    for idx in members.values():
        group = values[idx]
        n = group.size
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = float(group.mean()), float(group.std(ddof=1))
        if estimator == "group":
            out[idx] = (group - mean) / (std + GROUP_EPSILON)
        elif estimator == "mean":
            out[idx] = group - mean
        else:
            out[idx] = group if n == 1 else (group - mean) * n / (n - 1)
    return out


__all__ = ["ESTIMATORS", "GROUP_EPSILON", "group_advantages"]
