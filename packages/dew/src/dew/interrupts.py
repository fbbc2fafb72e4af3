"""Ctrl-C and SIGTERM for the ``dew`` command line, from its first instruction on.

Python's default SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is:
inside a half-finished ``import jax`` (the module is then left partly initialised), inside
a library that catches it (the signal is lost and the run goes on), or while XLA compiles
(native code that cannot unwind from it). ``recording()`` replaces that handler while
``dew.cli.main`` runs with one that only records the signal:

* during a ``Trainer.fit``, its ``StopRequest`` takes over: the step in flight finishes, a
  checkpoint is saved and ``TrainingInterrupted`` ends the command;
* a signal recorded earlier (imports, reading data, building the model, compiling) is
  taken by the next ``fit``, which stops after its first step;
* a signal still recorded when the command returns ends it with status 130 (143 for
  SIGTERM) instead of 0;
* a second signal interrupts at once (``KeyboardInterrupt``), as it would without Dew.

Imports nothing heavy (no jax): it must be ready before anything slow starts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_installed = False
_pending: str | None = None


def _handle(signum: int, frame: FrameType | None) -> None:
    global _pending
    if _pending is not None:  # the second signal: stop now
        raise KeyboardInterrupt(_pending)
    _pending = signal.Signals(signum).name


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record SIGINT/SIGTERM instead of raising while the block runs (main thread only);
    on leaving, the earlier handlers are back and nothing stays recorded, so a command run
    in-process (tests, notebooks) leaves the interpreter as it found it."""
    global _installed, _pending
    if threading.current_thread() is not threading.main_thread() or _installed:
        yield
        return
    previous = {sig: signal.signal(sig, _handle) for sig in SIGNALS}
    _installed, _pending = True, None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _installed, _pending = False, None


def installed() -> bool:
    return _installed


def note(name: str) -> None:
    """Record a signal another handler received (so that a second one interrupts)."""
    global _pending
    if _installed and _pending is None:
        _pending = name


def pending() -> str | None:
    """The name of the signal recorded and not yet taken (``"SIGINT"``), or None."""
    return _pending


def exit_status(name: str) -> int:
    """130 for SIGINT, 143 for SIGTERM (128 + the signal number, as shells report)."""
    return 128 + int(signal.Signals[name])


__all__ = ["exit_status", "installed", "note", "pending", "recording"]
