"""Stop a run cleanly on SIGINT or SIGTERM (Ctrl-C, a cluster's preemption notice).

``StopRequest`` installs handlers for the two signals while ``fit`` runs (only in the main
thread, where Python delivers signals). A first signal only sets ``signal_name``; the Trainer
finishes the step in flight, saves a checkpoint at that step boundary and raises
``TrainingInterrupted``. The handlers are restored at once, so a second signal acts as it
would without Dew (a second Ctrl-C interrupts immediately).

On a multi-process run a signal may reach one process only (a preemption notice to one
host, a Ctrl-C in one terminal), but saving is a collective, so the processes must stop at
the same step. ``StopRequest.agreed(step)`` is called by every process at every step
boundary: a process holding a signal posts it to ``jax.distributed``'s key-value store under
that step, all processes meet at a barrier of the coordination service (a host-side round
trip; it does not wait for the devices), then each reads what was posted for the step. So
every process sees the same answer for the same step and they all save and stop there.
"""

from __future__ import annotations

import itertools
import signal
import threading
from types import FrameType
from typing import Any

import jax

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# a step boundary waits this long for the other processes (a step, with its rollout, may be
# slow); a peer that died is reported earlier by jax.distributed's heartbeats
BARRIER_TIMEOUT_MS = 24 * 3600 * 1000
_FITS = itertools.count()


class TrainingInterrupted(KeyboardInterrupt):
    """``fit`` stopped at a step boundary after SIGINT or SIGTERM, its checkpoint saved.

    Attributes: ``step`` (the last step trained and saved), ``signal_name`` (``"SIGTERM"``),
    ``saved`` (the checkpoint's run directory, or None when ``fit`` had none) and ``process``
    (the process that received the signal; 0 on a single-process run).
    """

    def __init__(self, step: int, signal_name: str, saved: str | None, process: int = 0) -> None:
        where = f"checkpoint saved in {saved}; run again to resume" if saved else "nothing saved"
        origin = f" on process {process}" if jax.process_count() > 1 else ""
        super().__init__(f"{signal_name}{origin}: stopped after step {step} ({where})")
        self.step = step
        self.signal_name = signal_name
        self.saved = saved
        self.process = process


def _client() -> Any:
    from jax._src import distributed  # the coordination service client, as orbax reaches it

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            "several JAX processes but no jax.distributed client: call "
            "jax.distributed.initialize() before training"
        )
    return client


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the training loop reads between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._fit = next(_FITS)  # every process counts its fits alike, naming the barriers

    def __enter__(self) -> StopRequest:
        from dew import interrupts

        if interrupts.installed() and interrupts.pending() is not None:
            # the command line recorded a signal before this fit began (dew.interrupts)
            self.signal_name = interrupts.pending()
            return self
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name
        self.restore()
        from dew import interrupts

        interrupts.note(self.signal_name)  # under the command line, a second one interrupts

    def agreed(self, step: int) -> tuple[str, int] | None:
        """``(signal name, process)`` when any process holds a signal at ``step``, else None.

        A collective on a multi-process run: every process calls it at every step boundary,
        and all of them return the same value. When several processes hold a signal, the
        lowest process index names it.
        """
        if jax.process_count() == 1:
            return None if self.signal_name is None else (self.signal_name, 0)
        client = _client()
        prefix = f"dew/stop/{self._fit}/{step}/"
        name = self.signal_name  # read once: a signal arriving now waits for the next step
        if name is not None:
            client.key_value_set(prefix + str(jax.process_index()), name)
        client.wait_at_barrier(f"dew-stop-{self._fit}-{step}", BARRIER_TIMEOUT_MS)
        posted = client.key_value_dir_get(prefix)
        if not posted:
            return None
        process, name = min((int(key.rsplit("/", 1)[1]), value) for key, value in posted)
        return name, process

    def restore(self) -> None:
        """Put the handlers that were there before back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __exit__(self, *exc: object) -> None:
        self.restore()


__all__ = ["StopRequest", "TrainingInterrupted"]
