"""Stop a run cleanly on SIGINT or SIGTERM (Ctrl-C, a cluster's preemption notice).

``StopRequest`` installs handlers for the two signals while ``fit`` runs (only in the main
thread, where Python delivers signals). A first signal only sets ``signal_name``; the Trainer
finishes the step in flight, saves a checkpoint at that step boundary and raises
``TrainingInterrupted``. The handlers are restored at once, so a second signal acts as it
would without Dew (a second Ctrl-C interrupts immediately).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """``fit`` stopped at a step boundary after SIGINT or SIGTERM, its checkpoint saved.

    Attributes: ``step`` (the last step trained and saved), ``signal_name`` (``"SIGTERM"``),
    ``saved`` (the checkpoint's run directory, or None when ``fit`` had none).
    """

    def __init__(self, step: int, signal_name: str, saved: str | None) -> None:
        where = f"checkpoint saved in {saved}; run again to resume" if saved else "nothing saved"
        super().__init__(f"{signal_name}: stopped after step {step} ({where})")
        self.step = step
        self.signal_name = signal_name
        self.saved = saved


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the training loop reads between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self.restore()

    def restore(self) -> None:
        """Put the handlers that were there before back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, *exc: object) -> None:
        self.restore()


__all__ = ["StopRequest", "TrainingInterrupted"]
