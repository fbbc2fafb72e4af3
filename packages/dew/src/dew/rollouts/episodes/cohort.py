"""How a collection is laid out over processes and devices, and how ranks agree.

Layout. The global cohort has ``B * G`` slots per process in task-row order; each process
splits its slots into equal generation shards, each sampled in one policy call with its own
key ``fold_in(round_key, global shard index)`` and packed into its own
``shard_slots * max_turns`` rows. By default a process is one shard. With device shards
(``EpisodeRollout(device_shards=True)``) there are ``gcd(B, local devices)`` of them, so a
task's group never straddles two shards, and a layout with one device per process draws,
scores and packs every slot exactly as one process holding the same global devices.

Binding. The policy gets a host-local copy of the variables (the first addressable copy of a
replicated leaf, an all-gather of a sharded one), so generation runs as a local program that
needs no other rank.

Agreement. Before opening any environment every rank compares a fingerprint of its cohort
configuration (task rows, groups, budgets, sampling, clocks, estimator, journal use): a
difference raises :class:`CohortMismatch` on every rank. After opening and after every round
the ranks exchange a failure flag, so an exception on one rank ends every rank before the
next generation (others raise :class:`RemoteFailure`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


class CohortMismatch(ValueError):
    """Ranks disagree on the cohort configuration (raised on every rank)."""


class RemoteFailure(RuntimeError):
    """Another rank's collection failed; this rank released its environments and stopped."""


def task_ids(batch: Mapping[str, Any]) -> list[int]:
    """The ``task_id`` column of a batch as Python ints (``[B]`` or ``[B, 1]``)."""
    if "task_id" not in batch:
        raise KeyError(
            f"batch['task_id']: missing; EpisodeRollout reads integer task ids, got columns "
            f"{sorted(batch)}"
        )
    column = np.asarray(batch["task_id"])
    if column.ndim == 2 and column.shape[1] == 1:
        column = column[:, 0]
    if column.ndim != 1 or column.dtype == np.bool_ or column.dtype.kind not in "iu":
        raise ValueError(
            f"batch['task_id']: expected integer ids of shape [B], got {column.dtype} "
            f"{column.shape}"
        )
    if column.size == 0 or column.min() < 0:
        raise ValueError(f"batch['task_id']: expected nonnegative ids, got {column.tolist()}")
    return [int(t) for t in column]


def shard_count(rows: int) -> int:
    """Generation shards of this process for ``rows`` local task rows."""
    return math.gcd(int(rows), jax.local_device_count())


def local_variables(variables: Any) -> Any:
    """A copy of ``variables`` that lives on this process only (see the module docstring)."""

    def local(leaf: Any) -> Any:
        if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
            return leaf
        if leaf.sharding.is_fully_replicated:
            return leaf.addressable_data(0)
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))

    return jax.tree_util.tree_map(local, variables)


def fingerprint(config: dict[str, Any]) -> np.ndarray:
    """Eight uint32 words of SHA-256 over the JSON of ``config``."""
    text = json.dumps(config, sort_keys=True, default=str).encode()
    return np.frombuffer(hashlib.sha256(text).digest(), dtype=np.uint32).copy()


def agree_on_config(config: dict[str, Any]) -> None:
    """Raise :class:`CohortMismatch` on every rank unless all ranks have the same config."""
    if jax.process_count() == 1:
        return
    mine = fingerprint(config)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), -1)
    differing = [r for r in range(every.shape[0]) if not np.array_equal(every[r], every[0])]
    if differing:
        raise CohortMismatch(
            f"cohort: rank {jax.process_index()} has configuration {config}; ranks "
            f"{differing} differ from rank 0 (task rows, groups, budgets, sampling, clocks and "
            "estimator must agree before any environment opens)"
        )


def agree_on_failure(error: BaseException | None) -> None:
    """Exchange failure flags; re-raise this rank's error or raise :class:`RemoteFailure`."""
    if jax.process_count() > 1:
        flag = np.asarray([0 if error is None else 1], np.int32)
        flags = np.asarray(multihost_utils.process_allgather(flag)).reshape(-1)
    else:
        flags = np.asarray([0 if error is None else 1])
    if error is not None:
        raise error
    if flags.any():
        ranks = [int(r) for r in np.flatnonzero(flags)]
        raise RemoteFailure(f"rank(s) {ranks} failed; rank {jax.process_index()} stopped too")


__all__ = [
    "CohortMismatch",
    "RemoteFailure",
    "agree_on_config",
    "agree_on_failure",
    "fingerprint",
    "local_variables",
    "shard_count",
    "task_ids",
]
