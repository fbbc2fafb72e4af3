"""A minimal progress bar: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Draws ``step/total`` with a rate and the last loss on one line of ``stream``.

    Quiet (draws nothing) unless ``enabled`` is true or, when ``enabled`` is ``None``, the
    stream is a TTY.
    """

    def __init__(
        self, total: int, start: int = 0, stream: TextIO | None = None, enabled: bool | None = None
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else enabled
        self.total = total
        self.start = start
        self.t0 = time.perf_counter()

    def update(self, step: int, loss: float | None = None) -> None:
        if not self.enabled:
            return
        width = 30
        frac = 0.0 if self.total <= 0 else min(1.0, step / self.total)
        filled = int(round(width * frac))
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        rate = (step - self.start) / elapsed
        text = f"\r[{'#' * filled}{'.' * (width - filled)}] {step}/{self.total} {rate:.2f} it/s"
        if loss is not None:
            text += f" loss {loss:.4g}"
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
