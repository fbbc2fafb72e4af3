"""FlowPacker: admitted flow sessions into the batch ``FlowGRPOObjective`` trains on.

The packer ``RolloutScheduler(packer=...)`` uses for ``FlowSource`` sessions (the protocol is
``dew.rollout.scheduler.packer``'s). The scheduler hands over complete groups, each of its
``G`` admitted samples in a row, in group order. ``pack`` writes one row per sample, the same
columns ``FlowRollout`` writes:

- each group's rewards are normalised as ``FlowRollout`` does (``group_advantages``:
  ``(r - mean) / (std + 1e-4)``, population std, float64 on the host), the advantage repeated
  over the ``S`` kept transitions (float32);
- ``transition_mask`` ``[N, S]``: stochastic transitions of samples whose advantage is not
  exactly 0 (a group of equal rewards stays, masked);
- ``states``, ``next_states``, ``times``, ``next_times``, ``scales``,
  ``behavior_log_probs`` and the encoders' fields stacked from the payloads; ``rewards``
  ``[N]`` float64;
- rows past the admitted samples (groups abandoned or cut) repeat the first sample with
  ``transition_mask``, ``advantages`` and ``rewards`` zeroed, so the batch shape is fixed.

``rescore`` is ``FlowGRPOObjective.log_densities`` under the trainer's current weights, the
``old_log_probs`` a TIS cap or IcePop band compares with ``behavior_log_probs``. One process
only: a multi-process trainer is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from dew.flow.rollout import group_advantages
from dew.sessions.records import Session

STACKED = ("states", "next_states", "times", "next_times", "scales", "behavior_log_probs")


class FlowPacker:
    """Pack ``FlowSource`` sessions into ``rows`` Flow-GRPO rows (module docstring).

    Args:
      objective: the ``FlowGRPOObjective`` being trained.
      rows: the samples of one batch: source rows times the scheduler's ``groups``.
    """

    mask = "transition_mask"
    unit = "rows (one per sample)"

    def __init__(self, objective: Any, rows: int) -> None:
        if not callable(getattr(objective, "log_densities", None)):
            raise TypeError("objective: expected a FlowGRPOObjective (no log_densities)")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows: expected an integer >= 1, got {rows!r}")
        if jax.process_count() > 1:
            raise ValueError("packer: FlowPacker supports a single-process trainer only")
        self.objective = objective
        self.rows = rows
        self._rescore = jax.jit(objective.log_densities)

    def rows_needed(self, sessions: Sequence[Session]) -> int:
        """One row per sample."""
        return len(sessions)

    def pack(
        self, sessions: Sequence[Session], latencies: Sequence[float], updates: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """The batch of ``sessions`` (module docstring) and its reward metrics."""
        del latencies, updates
        if not sessions:
            raise ValueError(
                "sessions: no group of the batch completed, so there is no flow sample to "
                "train on (every group was abandoned or cut)"
            )
        size = _group_size(sessions)
        rewards = np.asarray([s.reward for s in sessions], np.float64)
        advantages = group_advantages(rewards, size)
        payloads = [_payload(s) for s in sessions]
        out: dict[str, Any] = {
            name: np.stack([p[name] for p in payloads])
            for name in (*STACKED, *self.objective.encoders)
        }
        transitions = out["states"].shape[1]
        stochastic = np.stack([np.asarray(p["stochastic"], bool) for p in payloads])
        out["transition_mask"] = (stochastic & (advantages != 0.0)[:, None]).astype(np.float32)
        out["advantages"] = np.repeat(advantages.astype(np.float32)[:, None], transitions, 1)
        out["rewards"] = rewards
        out = _pad(out, self.rows)
        metrics = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()),
            "flow/samples": float(len(sessions)),
            "flow/trained_transitions": float(out["transition_mask"].sum()),
        }
        return out, metrics

    def rescore(self, variables: Any, batch: dict[str, Any]) -> np.ndarray:
        """``[rows, S]`` per-coordinate log densities under ``variables``."""
        fields = {k: v for k, v in batch.items() if k != "rewards"}
        return np.asarray(jax.device_get(self._rescore(variables, fields)), np.float32)


def _group_size(sessions: Sequence[Session]) -> int:
    """The common size of the contiguous groups of ``sessions`` (``Session.group``)."""
    sizes: list[int] = []
    for position, session in enumerate(sessions):
        if position and session.group == sessions[position - 1].group:
            sizes[-1] += 1
        else:
            sizes.append(1)
    if len(set(sizes)) != 1 or sizes[0] < 2:
        raise ValueError(
            f"sessions: expected contiguous groups of one size >= 2 (a group of one has no "
            f"baseline), got group sizes {sizes}"
        )
    return sizes[0]


def _payload(session: Session) -> dict[str, Any]:
    if not isinstance(session.payload, dict) or "states" not in session.payload:
        raise TypeError(
            f"sessions: task {session.task!r} sample {session.sample} has no flow payload "
            "(a FlowSource session carries its transitions in Session.payload)"
        )
    if session.reward is None:
        raise ValueError(f"sessions: task {session.task!r} sample {session.sample} has no reward")
    return session.payload


def _pad(batch: dict[str, Any], rows: int) -> dict[str, Any]:
    """``batch`` grown to ``rows`` rows with masked copies of its first row."""
    n = batch["states"].shape[0]
    if n > rows:
        raise ValueError(f"rows: {n} samples do not fit rows={rows}")
    if n == rows:
        return batch
    out = {}
    for name, value in batch.items():
        extra = np.repeat(value[:1], rows - n, axis=0)
        if name in ("transition_mask", "advantages", "rewards"):
            extra = np.zeros_like(extra)
        out[name] = np.concatenate([value, extra])
    return out


__all__ = ["FlowPacker"]
