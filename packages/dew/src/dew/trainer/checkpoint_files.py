"""File-level pieces of the checkpoint format: durable writes, digests, agreement across processes.

A checkpoint is a directory of files written by several processes. These helpers make its
writing durable (``fsync`` of every file and directory before the rename that publishes it)
and its corruption detectable (a SHA-256 of every file, recorded in ``meta.json``).

Hashing is split over the processes of a run: process ``p`` of ``P`` hashes the files at
positions ``p, p + P, ...`` of the sorted listing and the digests are exchanged with one
``process_allgather``, so no process reads the whole checkpoint. Every multi-process helper
here is a collective: all processes call it, in the same order, with the same arguments.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils

_CHUNK = 8 << 20


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def listing(root: str) -> list[str]:
    """Every regular file under ``root``, as sorted paths relative to it (``/``-separated)."""
    found = []
    for here, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(here, name), root)
            found.append(rel.replace(os.sep, "/"))
    return sorted(found)


def sync_tree(root: str) -> None:
    """fsync every file and directory under ``root`` (and ``root`` itself), deepest first."""
    for here, _, names in os.walk(root, topdown=False):
        for name in names:
            fd = os.open(os.path.join(here, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(here)


def sha256_file(path: str) -> bytes:
    """The SHA-256 of a file's bytes, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.digest()


def gather(values: np.ndarray) -> np.ndarray:
    """``values`` of every process stacked on a new first axis ``[P, ...]`` (a collective)."""
    if jax.process_count() == 1:
        return values[None]
    return np.asarray(multihost_utils.process_allgather(values))


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (nothing on one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def _mine(n: int) -> range:
    return range(jax.process_index(), n, jax.process_count())


def shared_digests(root: str, names: Sequence[str]) -> list[str]:
    """Hex SHA-256 of each file ``root/name``, each process hashing its share (a collective).

    Every process must pass the same ``names``; a process whose listing differs (a directory
    not yet visible on its filesystem) is reported instead of mixing digests of other files.
    """
    n = len(names)
    listed = np.frombuffer(hashlib.sha256("\n".join(names).encode()).digest(), np.uint8)
    if not (gather(listed) == listed).all():
        raise RuntimeError(f"checkpoint {root}: the processes see different files in it")
    local = np.zeros((max(n, 1), 32), np.uint8)
    for i in _mine(n):
        local[i] = np.frombuffer(sha256_file(os.path.join(root, names[i])), np.uint8)
    every = gather(local)
    owner = [i % jax.process_count() for i in range(n)]
    return [bytes(every[owner[i], i]).hex() for i in range(n)]


def shared_check(root: str, digests: dict[str, str]) -> list[str]:
    """The files of ``digests`` missing under ``root`` or hashing otherwise (a collective).

    Each process hashes its share of the files; the verdicts are exchanged, so every process
    returns the same list, sorted.
    """
    names = sorted(digests)
    local = np.zeros(max(len(names), 1), np.uint8)
    for i in _mine(len(names)):
        path = os.path.join(root, names[i])
        try:
            ok = sha256_file(path).hex() == digests[names[i]]
        except OSError:
            ok = False
        local[i] = 0 if ok else 1
    bad = gather(local).max(axis=0)
    return [names[i] for i in range(len(names)) if bad[i]]


def agree(ok: bool) -> bool:
    """True when ``ok`` holds on every process (a collective)."""
    return bool(gather(np.array([1 if ok else 0], np.int32)).min())
