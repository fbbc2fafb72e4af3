"""Drawing the transitions Flow-GRPO trains on, and checking a reward's scores.

Shared by ``FlowRollout`` (a whole batch in the trainer's step) and ``FlowSource`` (one
sample at a time on a worker thread, for ``RolloutScheduler``):

- ``trained_transitions(process, steps, train_steps)``: the indices ``[S]`` of the
  transitions that enter the loss, the first ``train_steps`` stochastic ones (all for
  ``None``), with the errors for a grid that has none or too few;
- ``draw(objective, steps, selected, variables, fields, keys)``: one SDE trajectory per key,
  reduced to what the batch keeps; ``compiled_draw(objective, steps, selected)`` is it jitted
  with the first three bound, one compiled function per objective and grid (shared by every
  rollout and source of that objective);
- ``check_flow_parts(objective, reward)``: the construction checks both share (the objective
  has a Flow-GRPO objective's members, the reward is callable);
- ``score(reward, images, fields)``: the reward called once, what it raises turned into
  ``RewardError``, its output checked by ``check_scores(value, n)`` (``[n]`` finite float64).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class RewardError(RuntimeError):
    """The reward raised, or returned something other than ``N`` finite numbers."""


def trained_transitions(process: Any, steps: int, train_steps: int | None) -> np.ndarray:
    """``[S]`` indices of the stochastic transitions of a ``steps``-point grid kept for the loss.

    Raises ``ValueError`` naming the field: ``steps`` below 2, ``train_steps`` below 1 or more
    than the grid's stochastic transitions, or a process with none on this grid.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps: expected an integer >= 2 (both endpoints), got {steps!r}")
    if train_steps is not None and (
        isinstance(train_steps, bool) or not isinstance(train_steps, int) or train_steps < 1
    ):
        raise ValueError(f"train_steps: expected None or an integer >= 1, got {train_steps!r}")
    live = np.flatnonzero(np.asarray(process.noise_scales(process.grid(steps))) > 0)
    if live.size == 0:
        raise ValueError(
            f"steps={steps}: the process has no stochastic transition (noise_level "
            f"{process.noise_level}, sde_window {process.sde_window})"
        )
    if train_steps is not None and train_steps > live.size:
        raise ValueError(
            f"train_steps: expected at most the {live.size} stochastic transitions of "
            f"steps={steps}, got {train_steps}"
        )
    return live if train_steps is None else live[:train_steps]


def draw(
    objective: Any,
    steps: int,
    selected: np.ndarray,
    variables: Any,
    fields: Any,
    keys: jax.Array,
) -> dict[str, jax.Array]:
    """One trajectory per key (``[N]`` keys), kept at the ``selected`` transitions.

    Returns ``images`` ``[N, H, W, C]`` in ``[-1, 1]``, ``states`` / ``next_states``
    ``[N, S, ...]``, ``times`` / ``next_times`` / ``scales`` ``[N, S]``,
    ``behavior_log_probs`` ``[N, S]`` (per-coordinate log densities) and ``stochastic``
    ``[N, S]``. ``fields`` are the encoders' condition inputs, one row per key.
    """
    path = objective.trajectory(variables, fields, keys, steps, objective.guidance)
    pick = jnp.asarray(selected)
    n = path.states.shape[0]
    size = math.prod(objective.state_shape)
    return {
        "images": objective.to_pixels(path.samples),
        "states": path.states[:, pick],
        "next_states": path.states[:, pick + 1],
        "times": jnp.broadcast_to(path.times[pick], (n, pick.size)),
        "next_times": jnp.broadcast_to(path.times[pick + 1], (n, pick.size)),
        "scales": jnp.broadcast_to(path.scales[pick], (n, pick.size)),
        "behavior_log_probs": path.log_densities[:, pick] / size,
        "stochastic": jnp.broadcast_to(path.stochastic[pick], (n, pick.size)),
    }


def compiled_draw(objective: Any, steps: int, selected: np.ndarray) -> Callable[..., Any]:
    """``draw`` jitted with ``objective``, ``steps`` and ``selected`` bound, built once."""
    return _compiled(objective, steps, tuple(int(i) for i in selected))


@functools.lru_cache(maxsize=32)
def _compiled(objective: Any, steps: int, selected: tuple[int, ...]) -> Callable[..., Any]:
    return jax.jit(functools.partial(draw, objective, steps, np.asarray(selected)))


def check_scores(value: Any, n: int) -> np.ndarray:
    """``value`` as ``[n]`` finite float64 scores, or ``RewardError`` saying what came."""
    try:
        scores = np.asarray(value, np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise RewardError(f"reward: expected {n} numbers, got {value!r}") from err
    if scores.shape != (n,):
        raise RewardError(
            f"reward: expected one score per sample, shape [{n}], got {list(np.shape(value))}"
        )
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        raise RewardError(
            f"reward: expected finite scores, sample {int(bad[0])} got {scores[bad[0]]}"
        )
    return scores


def check_flow_parts(objective: Any, reward: Any) -> None:
    """TypeError unless ``objective`` has a Flow-GRPO objective's members and ``reward`` is callable."""
    for name in ("trajectory", "log_densities", "inputs", "to_pixels"):
        if not hasattr(objective, name):
            raise TypeError(f"objective: expected a FlowGRPOObjective, it has no {name!r}")
    if not callable(reward):
        raise TypeError(f"reward: expected a callable, got {type(reward).__name__}")


def score(
    reward: Callable[..., Any], images: np.ndarray, fields: dict[str, np.ndarray]
) -> np.ndarray:
    """``reward(images, fields)`` as ``[N]`` finite float64 scores (``N = images.shape[0]``).

    Whatever the reward raises comes back as ``RewardError`` naming the exception, so a
    broken reward reaches the trainer as one kind of error wherever it was called.
    """
    try:
        value = reward(images, fields)
    except Exception as err:
        raise RewardError(f"reward: raised {type(err).__name__}: {err}") from err
    return check_scores(value, images.shape[0])


__all__ = [
    "RewardError",
    "check_flow_parts",
    "check_scores",
    "compiled_draw",
    "draw",
    "score",
    "trained_transitions",
]
