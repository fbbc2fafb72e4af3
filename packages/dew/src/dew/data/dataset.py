"""Dataset, Partition and Loading: how batches reach the Trainer.

A ``Dataset`` holds a function ``train(partition)`` that returns an iterator of batches for one
process, an optional ``val(partition)`` for validation batches, the number of ``records`` in the
training set (``None`` when unknown or endless) and the global ``batch`` size. Each batch is a
mapping of numpy arrays whose first axis has ``batch / partition.count`` rows: every process
reads its own rows, and the Trainer assembles the global batch.

Resuming: the Trainer records how many training batches it drew (the *position*). On resume
it calls ``train(partition, start=position)`` when the function accepts a ``start`` keyword
(Dew's own sources do, and seek directly), otherwise it calls ``train(partition)`` and skips
``position`` batches.

``Loading(workers, threads, read_buffer)`` says how the host reads ahead: with ``workers > 0``
batches are built in that many worker processes; otherwise ``threads`` threads build them.
At most ``read_buffer`` batches are read ahead of the Trainer. Order never depends on the
number of workers or threads: batch ``i`` is always the ``i``-th batch of the stream. Random
access (building batch ``i`` on its own) needs a source with ``batch_at``; a plain iterator is
read ahead by a single thread in order.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import itertools
import multiprocessing
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dew.checks import is_int

Batch = Mapping[str, Any]


@dataclass(frozen=True)
class Partition:
    """This process's share of the data: ``index`` in ``[0, count)``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(
                f"Partition: expected 0 <= index < count, got {self.index}/{self.count}"
            )


@dataclass(frozen=True)
class Loading:
    """Host-side reading: ``workers`` processes or ``threads`` threads, ``read_buffer`` ahead."""

    workers: int = 0
    threads: int = 1
    read_buffer: int = 2

    def __post_init__(self) -> None:
        for name in ("workers", "threads", "read_buffer"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"Loading.{name}: expected an integer >= 0, got {value!r}")
        if self.read_buffer < 1:
            raise ValueError(f"Loading.read_buffer: expected >= 1, got {self.read_buffer}")
        if self.workers == 0 and self.threads < 1:
            raise ValueError("Loading: with workers=0, threads must be >= 1")


def reader_loading(owner: str, loading: Loading | None, seed: int | None) -> Loading:
    """Check a reader's ``loading`` and ``seed`` arguments; return ``loading`` or the default.

    ``owner`` names the reader in the errors (``PreferencePairs.loading: ...``).
    """
    if loading is not None and not isinstance(loading, Loading):
        raise TypeError(
            f"{owner}.loading: expected a dew.data.Loading, got {type(loading).__name__}"
        )
    if seed is not None and not is_int(seed):
        raise TypeError(f"{owner}.seed: expected None or an int, got {seed!r}")
    return loading if loading is not None else Loading()


@runtime_checkable
class IndexedSource(Protocol):
    """A source that can build batch ``i`` of a partition on its own (picklable for workers)."""

    def batch_at(self, partition: Partition, index: int) -> dict[str, np.ndarray]: ...

    def num_batches(self, partition: Partition) -> int | None: ...


class IndexedStream:
    """``train`` function over an ``IndexedSource``: ``(partition, start=0) -> iterator``."""

    def __init__(self, source: IndexedSource, loading: Loading) -> None:
        self.source = source
        self.loading = loading

    def __call__(self, partition: Partition, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        return _prefetch_indexed(self.source, partition, start, self.loading)


_WORKER_SOURCE: IndexedSource | None = None


def _set_worker_source(source: IndexedSource) -> None:
    global _WORKER_SOURCE
    _WORKER_SOURCE = source


def _worker_batch(partition: Partition, index: int) -> dict[str, np.ndarray]:
    assert _WORKER_SOURCE is not None, "worker started without a source"
    return _WORKER_SOURCE.batch_at(partition, index)


def _prefetch_indexed(
    source: IndexedSource, partition: Partition, start: int, loading: Loading
) -> Iterator[dict[str, np.ndarray]]:
    total = source.num_batches(partition)
    indices = itertools.count(start) if total is None else iter(range(start, total))
    build: Callable[[Partition, int], dict[str, np.ndarray]]
    if loading.workers > 0:
        # the source travels to each worker once, not with every batch
        ctx = multiprocessing.get_context("spawn")
        pool: cf.Executor = cf.ProcessPoolExecutor(
            loading.workers, mp_context=ctx, initializer=_set_worker_source, initargs=(source,)
        )
        build = _worker_batch
    else:
        pool = cf.ThreadPoolExecutor(loading.threads)
        build = source.batch_at
    pending: deque[cf.Future] = deque()
    try:
        for i in indices:
            pending.append(pool.submit(build, partition, i))
            if len(pending) >= loading.read_buffer:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


_END = object()


def _prefetch_iter(it: Iterator[Any], read_buffer: int) -> Iterator[Any]:
    """Read ``it`` ahead on one thread, at most ``read_buffer`` items; errors re-raise here."""
    q: queue.Queue = queue.Queue(maxsize=read_buffer)
    stop = threading.Event()

    def run() -> None:
        try:
            for item in it:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((_END, None))
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            q.put((_END, err))

    thread = threading.Thread(target=run, daemon=True, name="dew-prefetch")
    thread.start()
    try:
        while True:
            item, err = q.get()
            if err is not None:
                raise err
            if item is _END:
                return
            yield item
    finally:
        stop.set()


def _accepts_start(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "start" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass(frozen=True)
class Dataset:
    """Training and validation batches for the Trainer (see the module docstring)."""

    train: Callable[..., Iterable[Batch]]
    val: Callable[..., Iterable[Batch]] | None = None
    records: int | None = None
    batch: int | None = None
    loading: Loading = field(default_factory=Loading)

    def __post_init__(self) -> None:
        if not callable(self.train):
            raise TypeError(
                f"Dataset.train: expected a function of a partition, got {self.train!r}"
            )
        if self.val is not None and not callable(self.val):
            raise TypeError(f"Dataset.val: expected None or a function, got {self.val!r}")
        if self.batch is not None and (not isinstance(self.batch, int) or self.batch < 1):
            raise ValueError(f"Dataset.batch: expected a positive integer, got {self.batch!r}")

    def local_rows(self, partition: Partition) -> int | None:
        if self.batch is None:
            return None
        if self.batch % partition.count:
            raise ValueError(
                f"Dataset.batch: {self.batch} rows do not split over {partition.count} processes"
            )
        return self.batch // partition.count

    def stream(self, partition: Partition, start: int = 0) -> Iterator[Batch]:
        """Training batches of ``partition`` from batch ``start`` on, checked for row count."""
        if isinstance(self.train, IndexedStream) or _accepts_start(self.train):
            it = iter(self.train(partition, start=start))
        else:
            it = itertools.islice(iter(self.train(partition)), start, None)
            if not isinstance(self.train, IndexedStream):
                it = _prefetch_iter(it, self.loading.read_buffer)
        return self._checked(it, partition, "train")

    def validation(self, partition: Partition) -> Iterator[Batch] | None:
        if self.val is None:
            return None
        return self._checked(iter(self.val(partition)), partition, "val")

    def _checked(self, it: Iterator[Batch], partition: Partition, name: str) -> Iterator[Batch]:
        rows = self.local_rows(partition) if name == "train" else None
        for i, batch in enumerate(it):
            if not isinstance(batch, Mapping) or not batch:
                raise TypeError(
                    f"Dataset.{name}: batch {i} should be a non-empty mapping of arrays, "
                    f"got {type(batch).__name__}"
                )
            if rows is not None:
                for key, value in batch.items():
                    n = np.shape(value)[0] if np.ndim(value) else None
                    if n != rows:
                        raise ValueError(
                            f"Dataset.{name}: batch {i} field {key!r} has {n} rows, expected "
                            f"{rows} (batch={self.batch} over {partition.count} processes)"
                        )
            yield batch
