"""What a run shows while it trains: a tqdm bar on a terminal, plain log lines elsewhere.

``Progress(total, start, enabled=None)``: with ``enabled`` None the bar is drawn only when
stderr is a terminal. When it is not (nohup, SLURM, CI), ``log(...)`` writes one plain line
every time the Trainer logs (every ``log_every`` steps); ``enabled=False`` is quiet::

    dew: step 40/100  loss 2.314  tokens/s 1.2e+04  lr 3.00e-04  ETA 0:01:05

``update(step, loss)`` is given the loss of a step already fetched to the host: the Trainer
passes the previous step's loss (the one-step metrics lag), so drawing the bar never waits
for the device.
"""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any, TextIO


def _eta(seconds: float) -> str:
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    return str(datetime.timedelta(seconds=int(round(seconds))))


class Progress:
    """A tqdm bar on a terminal; otherwise a plain line per ``log``."""

    def __init__(
        self,
        total: int,
        start: int = 0,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        lines: bool | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = isatty if enabled is None else bool(enabled)
        self.lines = (enabled is None and not isatty) if lines is None else bool(lines)
        self.total = total
        self.start = start
        self.t0 = time.perf_counter()
        self._first: tuple[int, float] | None = None
        self._bar: Any = None
        if self.enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=start, file=self.stream, unit="step",
                             dynamic_ncols=True, leave=True)  # fmt: skip

    def message(self, text: str) -> None:
        """One line of text that does not break the bar (nothing when quiet)."""
        if not (self.enabled or self.lines):
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def update(self, step: int, loss: float | None = None) -> None:
        """Move the bar to ``step`` (``loss``: a value already on the host)."""
        if self._bar is None:
            return
        if loss is not None:
            self._bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
        self._bar.update(step - self._bar.n)

    def log(self, record: dict[str, Any]) -> None:
        """A plain line with the step, loss, tokens/s, learning rate and ETA (no bar only)."""
        if not self.lines:
            return
        step, now = int(record["step"]), time.perf_counter()
        # The rate counts from the first logged step on: the time before it is compilation
        # (and, after a resume, the restore), which the remaining steps do not repeat.
        if self._first is None:
            self._first = (step, now)
        first_step, first_time = self._first
        done = step - first_step
        eta = (now - first_time) / done * (self.total - step) if done > 0 else float("nan")
        parts = [f"dew: step {step}/{self.total}"]
        if "loss" in record:
            parts.append(f"loss {record['loss']:.4g}")
        if "tokens_per_s" in record:
            parts.append(f"tokens/s {record['tokens_per_s']:.3g}")
        if "learning_rate" in record:
            parts.append(f"lr {record['learning_rate']:.3g}")
        parts.append(f"ETA {_eta(eta)}")
        self.message("  ".join(parts))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
