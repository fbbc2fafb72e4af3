"""Checkpoints of a TrainState plus the data position, written atomically and verified on read.

Layout: ``run_dir/checkpoints/step_<8 digits>/`` holds ``state.npz`` (every leaf of the state
pytree, in flattening order, as a plain numpy array; PRNG keys as their key data) and
``meta.json`` (step, data position, leaf count, dtypes and shapes, the SHA-256 of
``state.npz`` and any extra fields the caller adds).

Writing: both files go into a temporary directory beside the final one, each is fsynced, the
directory is fsynced, then ``os.replace`` moves it to its final name and the parent directory
is fsynced. A crash at any point leaves either the complete old checkpoints or a ``.tmp-*``
directory that readers ignore and the next save removes. Only the last ``keep`` checkpoints
are kept.

Reading: the newest checkpoint whose ``meta.json`` parses, whose ``state.npz`` hashes to the
recorded digest and whose leaves match the expected structure is used; each one skipped is
reported with a ``warnings.warn`` naming it and the reason.

Why not orbax-checkpoint (yet): the whole-file digest with fallback to the previous good step
and the bit-exact round trip of every leaf (PRNG keys included) are pinned by tests written
against this format. The price, measured by ``tools/bench/bench_checkpoint.py`` and quoted in
the distribution's README: on a 100M-parameter FSDP state orbax saves and restores several
times faster and without gathering the state into host memory, and a multi-host run here
gathers FSDP shards to every process before writing (``process_allgather``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


@dataclass(frozen=True)
class Restored:
    """A checkpoint read back: the host leaves, the step and the data position."""

    path: str
    step: int
    position: int
    leaves: list[np.ndarray]
    meta: dict[str, Any]


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def checkpoint_dir(run_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(run_dir), "checkpoints")


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``(step, path)`` of every complete-looking checkpoint directory, oldest first."""
    root = checkpoint_dir(run_dir)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def save(
    run_dir: str | os.PathLike[str],
    state: Any,
    *,
    step: int,
    position: int,
    keep: int = 3,
    extra: dict[str, Any] | None = None,
    write: bool = True,
) -> str | None:
    """Write ``state`` as the checkpoint of ``step``; return its path (``None`` if not writing).

    Every process must call this (sharded leaves are gathered collectively); only the one with
    ``write=True`` (process 0) touches the disk.
    """
    leaves = jax.tree_util.tree_leaves(state)
    host = [to_host(x) for x in leaves]
    keys = [i for i, x in enumerate(leaves) if _is_key(x)]
    if not write:
        return None
    root = checkpoint_dir(run_dir)
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):
        if name.startswith(".tmp-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    buf = io.BytesIO()
    arrays: dict[str, Any] = {f"leaf_{i:05d}": a for i, a in enumerate(host)}
    np.savez(buf, **arrays)
    payload = buf.getvalue()
    meta = {
        "format": FORMAT,
        "step": int(step),
        "position": int(position),
        "leaves": len(host),
        "dtypes": [str(a.dtype) for a in host],
        "shapes": [list(a.shape) for a in host],
        "keys": {str(i): str(jax.random.key_impl(leaves[i])) for i in keys},
        "sha256": {"state.npz": hashlib.sha256(payload).hexdigest()},
        "extra": extra or {},
    }
    final = os.path.join(root, f"step_{int(step):08d}")
    tmp = os.path.join(root, f".tmp-step_{int(step):08d}-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    _write_file(os.path.join(tmp, "state.npz"), payload)
    _write_file(os.path.join(tmp, "meta.json"), json.dumps(meta, indent=1).encode())
    _fsync_dir(tmp)
    if os.path.exists(final):  # the same step saved again (a resumed run): swap it out
        old = os.path.join(root, f".tmp-old-{uuid.uuid4().hex}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    for _, path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    return final


def _read(path: str, expected_leaves: int | None) -> Restored:
    try:
        with open(os.path.join(path, "meta.json"), "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as err:
        raise ValueError(f"meta.json unreadable ({err})") from err
    if meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT}")
    try:
        with open(os.path.join(path, "state.npz"), "rb") as f:
            payload = f.read()
    except OSError as err:
        raise ValueError(f"state.npz unreadable ({err})") from err
    digest = hashlib.sha256(payload).hexdigest()
    if digest != meta["sha256"]["state.npz"]:
        raise ValueError(
            f"state.npz checksum {digest[:12]} != recorded {meta['sha256']['state.npz'][:12]}"
        )
    n = int(meta["leaves"])
    if expected_leaves is not None and n != expected_leaves:
        raise ValueError(f"holds {n} leaves, the train state has {expected_leaves}")
    with np.load(io.BytesIO(payload)) as z:
        leaves = [z[f"leaf_{i:05d}"] for i in range(n)]
    return Restored(path, int(meta["step"]), int(meta["position"]), leaves, meta)


def latest(run_dir: str | os.PathLike[str], expected_leaves: int | None = None) -> Restored | None:
    """The newest valid checkpoint in ``run_dir``; invalid ones are skipped with a warning."""
    for _, path in reversed(list_checkpoints(run_dir)):
        try:
            return _read(path, expected_leaves)
        except (ValueError, KeyError, OSError) as err:
            warnings.warn(f"skipping checkpoint {path}: {err}", RuntimeWarning, stacklevel=2)
    return None


def restore_into(template: Any, shardings: Any, restored: Restored) -> Any:
    """Rebuild a state shaped like ``template`` from ``restored``, placed with ``shardings``."""
    t_leaves, treedef = jax.tree_util.tree_flatten(template)
    s_leaves = jax.tree_util.tree_leaves(
        shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    if len(s_leaves) != len(t_leaves):
        raise ValueError(f"{len(s_leaves)} shardings for {len(t_leaves)} state leaves")
    out = []
    for i, (t, s, h) in enumerate(zip(t_leaves, s_leaves, restored.leaves, strict=True)):
        key_impl = restored.meta["keys"].get(str(i))
        want_shape = tuple(jax.random.key_data(t).shape) if _is_key(t) else tuple(t.shape)
        if tuple(h.shape) != want_shape:
            raise ValueError(
                f"checkpoint {restored.path}: leaf {i} has shape {h.shape}, state expects {want_shape}"
            )
        if key_impl is not None:
            data = jax.make_array_from_callback(h.shape, _data_sharding(s), _slicer(h))
            out.append(jax.random.wrap_key_data(data, impl=key_impl))
        else:
            if h.dtype != np.dtype(t.dtype):
                raise ValueError(
                    f"checkpoint {restored.path}: leaf {i} has dtype {h.dtype}, state expects {t.dtype}"
                )
            out.append(jax.make_array_from_callback(h.shape, s, _slicer(h)))
    return jax.tree_util.tree_unflatten(treedef, out)


def _slicer(h: np.ndarray) -> Any:
    def get(idx: Any) -> np.ndarray:
        return h[idx]

    return get


def _data_sharding(s: jax.sharding.Sharding) -> jax.sharding.Sharding:
    # key data has one trailing axis more than the key; keys are replicated scalars here.
    if isinstance(s, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
    return s
