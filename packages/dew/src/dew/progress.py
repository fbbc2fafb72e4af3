"""One-line progress bars for long loops, drawn with tqdm and only on a terminal.

``TerminalBar(label, unit)`` is the bar that the episode collection (``dew.objectives``) and
the rollout scheduler (``dew.rollout``) draw::

    episodes:  50%|#####     | 32/64 episodes [00:02, turns 80, tool 1.9s]
    rollouts:  50%|#####     | 8/16 groups [00:01, 40 in flight, waited 0.31s]

``update(done, total, detail)`` moves the bar to ``done`` out of ``total`` (the total may
change between calls) and puts ``detail`` after the elapsed time. ``close()`` leaves the
last state on its own line; the next ``update`` after a ``close`` starts a new bar, so one
object can serve a loop that is drawn once per batch.

With ``enabled=None`` the bar is drawn only when ``stream`` (default stderr) is a terminal;
``True`` draws anyway and ``False`` never draws. A bar that is not drawn writes nothing at
all and never builds a ``tqdm`` object. Redraws between changes of ``done`` are limited to one
every ``interval`` seconds; a change of ``done`` or ``total`` always redraws.

This module imports nothing else of ``dew``, so every part of it may use it.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed}{postfix}]"


class TerminalBar:
    """A tqdm bar named ``label`` counting ``unit`` (plural: ``"episodes"``, ``"groups"``).

    Args:
      label: the name in front of the bar.
      unit: what is counted, printed after ``done/total``.
      stream: where to draw; stderr when None.
      enabled: None draws only on a terminal (``stream.isatty()``); True/False force it.
      interval: the fewest seconds between two redraws that only change ``detail``.
    """

    def __init__(
        self,
        label: str,
        unit: str,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval: float = 0.1,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else bool(enabled)
        self.label, self.unit, self.interval = label, unit, float(interval)
        self._bar: Any = None
        self._drawn_at = 0.0

    @property
    def open(self) -> bool:
        """Whether a bar is on screen (drawn and not yet closed)."""
        return self._bar is not None

    def update(self, done: int, total: int, detail: str = "") -> None:
        """Show ``done`` out of ``total`` followed by ``detail`` (nothing when not enabled)."""
        if not self.enabled:
            return
        if self._bar is None:
            from tqdm import tqdm

            # drawn once here, with its first state
            self._bar = tqdm(total=total, initial=done, postfix=detail or None, desc=self.label,
                             unit=self.unit, file=self.stream, bar_format=FORMAT,
                             dynamic_ncols=True, leave=True, mininterval=self.interval)  # fmt: skip
            self._drawn_at = time.monotonic()
            return
        bar = self._bar
        moved = done != bar.n or total != bar.total
        bar.total = total
        bar.n = done
        bar.set_postfix_str(detail, refresh=False)
        now = time.monotonic()
        if moved or now - self._drawn_at >= self.interval:
            bar.refresh()
            self._drawn_at = now

    def close(self) -> None:
        """Draw the last state and end the line; a later ``update`` starts a new bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["TerminalBar"]
