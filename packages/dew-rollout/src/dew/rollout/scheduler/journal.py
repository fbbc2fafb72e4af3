"""``WeightJournal``: what a resumed run needs to redraw the batches a crash left in flight.

The trainer's checkpoint holds the weights after the last update, but the batches it had
already submitted were drawn from the weights served before it. The journal keeps, in one
directory, the version each batch index was submitted under (``submitted.json``) and the
weights of the last few pushed versions (``weights-<version>.npz``, host float arrays in
``jax.tree`` leaf order). Every file is written atomically before the update that follows
it, so any checkpoint the trainer saved finds the versions it needs. Single-process only.

The directory follows the conventions of ``dew.journal_files``: the journal holds the
writer lock ``weights.lock`` from construction to ``close`` (or the end of its process),
so a second ``WeightJournal`` on the same directory, from another scheduler or another
run, raises ``JournalBusy``; ``submitted.json`` is a JSON sidecar written and read there.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from dew.files import atomic_write
from dew.journal_files import WriterLock, lock, read_json, write_json

#: The writer lock's file name in the journal directory.
LOCK = "weights.lock"


class WeightJournal:
    """Versions of submitted batches and the last ``keep`` pushed weights, in ``directory``.

    Takes the directory's writer lock (created when missing); ``close`` releases it, after
    which writing raises. Raises ``dew.journal_files.JournalBusy`` when another journal
    holds the directory.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int) -> None:
        self.directory = os.fspath(directory)
        self.keep = max(2, int(keep))
        self._lock: WriterLock = lock(self.directory, LOCK, "the weight journal")
        self._path = os.path.join(self.directory, "submitted.json")
        try:
            recorded = read_json(self._path, {})
            self._submitted = {int(k): int(v) for k, v in recorded.items()}
        except BaseException:
            self._lock.release()
            raise

    def close(self) -> None:
        """Release the writer lock (the files stay for the next run); again does nothing."""
        self._lock.release()

    def __enter__(self) -> WeightJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _writable(self) -> None:
        if not self._lock.held:
            raise RuntimeError(f"{self.directory}: the weight journal is closed")

    def _weights_path(self, version: int) -> str:
        return os.path.join(self.directory, f"weights-{version}.npz")

    def pushed(self, variables: Any, version: int) -> None:
        """Keep the weights of ``version`` (and drop versions older than the last ``keep``)."""
        self._writable()
        leaves = [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(variables)]
        with atomic_write(self._weights_path(version)) as f:
            np.savez(f, *leaves)
        kept = sorted(self._versions())
        for old in kept[: max(0, len(kept) - self.keep)]:
            os.remove(self._weights_path(old))

    def _versions(self) -> list[int]:
        out = []
        for name in os.listdir(self.directory):
            if name.startswith("weights-") and name.endswith(".npz"):
                out.append(int(name[len("weights-") : -len(".npz")]))
        return out

    def submitted(self, index: int, version: int) -> None:
        """Record that batch ``index`` was submitted under ``version``."""
        self._writable()
        self._submitted[int(index)] = int(version)
        recent = dict(sorted(self._submitted.items())[-64:])
        self._submitted = recent
        write_json(self._path, {str(k): v for k, v in recent.items()})

    def version_of(self, index: int) -> int | None:
        """The version batch ``index`` was submitted under, when recorded."""
        return self._submitted.get(int(index))

    def weights(self, version: int, like: Any) -> Any | None:
        """The kept weights of ``version`` shaped like ``like``, or None when not kept."""
        path = self._weights_path(version)
        if not os.path.isfile(path):
            return None
        with np.load(path) as z:
            leaves = [z[f"arr_{i}"] for i in range(len(z.files))]
        return jax.tree.unflatten(jax.tree.structure(like), leaves)


__all__ = ["WeightJournal"]
