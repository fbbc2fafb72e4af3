"""``WeightJournal``: what a resumed run needs to redraw the batches a crash left in flight.

The trainer's checkpoint holds the weights after the last update, but the batches it had
already submitted were drawn from the weights served before it. The journal keeps, in one
directory, the version each batch index was submitted under (``submitted.json``) and the
weights of the last few pushed versions (``weights-<version>.npz``, host float arrays in
``jax.tree`` leaf order). Every file is written atomically before the update that follows
it, so any checkpoint the trainer saved finds the versions it needs. Single-process only.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from dew.files import atomic_write


class WeightJournal:
    """Versions of submitted batches and the last ``keep`` pushed weights, in ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], keep: int) -> None:
        self.directory = os.fspath(directory)
        self.keep = max(2, int(keep))
        os.makedirs(self.directory, exist_ok=True)
        self._path = os.path.join(self.directory, "submitted.json")
        self._submitted: dict[int, int] = {}
        if os.path.isfile(self._path):
            with open(self._path, encoding="utf-8") as f:
                self._submitted = {int(k): int(v) for k, v in json.load(f).items()}

    def _weights_path(self, version: int) -> str:
        return os.path.join(self.directory, f"weights-{version}.npz")

    def pushed(self, variables: Any, version: int) -> None:
        """Keep the weights of ``version`` (and drop versions older than the last ``keep``)."""
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
        self._submitted[int(index)] = int(version)
        recent = dict(sorted(self._submitted.items())[-64:])
        self._submitted = recent
        with atomic_write(self._path, "w") as f:
            json.dump({str(k): v for k, v in recent.items()}, f)

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
