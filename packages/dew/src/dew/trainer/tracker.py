"""Metric trackers: JSON lines in the run directory, and an optional TensorBoard writer.

``JsonlTracker`` appends one JSON object per record to ``run_dir/metrics.jsonl`` and flushes
it, so a killed run keeps every record written before the kill. A resumed run appends to the
same file. ``TensorBoardTracker`` writes event files through ``tensorboardX`` when that package
is installed; it is not a dependency of Dew (``pip install tensorboardX`` to use it) and asking
for it without the package raises ``ImportError`` naming it.
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
    """Writes scalar records with ``tensorboardX.SummaryWriter`` under ``logdir``."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        try:
            from tensorboardX import SummaryWriter  # type: ignore[import-not-found]
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ImportError(
                "tensorboard=True needs the optional package 'tensorboardX' "
                "(pip install tensorboardX); it is not installed"
            ) from err
        self._writer = SummaryWriter(os.fspath(logdir))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for name, value in record.items():
            if name != "step" and isinstance(value, int | float):
                self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
