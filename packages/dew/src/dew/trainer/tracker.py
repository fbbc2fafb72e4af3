"""Metric trackers: JSON lines in the run directory, and an optional TensorBoard writer.

``JsonlTracker`` appends one JSON object per record to ``run_dir/metrics.jsonl`` and flushes
it, so a killed run keeps every record written before the kill. A resumed run appends to the
same file. ``TensorBoardTracker`` writes TensorBoard event files with a small built-in writer (no
TensorFlow, tensorboard or tensorboardX needed to write them).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Protocol


class Tracker(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonlTracker:
    """Appends records to ``path`` (one JSON object a line)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _plain(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardTracker:
    """Writes every numeric field of a record as a TensorBoard scalar under ``logdir``.

    Uses Dew's own event-file writer (``dew.trainer.tensorboard``), so TensorBoard itself is
    needed only to view the files.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        from dew.trainer.tensorboard import EventWriter

        self._writer = EventWriter(logdir)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        values = {
            name: float(value)
            for name, value in record.items()
            if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
        }
        self._writer.scalars(step, values)

    def close(self) -> None:
        self._writer.close()
