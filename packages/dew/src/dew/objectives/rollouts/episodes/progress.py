"""A one-line progress bar over an episode collection, drawn only on a terminal.

Shows ``episodes done/total``, the model turns taken so far and the seconds spent inside the
environments (reset, step, release), e.g.
``episodes [##########..........] 32/64 turns 80 tool 1.9s``.
"""

from __future__ import annotations

import sys
from typing import TextIO


class EpisodeProgress:
    """Draw collection progress on ``stream`` (default stderr).

    ``enabled=None`` draws only when the stream is a TTY; ``True``/``False`` force it.
    """

    def __init__(
        self, total: int, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else bool(enabled)
        self.total = int(total)
        self.drawn = False

    def update(self, done: int, turns: int, tool_seconds: float) -> None:
        if not self.enabled:
            return
        width = 20
        frac = 0.0 if self.total <= 0 else min(1.0, done / self.total)
        filled = int(round(width * frac))
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(
            f"\repisodes [{bar}] {done}/{self.total} turns {turns} tool {tool_seconds:.1f}s"
        )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.enabled and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


__all__ = ["EpisodeProgress"]
