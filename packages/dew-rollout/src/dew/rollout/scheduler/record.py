"""``SchedulerRecord``: what one scheduler call did, for the ``log`` callback (host side)."""

from __future__ import annotations

import dataclasses
from typing import Any

CAUSES = ("infra_error", "cancelled", "truncated_unscored", "stale", "timeout")


@dataclasses.dataclass(frozen=True)
class SchedulerRecord:
    """One call of the scheduler (one training batch).

    Attributes:
      step: the training step the batch went to; index: its position in the task stream.
      updates: optimizer updates committed when it was handed over.
      version: the oldest policy version among the admitted rollouts' calls (``updates`` when
        none was admitted); lag: ``updates - version``.
      admitted_groups / groups: complete groups packed / tasks in the batch.
      resubmitted: resubmissions by cause (``infra_error``, ``cancelled``,
        ``truncated_unscored``, ``stale``, ``timeout``).
      cancelled: rollouts cancelled (timeouts, stale, oversampled or dropped samples).
      abandoned: groups given up after ``max_attempts`` failures of one sample.
      cut: complete groups that did not fit the rows beside earlier ones.
      waited: seconds the trainer waited for this batch's rollouts.
      pushed: the version pushed in this call, or None.
      metrics: ``session_metrics`` of the admitted rollouts and their packed batch (latency
        from submission to finish, version lag).
    """

    step: int
    index: int
    updates: int
    version: int
    lag: int
    admitted_groups: int
    groups: int
    resubmitted: dict[str, int]
    cancelled: int
    abandoned: int
    cut: int
    waited: float
    pushed: int | None
    metrics: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        """A flat mapping of plain numbers (``resubmitted/<cause>``, ``metrics`` keys kept)."""
        out: dict[str, Any] = {
            name: getattr(self, name)
            for name in ("step", "index", "updates", "version", "lag", "admitted_groups",
                         "groups", "cancelled", "abandoned", "cut", "waited")
        }  # fmt: skip
        out["pushed"] = -1 if self.pushed is None else self.pushed
        for cause in CAUSES:
            out[f"resubmitted/{cause}"] = self.resubmitted.get(cause, 0)
        out.update(self.metrics)
        return out


__all__ = ["CAUSES", "SchedulerRecord"]
