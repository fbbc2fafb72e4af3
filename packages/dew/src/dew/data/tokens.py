"""Token files: a flat array of token ids on disk, cut into packed rows for language modelling.

A token file is either a ``.npy`` array (any integer dtype, read with ``mmap_mode="r"``) or a
raw binary file of little-endian ids of a given ``dtype`` (``.bin``; default ``uint16`` for
vocabularies up to 65,536, ``uint32``/``int32`` otherwise). Nothing is read into memory beyond
the rows of a batch.

Rows: the file is cut into ``N = len // (seq_len + 1)`` consecutive windows of
``seq_len + 1`` ids (the tail shorter than one window is dropped). When ``eos_id`` is given,
documents end at each ``eos_id`` token: ``text_segment_ids`` numbers the documents inside a
row from 1, and ``text_positions`` restarts at 0 after each ``eos_id``. Without ``eos_id`` a
row is one document.

Order: windows are shuffled once per epoch with a permutation drawn from ``seed`` and the
epoch number (``shuffle=False`` keeps file order). Global batch ``i`` holds the ``batch``
windows ``order[i*batch : (i+1)*batch]`` of the current epoch, and process ``p`` of ``P``
reads the ``p``-th slice of ``batch / P`` of them. Any batch can be built on its own, so a
resumed run seeks straight to its position and worker processes build batches in parallel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dew.data.dataset import Dataset, IndexedStream, Loading, Partition
from dew.files import atomic_write


def write_tokens(path: str | os.PathLike[str], ids: np.ndarray, dtype: str | None = None) -> str:
    """Write ``ids`` as a token file (``.npy`` or raw ``.bin``), atomically; return the path."""
    path = os.fspath(path)
    arr = np.asarray(ids)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"ids: expected a 1-D integer array, got {arr.dtype} {arr.shape}")
    if dtype is None:
        dtype = "uint16" if arr.size == 0 or (arr.min() >= 0 and arr.max() < 2**16) else "int32"
    arr = arr.astype(dtype)
    with atomic_write(path, "wb") as f:
        if path.endswith(".npy"):
            np.save(f, arr)
        else:
            f.write(arr.astype(np.dtype(dtype).newbyteorder("<")).tobytes())
    return path


def open_tokens(path: str | os.PathLike[str], dtype: str = "uint16") -> np.ndarray:
    """Memory-map a token file as a 1-D array."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokens: no such file {path!r}")
    if path.endswith(".npy"):
        try:
            arr = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as err:
            raise ValueError(f"tokens {path!r}: not a readable .npy file ({err})") from None
    else:
        try:
            kind = np.dtype(dtype).newbyteorder("<")
        except TypeError:
            raise ValueError(
                f"token dtype: expected a numpy integer dtype, got {dtype!r}"
            ) from None
        size = os.path.getsize(path)
        if size == 0:
            raise ValueError(f"tokens {path!r}: the file is empty; expected {kind.name} token ids")
        if size % kind.itemsize:
            raise ValueError(
                f"tokens {path!r}: {size} bytes is not a whole number of {kind.name} ids "
                f"({kind.itemsize} bytes each); the last id is cut off at byte "
                f"{size - size % kind.itemsize}"
            )
        arr = np.memmap(path, dtype=kind, mode="r")
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"tokens {path!r}: expected a 1-D integer array, got {arr.dtype} {arr.shape}"
        )
    return arr


def segments(row: np.ndarray, eos_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(segment_ids, positions)`` of one row ``[W]``: a new document starts after ``eos_id``."""
    width = row.shape[0]
    if eos_id is None:
        return np.ones(width, np.int32), np.arange(width, dtype=np.int32)
    ends = row == eos_id
    starts = np.zeros(width, bool)
    starts[0] = True
    starts[1:] = ends[:-1]
    seg = np.cumsum(starts).astype(np.int32)
    idx = np.arange(width)
    first = np.maximum.accumulate(np.where(starts, idx, 0))
    return seg, (idx - first).astype(np.int32)


@dataclass(frozen=True)
class _TokenSource:
    path: str
    seq_len: int
    batch: int
    dtype: str
    eos_id: int | None
    seed: int
    shuffle: bool
    epochs: int | None

    def windows(self) -> int:
        return int(open_tokens(self.path, self.dtype).shape[0] // (self.seq_len + 1))

    def num_batches(self, partition: Partition) -> int | None:
        per_epoch = self.windows() // self.batch
        return None if self.epochs is None else per_epoch * self.epochs

    def batch_at(self, partition: Partition, index: int) -> dict[str, np.ndarray]:
        ids = open_tokens(self.path, self.dtype)
        n = ids.shape[0] // (self.seq_len + 1)
        per_epoch = n // self.batch
        if per_epoch == 0:
            raise ValueError(
                f"tokens {self.path!r}: {n} rows of seq_len + 1 = {self.seq_len + 1} ids, "
                f"fewer than one batch of {self.batch}"
            )
        epoch, i = divmod(index, per_epoch)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(n)
        else:
            order = np.arange(n)
        local = self.batch // partition.count
        lo = i * self.batch + partition.index * local
        width = self.seq_len + 1
        rows = np.stack([ids[w * width : (w + 1) * width] for w in order[lo : lo + local]])
        text = rows.astype(np.int32)
        seg_pos = [segments(r, self.eos_id) for r in text]
        return {
            "text": text,
            "text_segment_ids": np.stack([s for s, _ in seg_pos]),
            "text_positions": np.stack([p for _, p in seg_pos]),
        }


@dataclass(frozen=True)
class TokenFile:
    """Packed language-modelling rows from a token file (see the module docstring).

    ``load(batch=B)`` returns a ``Dataset`` of ``text``, ``text_segment_ids`` and
    ``text_positions``, each ``[B / processes, seq_len + 1]``. ``val_path`` names a token file
    read once, in order, for validation (at most ``val_batches`` batches).
    """

    path: str
    seq_len: int
    dtype: str = "uint16"
    eos_id: int | None = None
    seed: int = 0
    shuffle: bool = True
    epochs: int | None = None
    val_path: str | None = None
    val_batches: int | None = None
    loading: Loading = Loading()

    def load(self, batch: int) -> Dataset:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch: expected a positive integer, got {batch!r}")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {self.seq_len!r}")
        source = _TokenSource(
            os.fspath(self.path), self.seq_len, batch, self.dtype, self.eos_id, self.seed,
            self.shuffle, self.epochs,
        )  # fmt: skip
        n = source.windows()
        if n < batch:
            raise ValueError(
                f"tokens {self.path!r}: {n} rows of seq_len + 1 = {self.seq_len + 1} ids, "
                f"fewer than one batch of {batch}"
            )
        val = None
        if self.val_path is not None:
            vsource = _TokenSource(
                os.fspath(self.val_path), self.seq_len, batch, self.dtype, self.eos_id, 0, False, 1
            )
            limit = self.val_batches

            def val(partition: Partition):
                total = vsource.num_batches(partition) or 0
                if limit is not None:
                    total = min(total, limit)
                for i in range(total):
                    yield vsource.batch_at(partition, i)

        return Dataset(
            train=IndexedStream(source, self.loading),
            val=val,
            records=n,
            batch=batch,
            loading=self.loading,
        )
