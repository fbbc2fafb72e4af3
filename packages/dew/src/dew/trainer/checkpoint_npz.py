"""Reading format 1, the checkpoints Dew wrote before it moved to orbax-checkpoint.

A format-1 step directory holds ``state.npz`` (every leaf of the state, in flattening order,
PRNG keys as their key data) and ``meta.json`` with its SHA-256. Runs started with an older
Dew resume from these; every new save writes format 2 (``dew.trainer.checkpoint``), so after
one more checkpoint the run has moved over. Nothing writes format 1 any more.
"""

from __future__ import annotations

import hashlib
import io
import os
from typing import Any

import numpy as np

FORMAT = 1


def read_leaves(path: str, meta: dict[str, Any]) -> list[np.ndarray]:
    """The host leaves of a format-1 checkpoint, after checking ``state.npz``'s digest.

    Raises ``ValueError`` naming the file when it is unreadable or its digest differs.
    """
    file = os.path.join(path, "state.npz")
    try:
        with open(file, "rb") as f:
            payload = f.read()
    except OSError as err:
        raise ValueError(f"state.npz unreadable ({err})") from err
    digest = hashlib.sha256(payload).hexdigest()
    recorded = str(meta["sha256"]["state.npz"])
    if digest != recorded:
        raise ValueError(f"state.npz checksum {digest[:12]} != recorded {recorded[:12]}")
    with np.load(io.BytesIO(payload)) as z:
        return [z[f"leaf_{i:05d}"] for i in range(int(meta["leaves"]))]


def slicer(h: np.ndarray) -> Any:
    """The callback ``jax.make_array_from_callback`` needs to place the host array ``h``."""

    def get(idx: Any) -> np.ndarray:
        return h[idx]

    return get
