"""A one-line progress bar of the scheduler, drawn only on a terminal: groups admitted out of
the batch, rollouts in flight across every batch, and the trainer's wait, e.g.
``rollouts [########............] 8/16 groups, 40 in flight, waited 0.31s``."""

from __future__ import annotations

import sys
from typing import TextIO


class SchedulerProgress:
    """Draw on ``stream`` (default stderr); ``enabled=None`` draws only on a TTY."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else bool(enabled)
        self.drawn = False

    def update(self, admitted: int, groups: int, in_flight: int, waited: float) -> None:
        if not self.enabled:
            return
        width = 20
        filled = int(round(width * min(1.0, admitted / groups))) if groups else 0
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(
            f"\rrollouts [{bar}] {admitted}/{groups} groups, {in_flight} in flight, "
            f"waited {waited:.2f}s"
        )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


__all__ = ["SchedulerProgress"]
