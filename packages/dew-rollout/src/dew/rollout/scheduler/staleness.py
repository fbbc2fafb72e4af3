"""``AdaptiveAhead``: how many batches the scheduler draws ahead, chosen from what it measures.

A fixed ``ahead`` is a guess: too small and the trainer waits for its rollouts, too large
and the rollouts it trains on come from older weights than they need to. The controller
takes two measurements of each packed batch and moves ``ahead`` by at most one per call:

- ``wait_share``: the seconds the trainer waited for the batch over the wall time of one
  cycle (from the end of the previous batch's collection to the end of this one's), in
  ``[0, 1]``;
- ``gap``: the batch's off-policy gap, the mean ``|old_log_probs - behavior_log_probs|``
  over its response tokens (``off_policy_gap``).

Drawing further ahead only helps while the rollouts are what the trainer waits for: where
the engine and the trainer share the same cores, more work in flight slows the trainer too,
and the updates come no faster. So the controller also remembers the cycle it saw at each
``ahead`` (``cycle``: seconds from one collection's end to the next; a level's cycle is
the median of its last ``WINDOW`` measurements, so one long pause, a checkpoint or an
evaluation, does not move it), and the rule, applied in this order, is:

1. ``gap > max_gap``: step down by one (never below 0);
2. the level below was tried and its cycle was at most ``(1 + MARGIN)`` of this level's:
   step down (as fast, on fresher weights);
3. ``wait_share > target_wait``: step up by one (never above ``maximum``), unless the level
   above was tried and its cycle was not below ``(1 - MARGIN)`` of this level's;
4. else stay.

A new ``ahead`` shows in the cycle only two calls later (the call that chooses it has
already submitted; the next submits with it; the one after collects that batch), so a cycle
counts for its level only when the two calls before it drew with the same ``ahead``, and a
level with no such cycle yet is held (rules 2 to 4 wait for it). A call with no cycle to
measure (the first after the stream opened) passes ``wait_share=None`` and ``cycle=None``. ``maximum`` is what the
schedule allows, ``max_lag - sync_every + 1``, which the scheduler binds (``bind``). The
rule reads nothing but its arguments and its own state, so a run resumed from
``state_dict`` chooses as the uninterrupted run did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from dew.checks import is_int

#: The relative difference in cycle time that counts as a change between two levels.
MARGIN = 0.1
#: How many of a level's latest cycles its median is taken over.
WINDOW = 5


def off_policy_gap(batch: Mapping[str, Any], mask: str = "response_mask") -> float:
    """Mean ``|old_log_probs - behavior_log_probs|`` over the trained entries (``batch[mask]
    > 0``: response tokens, or a flow batch's ``transition_mask``).

    ``batch`` is a packed batch (each column ``[N, W]``, or ``[N, S]`` transitions); a batch
    with nothing trained (every group abandoned or masked) has gap ``0.0``.
    """
    keep = np.asarray(batch[mask]) > 0
    if not keep.any():
        return 0.0
    old = np.asarray(batch["old_log_probs"], np.float64)
    behavior = np.asarray(batch["behavior_log_probs"], np.float64)
    return float(np.abs(old - behavior)[keep].mean())


def staleness_metrics(
    batch: Mapping[str, Any], ahead: int, wait_share: float | None, mask: str = "response_mask"
) -> dict[str, float]:
    """What the scheduler records of one packed batch's staleness.

    ``staleness/ahead``: the ``ahead`` its call submitted with; ``staleness/gap``:
    ``off_policy_gap(batch, mask)``; ``staleness/wait_share``: ``wait_share``, left out when
    None (the first call after the stream opened has no cycle to measure).
    """
    out = {"staleness/ahead": float(ahead), "staleness/gap": off_policy_gap(batch, mask)}
    if wait_share is not None:
        out["staleness/wait_share"] = float(wait_share)
    return out


class AdaptiveAhead:
    """Choose the scheduler's ``ahead`` from the trainer's waiting and the off-policy gap.

    Args:
      target_wait: the waiting share (in ``[0, 1)``) above which ``ahead`` steps up.
      max_gap: the mean absolute log-ratio (> 0) above which ``ahead`` steps down.
      start: the ``ahead`` of the first calls (>= 0; clamped to ``maximum`` when bound).

    Pass it as ``RolloutScheduler(ahead=AdaptiveAhead(...))``; the scheduler calls
    ``bind(maximum)`` once, then ``observe(wait_share, gap)`` after each packed batch.
    """

    def __init__(self, target_wait: float = 0.05, max_gap: float = 0.1, start: int = 1) -> None:
        if not isinstance(target_wait, int | float) or not 0 <= target_wait < 1:
            raise ValueError(f"target_wait: expected a share in [0, 1), got {target_wait!r}")
        if not isinstance(max_gap, int | float) or not (max_gap > 0 and math.isfinite(max_gap)):
            raise ValueError(f"max_gap: expected a finite log-ratio > 0, got {max_gap!r}")
        if not is_int(start) or start < 0:
            raise ValueError(f"start: expected an integer >= 0, got {start!r}")
        self.target_wait, self.max_gap = float(target_wait), float(max_gap)
        self.ahead = int(start)
        self.maximum: int | None = None
        self.steps = 0  # observations so far
        self.cycles: dict[int, list[float]] = {}  # the latest cycle seconds at each ahead
        self.recent: list[int] = []  # the ahead of the last two calls

    def bind(self, maximum: int) -> int:
        """Cap ``ahead`` at ``maximum`` (the schedule's bound); returns the current ``ahead``."""
        if not is_int(maximum) or maximum < 0:
            raise ValueError(f"maximum: expected an integer >= 0, got {maximum!r}")
        self.maximum = int(maximum)
        self.ahead = min(self.ahead, self.maximum)
        return self.ahead

    def observe(self, wait_share: float | None, gap: float, cycle: float | None = None) -> int:
        """One batch's measurements (``wait_share``, ``cycle`` None: not measured); returns
        the ``ahead`` for the next submissions."""
        top = self.ahead + 1 if self.maximum is None else self.maximum
        self.steps += 1
        level = self.ahead
        self.recent = [*self.recent, level][-2:]
        if gap > self.max_gap:
            self.ahead = max(level - 1, 0)
            return self.ahead
        if self.recent != [level, level]:
            return self.ahead  # this level's cycle does not show yet
        if cycle is not None:
            self.cycles[level] = [*self.cycles.get(level, []), float(cycle)][-WINDOW:]
        cycle_at = self.cycle_at
        here = cycle_at.get(level)
        if here is None:
            return self.ahead
        above, below = cycle_at.get(level + 1), cycle_at.get(level - 1)
        if below is not None and below <= (1 + MARGIN) * here:
            self.ahead = level - 1
        elif (
            wait_share is not None
            and wait_share > self.target_wait
            and level < top
            and (above is None or above < (1 - MARGIN) * here)
        ):
            self.ahead = level + 1
        return self.ahead

    @property
    def cycle_at(self) -> dict[int, float]:
        """Each tried level's cycle: the median of its latest measurements, in seconds."""
        return {level: statistics.median(seen) for level, seen in sorted(self.cycles.items())}

    def state_dict(self) -> dict[str, Any]:
        """``{"ahead", "steps", "recent": [int], "cycles": {str(level): [seconds]}}``,
        JSON-ready."""
        cycles = {str(level): list(seen) for level, seen in sorted(self.cycles.items())}
        return {"ahead": self.ahead, "steps": self.steps, "recent": list(self.recent),
                "cycles": cycles}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state_dict``'s output (``ahead`` clamped to a bound ``maximum``)."""
        ahead = state["ahead"]
        if not is_int(ahead) or ahead < 0:
            raise ValueError(f"state['ahead']: expected an integer >= 0, got {ahead!r}")
        self.ahead = int(ahead) if self.maximum is None else min(int(ahead), self.maximum)
        self.steps = int(state.get("steps", 0))
        self.cycles = {int(k): [float(x) for x in v] for k, v in state.get("cycles", {}).items()}
        self.recent = [int(level) for level in state.get("recent", [])][-2:]

    def __repr__(self) -> str:
        return (
            f"AdaptiveAhead(target_wait={self.target_wait}, max_gap={self.max_gap}, "
            f"ahead={self.ahead}, maximum={self.maximum})"
        )


__all__ = ["AdaptiveAhead", "off_policy_gap", "staleness_metrics"]
