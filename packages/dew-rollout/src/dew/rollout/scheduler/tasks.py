"""The task stream: batches become ``Task`` lists, and the trainer's data stream registers
each batch as it is read so the scheduler can submit ahead of the trainer (host side).

``task_ids(batch)`` reads integer ``task_id`` rows ``[B]`` (every other column's row rides in
``Task.data`` as a mapping). ``prompt_tasks(batch)`` reads a ``Prompts`` batch (``prompt``
``[B, P]`` left-padded, ``prompt_length`` ``[B]`` and the UTF-8 byte columns) into the tasks a
``PromptSource`` reads, ids ``0 .. B-1``.

``TaskStream`` wraps a ``Dataset``: its ``train(partition, start=)`` reads the original stream
and, before handing the trainer batch ``i``, reads batches up to ``i + ahead`` so they can be
submitted while the trainer updates. The trainer still counts only the batches it took, so its
checkpointed position is unchanged; reopening the stream (a resumed ``fit``) tells the
scheduler to cancel the old stream's work.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from dew.data.dataset import Dataset, Partition
from dew.data.prompts import decode_text
from dew.rollout.sources.prompt import TEXT_FIELDS, prompt_task
from dew.sessions.records import Task

Batch = Mapping[str, Any]
TaskReader = Callable[[Batch], list[Task]]


def _rows(batch: Batch, name: str) -> np.ndarray:
    if name not in batch:
        raise KeyError(f"batch[{name!r}]: missing; present columns are {sorted(batch)}")
    return np.asarray(batch[name])


def task_ids(batch: Batch) -> list[Task]:
    """One ``Task(task_id, {column: row})`` per integer ``task_id`` row of ``batch``."""
    ids = _rows(batch, "task_id").reshape(-1)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"batch['task_id']: expected integer ids, got dtype {ids.dtype}")
    tasks = []
    for row, task in enumerate(ids.tolist()):
        data = {k: np.asarray(v)[row] for k, v in batch.items() if k != "task_id"}
        tasks.append(Task(int(task), data))
    return tasks


def prompt_tasks(batch: Batch) -> list[Task]:
    """The ``PromptSource`` tasks of a ``Prompts`` batch (left padding removed)."""
    prompt = _rows(batch, "prompt")
    lengths = _rows(batch, "prompt_length").reshape(-1)
    if prompt.ndim != 2 or lengths.shape[0] != prompt.shape[0]:
        raise ValueError(
            f"batch['prompt'], batch['prompt_length']: expected [B, P] and [B], got "
            f"{prompt.shape} and {lengths.shape}"
        )
    width = prompt.shape[1]
    tasks = []
    for row, n in enumerate(lengths.tolist()):
        if not 1 <= n <= width:
            raise ValueError(f"batch['prompt_length'][{row}]: expected 1..{width}, got {n}")
        texts = {
            name: decode_text(np.asarray(batch[name])[row]) if name in batch else ""
            for name in TEXT_FIELDS
        }
        tasks.append(prompt_task(row, prompt[row, width - n :], **texts))
    return tasks


def _describe(value: np.ndarray) -> str:
    """``shape (2,) int32 [0 1]``: enough of an array to tell two apart in an error."""
    text = np.array2string(value, threshold=8, edgeitems=2, separator=", ")
    return f"shape {value.shape} {value.dtype} {text}"


def _column_difference(batch: Batch, name: str, expected: Any) -> str | None:
    """Why ``batch[name]`` is not the registered column ``expected`` (``None``: it is).

    Values are compared, not dtypes (a trainer may hand over a narrowed copy); nan equals nan.
    """
    want = np.asarray(expected)
    if name not in batch:
        return f"batch[{name!r}] expected {_describe(want)}, got no such column"
    got = np.asarray(batch[name])
    inexact = np.issubdtype(want.dtype, np.inexact) and np.issubdtype(got.dtype, np.inexact)
    if got.shape == want.shape and np.array_equal(got, want, equal_nan=inexact):
        return None
    return f"batch[{name!r}] expected {_describe(want)}, got {_describe(got)}"


class TaskStream:
    """The registry of batches read ahead for one scheduler (see the module docstring).

    ``open(start)`` is called by each new stream; ``take()`` gives the index of the next batch
    the trainer took; ``batch(i)`` a registered batch; ``forget(i)`` drops one.
    """

    def __init__(self, ahead: int, on_open: Callable[[int], None]) -> None:
        self.ahead = ahead
        self.on_open = on_open
        self._lock = threading.Lock()
        self._batches: dict[int, Batch] = {}
        self._handed: deque[int] = deque()
        self._generation = 0

    def wrap(self, dataset: Dataset) -> Dataset:
        if not isinstance(dataset, Dataset):
            raise TypeError(f"dataset: expected a dew.data.Dataset, got {type(dataset).__name__}")

        def train(partition: Partition, start: int = 0) -> Iterator[Batch]:
            return self._stream(dataset, partition, start)

        return Dataset(train=train, val=dataset.val, records=dataset.records,
                       batch=dataset.batch, loading=dataset.loading)  # fmt: skip

    def _stream(self, dataset: Dataset, partition: Partition, start: int) -> Iterator[Batch]:
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._batches.clear()
            self._handed.clear()
        self.on_open(start)
        inner = dataset.stream(partition, start=start)
        return self._read(inner, start, generation)

    def _read(self, inner: Iterator[Batch], start: int, generation: int) -> Iterator[Batch]:
        read, index, ended = start, start, False
        try:
            while True:
                while not ended and read <= index + self.ahead:
                    try:
                        batch = next(inner)
                    except StopIteration:
                        ended = True
                        break
                    with self._lock:
                        if generation != self._generation:
                            return
                        self._batches[read] = batch
                    read += 1
                with self._lock:
                    if generation != self._generation or index not in self._batches:
                        return
                    self._handed.append(index)
                    batch = self._batches[index]
                yield batch
                index += 1
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()

    def take(self, batch: Batch) -> int:
        """The index of the batch the trainer now hands over.

        Every column of the registered batch is checked against ``batch`` (same shape and
        values; the trainer may add columns, never change one): a batch that is not the one
        this stream handed out raises ``ValueError`` naming the column, what was registered
        and what came. A call with nothing handed out raises ``RuntimeError``.
        """
        with self._lock:
            if not self._handed:
                raise RuntimeError(
                    "scheduler: called with a batch that did not come from scheduler.tasks("
                    "dataset); train on the wrapped dataset"
                )
            index = self._handed.popleft()
            mine = self._batches[index]
        for name, expected in mine.items():
            problem = _column_difference(batch, name, expected)
            if problem is not None:
                raise ValueError(
                    f"scheduler: the batch handed over is not batch {index} of the wrapped "
                    f"stream: {problem}; train on scheduler.tasks(dataset)"
                )
        return index

    def registered(self, index: int) -> Batch | None:
        with self._lock:
            return self._batches.get(index)

    def forget(self, index: int) -> None:
        with self._lock:
            self._batches.pop(index, None)


def check_tasks(tasks: Any, index: int) -> list[Task]:
    """The reader's output as a nonempty list of ``Task``, or a named error."""
    out = list(tasks)
    if not out:
        raise ValueError(f"tasks: batch {index} gave no tasks")
    for position, task in enumerate(out):
        if not isinstance(task, Task):
            raise TypeError(
                f"tasks: batch {index} item {position}: expected a Task, got {type(task).__name__}"
            )
    return out


__all__ = ["TaskStream", "check_tasks", "prompt_tasks", "task_ids"]
