"""Progress shown while dew works: tqdm bars on a terminal, plain log lines elsewhere.

Two kinds live here. ``TerminalBar(label, unit)`` is the bar that the episode collection
(``dew.objectives``) and the rollout scheduler (``dew.rollout``) draw::

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

``Progress(total, start, enabled=None)`` is what a training run shows (the Trainer draws
it): with ``enabled`` None the bar is drawn only when stderr is a terminal. When it is not
(nohup, SLURM, CI), ``log(...)`` writes one plain line every time the Trainer logs (every
``log_every`` steps); ``enabled=False`` is quiet::

    dew: step 40/100  loss 2.314  tokens/s 1.2e+04  lr 3.00e-04  ETA 0:01:05

The line shows the metrics named in ``keys`` (default: ``loss``; an objective's
``key_metrics``, e.g. GRPO's ``reward/mean``) that the record holds, then every validation
metric (``val/...``) it holds::

    dew: step 40/100  loss 0.012  reward/mean 0.375  val/reward 0.5  val/reward_stderr 0.25
    val/prompts 4  tokens/s 310  ETA 0:00:40

``update(step, loss)`` is given the loss of a step already fetched to the host: the Trainer
passes the previous step's loss (the one-step metrics lag), so drawing the bar never waits
for the device.

This module imports nothing else of ``dew``, so every part of it may use it.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Sequence
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
        keys: Sequence[str] = ("loss",),
    ) -> None:
        self.keys = tuple(keys)
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
        """A plain line with the step, the ``keys`` metrics, the validation metrics, tokens/s,
        learning rate and ETA (no bar only)."""
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
        shown = [k for k in self.keys if k in record]
        shown += [k for k in record if k.startswith("val/") and k not in shown]
        parts += [f"{name} {float(record[name]):.4g}" for name in shown]
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


__all__ = ["Progress", "TerminalBar"]
