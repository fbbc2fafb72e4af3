"""Checkpoints of a TrainState plus the data position, written by every process through orbax.

Layout: ``run_dir/checkpoints/step_<8 digits>/`` holds ``state/`` (an orbax-checkpoint
PyTree directory: the state's leaves as ``leaf_00000``, ``leaf_00001``, ... in flattening
order, PRNG keys as their key data) and ``meta.json`` (format 2: step, data position, leaf
count, dtypes and shapes, the key implementations, the SHA-256 of every file under
``state/`` and the caller's extra fields).

Writing (every process calls ``save``): orbax writes each process's own shards of every
array (a replicated array once), so nothing is gathered onto a process; the run directory
must be on a filesystem every process sees. All of it goes into ``.tmp-step_<N>`` beside the
final directory. Then every file is fsynced and hashed, the processes sharing the hashing,
and process 0 writes ``meta.json`` last, fsyncs, and renames the directory to ``step_<N>``
(``os.replace``) before fsyncing the parent. A process killed at any moment leaves the
complete older checkpoints and at most a ``.tmp-*`` directory that readers ignore and the
next save removes. Only the newest ``keep`` checkpoints are kept.

Reading: the newest checkpoint whose ``meta.json`` parses, whose files all hash to their
recorded digests and whose leaf count matches is used; each one skipped is reported with a
``warnings.warn`` naming it and the reason (the files that differ, for corruption). All
processes agree on the choice. Format-1 checkpoints (one ``state.npz``, written by Dew
0.1) are still read, see ``dew.trainer.checkpoint_npz``; every save writes format 2.

Restoring places each leaf straight onto the shardings the Trainer asks for (orbax reads only
the slices each device needs), so a run may resume on another device count; the values are
the saved bits exactly.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from dew.files import write_bytes
from dew.trainer import checkpoint_files as files
from dew.trainer import checkpoint_npz

FORMAT = 2
STATE = "state"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


@dataclass(frozen=True)
class Restored:
    """A verified checkpoint: its directory, step, data position and ``meta.json``.

    ``leaves`` holds the host arrays of a format-1 checkpoint (read while verifying it); a
    format-2 one is read by ``restore_into`` straight onto the devices.
    """

    path: str
    step: int
    position: int
    meta: dict[str, Any]
    leaves: list[np.ndarray] | None = field(default=None, repr=False)


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_host(x: Any) -> np.ndarray:
    """A numpy copy of one leaf, gathering it across processes when it is sharded over them."""
    if _is_key(x):
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array):
        if x.is_fully_addressable:
            return np.asarray(x)
        if x.sharding.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def checkpoint_dir(run_dir: str | os.PathLike[str]) -> str:
    """``RUN_DIR/checkpoints`` as an absolute path (orbax refuses relative ones, so a run
    started with ``run_dir="runs/x"`` could save but not restore)."""
    return os.path.abspath(os.path.join(os.fspath(run_dir), "checkpoints"))


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``(step, path)`` of every published checkpoint directory, oldest first."""
    root = checkpoint_dir(run_dir)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def _storable(x: Any) -> Any:
    """What orbax writes for one leaf: key data for a PRNG key, numpy for a host value."""
    if _is_key(x):
        return jax.random.key_data(x)
    return x if isinstance(x, jax.Array) else np.asarray(x)


def _checkpointer() -> Any:
    import orbax.checkpoint as ocp  # imported on first use: it takes seconds

    return ocp.Checkpointer(ocp.StandardCheckpointHandler())


class CheckpointSpaceError(OSError):
    """The device holding the checkpoints is full; the partial checkpoint was removed and
    the earlier ones are untouched."""


def _out_of_space(err: BaseException | None) -> bool:
    """Whether ``err`` (or what caused it) is a full device, however orbax/tensorstore
    worded it."""
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        text = str(err)
        if "No space left on device" in text or (
            "RESOURCE_EXHAUSTED" in text and "writ" in text.lower()
        ):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


#: What a checkpoint writes besides its arrays (orbax's manifests, metadata, meta.json).
SPACE_OVERHEAD = 256 * 1024


def _local_bytes(state: Any) -> int:
    """Bytes of the array data this process holds (its shards only)."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(state):
        if isinstance(leaf, jax.Array):
            total += sum(int(s.data.nbytes) for s in leaf.addressable_shards)
        elif hasattr(leaf, "nbytes"):
            total += int(leaf.nbytes)
    return total


def _check_space(run_dir: str | os.PathLike[str], state: Any, step: int) -> None:
    """Refuse to start a checkpoint the device cannot hold (before orbax writes anything,
    so a full disk never half-writes one); ``CheckpointSpaceError`` names what is there."""
    root = os.path.abspath(checkpoint_dir(run_dir))
    probe = root
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    need = _local_bytes(state) + SPACE_OVERHEAD
    if free < need:
        kept = list_checkpoints(run_dir)
        newest = f"the newest, {kept[-1][1]}, is intact" if kept else "there is no earlier one"
        raise CheckpointSpaceError(
            f"checkpoint of step {int(step)}: no space left on the device of {root} "
            f"({free} bytes free, about {need} needed); {newest}"
        )


def save(
    run_dir: str | os.PathLike[str],
    state: Any,
    *,
    step: int,
    position: int,
    keep: int = 3,
    extra: dict[str, Any] | None = None,
) -> str:
    """Write ``state`` as the checkpoint of ``step`` and return its path.

    A collective: every process of the run calls it with the same arguments, and each writes
    the shards it holds. ``position`` is the number of batches the data stream has given.
    A full device raises ``CheckpointSpaceError`` in one sentence naming the directory and
    the newest checkpoint left intact; the partial one is removed. Orbax's own error log
    (a traceback per writer thread) is silenced while it saves: the raised error says it.
    """
    _check_space(run_dir, state, step)
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        path = _save(run_dir, state, step=step, position=position, keep=keep, extra=extra)
    except Exception as err:
        if not _out_of_space(err):
            raise
        root = os.path.abspath(checkpoint_dir(run_dir))
        shutil.rmtree(os.path.join(root, f".tmp-step_{int(step):08d}"), ignore_errors=True)
        kept = list_checkpoints(run_dir)
        newest = f"the newest, {kept[-1][1]}, is intact" if kept else "there is no earlier one"
        raise CheckpointSpaceError(
            f"checkpoint of step {int(step)}: no space left on the device of {root}; {newest}"
        ) from None
    # restored only after a save that worked: after a failure, orbax's writer threads may
    # still log the same error (the raised one already says it)
    absl.setLevel(level)
    return path


def _save(
    run_dir: str | os.PathLike[str],
    state: Any,
    *,
    step: int,
    position: int,
    keep: int,
    extra: dict[str, Any] | None,
) -> str:
    root = os.path.abspath(checkpoint_dir(run_dir))
    name = f"step_{int(step):08d}"
    final = os.path.join(root, name)
    tmp = os.path.join(root, f".tmp-{name}")
    lead = jax.process_index() == 0
    if lead:
        os.makedirs(root, exist_ok=True)
        for old in os.listdir(root):
            if old.startswith(".tmp-"):
                shutil.rmtree(os.path.join(root, old), ignore_errors=True)
        os.makedirs(tmp)
    files.barrier(f"dew-checkpoint-start-{step}")
    leaves = jax.tree_util.tree_leaves(state)
    tree = {f"leaf_{i:05d}": _storable(x) for i, x in enumerate(leaves)}
    keys = [(i, x) for i, x in enumerate(leaves) if _is_key(x)]
    import orbax.checkpoint as ocp

    with _checkpointer() as checkpointer:
        checkpointer.save(os.path.join(tmp, STATE), args=ocp.args.StandardSave(tree))
    state_dir = os.path.join(tmp, STATE)
    names = files.listing(state_dir)
    digests = files.shared_digests(state_dir, names)
    if lead:
        files.sync_tree(state_dir)
        meta = {
            "format": FORMAT,
            "step": int(step),
            "position": int(position),
            "leaves": len(leaves),
            "dtypes": [str(a.dtype) for a in tree.values()],
            "shapes": [list(a.shape) for a in tree.values()],
            "keys": {str(i): str(jax.random.key_impl(x)) for i, x in keys},
            "sha256": {f"{STATE}/{n}": d for n, d in zip(names, digests, strict=True)},
            "processes": jax.process_count(),
            "extra": extra or {},
        }
        write_bytes(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1).encode())
        files.fsync_dir(tmp)
        if os.path.exists(final):  # the same step saved again (a resumed run): swap it out
            old = os.path.join(root, f".tmp-old-{uuid.uuid4().hex}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        files.fsync_dir(root)
        for _, path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(path, ignore_errors=True)
    files.barrier(f"dew-checkpoint-done-{step}")
    return final


def _read_meta(path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(path, "meta.json"), "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as err:
        raise ValueError(f"meta.json unreadable ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") not in (FORMAT, checkpoint_npz.FORMAT):
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"meta.json: format {got!r}, expected {FORMAT} (or 1, read only)")
    for key in ("step", "position", "leaves", "dtypes", "shapes", "keys", "sha256"):
        if key not in meta:
            raise ValueError(f"meta.json: no {key!r} field")
    return meta


def _verify(path: str, expected_leaves: int | None) -> Restored:
    """Check one step directory on every process; raise ``ValueError`` with the reason."""
    try:
        meta: dict[str, Any] | None = _read_meta(path)
        reason = None
    except ValueError as err:
        meta, reason = None, str(err)
    if not files.agree(meta is not None):
        raise ValueError(reason or "meta.json unreadable on another process")
    assert meta is not None
    n = int(meta["leaves"])
    if expected_leaves is not None and n != expected_leaves:
        raise ValueError(f"holds {n} leaves, the train state has {expected_leaves}")
    if meta["format"] == checkpoint_npz.FORMAT:
        leaves, reason = None, None
        try:
            leaves = checkpoint_npz.read_leaves(path, meta)
        except (ValueError, KeyError, OSError) as err:
            reason = str(err)
        if not files.agree(reason is None):
            raise ValueError(reason or "state.npz unreadable on another process")
        return Restored(path, int(meta["step"]), int(meta["position"]), meta, leaves)
    bad = files.shared_check(path, meta["sha256"])
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"checksum mismatch or missing file: {shown}")
    return Restored(path, int(meta["step"]), int(meta["position"]), meta)


def load(path: str | os.PathLike[str], expected_leaves: int | None = None) -> Restored:
    """One checkpoint directory (``.../checkpoints/step_NNNNNNNN``), verified; ``ValueError``
    says why it cannot be used."""
    return _verify(os.path.abspath(os.fspath(path)), expected_leaves)


def latest(run_dir: str | os.PathLike[str], expected_leaves: int | None = None) -> Restored | None:
    """The newest valid checkpoint in ``run_dir``; invalid ones are skipped with a warning.

    A collective on a multi-process run: every process verifies its share of the files and
    all of them return the same checkpoint.
    """
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            return _verify(path, expected_leaves)
        except (ValueError, KeyError, OSError) as err:
            warnings.warn(f"skipping checkpoint {path}: {err}", RuntimeWarning, stacklevel=2)
    return None


def _data_sharding(s: jax.sharding.Sharding) -> jax.sharding.Sharding:
    # key data has one trailing axis more than the key; keys are replicated here.
    if isinstance(s, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
    return s


def restore_into(template: Any, shardings: Any, restored: Restored) -> Any:
    """Rebuild a state shaped like ``template`` from ``restored``, placed with ``shardings``.

    A collective on a multi-process run. Raises ``ValueError`` naming the checkpoint and the
    leaf when a shape or dtype differs from the template's.
    """
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    s_leaves = jax.tree_util.tree_leaves(
        shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    if len(s_leaves) != len(t_leaves):
        raise ValueError(f"{len(s_leaves)} shardings for {len(t_leaves)} state leaves")
    meta = restored.meta
    if int(meta["leaves"]) != len(t_leaves):
        raise ValueError(
            f"checkpoint {restored.path}: holds {meta['leaves']} leaves, the train state has "
            f"{len(t_leaves)}"
        )
    targets = []
    for i, (t, s) in enumerate(zip(t_leaves, s_leaves, strict=True)):
        is_key = str(i) in meta["keys"]
        want_shape = tuple(jax.random.key_data(t).shape) if _is_key(t) else tuple(np.shape(t))
        shape, dtype = tuple(meta["shapes"][i]), np.dtype(meta["dtypes"][i])
        if shape != want_shape:
            raise ValueError(
                f"checkpoint {restored.path}: leaf {i} has shape {shape}, state expects "
                f"{want_shape}"
            )
        if not is_key and dtype != np.dtype(t.dtype):
            raise ValueError(
                f"checkpoint {restored.path}: leaf {i} has dtype {dtype}, state expects {t.dtype}"
            )
        targets.append(jax.ShapeDtypeStruct(shape, dtype, sharding=_data_sharding(s) if is_key
                                            else s))  # fmt: skip
    if restored.leaves is not None:  # format 1: host arrays already read and verified
        arrays = [
            jax.make_array_from_callback(t.shape, t.sharding, checkpoint_npz.slicer(h))
            for t, h in zip(targets, restored.leaves, strict=True)
        ]
    else:
        import orbax.checkpoint as ocp

        target = {f"leaf_{i:05d}": t for i, t in enumerate(targets)}
        with _checkpointer() as checkpointer:
            out = checkpointer.restore(
                os.path.join(restored.path, STATE), args=ocp.args.StandardRestore(target)
            )
        arrays = [out[f"leaf_{i:05d}"] for i in range(len(targets))]
    placed = [
        jax.random.wrap_key_data(a, impl=meta["keys"][str(i)]) if str(i) in meta["keys"] else a
        for i, a in enumerate(arrays)
    ]
    return jax.tree_util.tree_unflatten(treedef, placed)
