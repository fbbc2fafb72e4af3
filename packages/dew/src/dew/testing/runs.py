"""Helpers for tests that stop a training run and resume it: wait for its first checkpoint,
read every array of its newest one.

``wait_for_checkpoint(process, run_dir, timeout)`` polls ``RUN_DIR/checkpoints`` until a
``step_*`` directory appears (True) or the process ends or the time runs out (False), so a
test can then signal the process between two checkpoints. ``checkpoint_arrays(run_dir)``
restores every leaf of the newest checkpoint (step, updates, parameters, optimizer state,
RNG keys as their data) onto one device and returns them as numpy arrays, for comparing two
runs bit for bit with ``np.array_equal``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np


def wait_for_checkpoint(
    process: subprocess.Popen, run_dir: str | os.PathLike[str], timeout: float
) -> bool:
    """Whether ``run_dir`` got a checkpoint while ``process`` still runs, within ``timeout``
    seconds (polled every 20 ms)."""
    folder = Path(run_dir) / "checkpoints"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if folder.is_dir() and any(n.startswith("step_") for n in os.listdir(folder)):
            return process.poll() is None
        time.sleep(0.02)
    return False


def checkpoint_arrays(run_dir: str | os.PathLike[str]) -> list[np.ndarray]:
    """Every array of ``run_dir``'s newest checkpoint, in the order it stores them.

    Raises:
      FileNotFoundError: ``run_dir`` holds no checkpoint.
    """
    import jax

    from dew.trainer import checkpoint

    restored = checkpoint.latest(run_dir)
    if restored is None:
        raise FileNotFoundError(f"{run_dir} holds no checkpoint")
    meta = restored.meta
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d))
                for s, d in zip(meta["shapes"], meta["dtypes"], strict=True)]  # fmt: skip
    leaves = checkpoint.restore_into(template, [device] * len(template), restored)
    return [checkpoint.to_host(x) for x in leaves]


__all__ = ["checkpoint_arrays", "wait_for_checkpoint"]
