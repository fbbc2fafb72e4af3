"""Batches over an in-memory table of equal-length numpy columns.

The pieces shared by ``PreferencePairs`` and ``Prompts``:

* :class:`RowBatches`, a ``dew.data.IndexedSource`` for training: global batch ``i`` holds
  positions ``i * batch ... (i + 1) * batch - 1`` of an endless stream that repeats the table
  epoch after epoch, in table order or, with ``seed``, in a fresh permutation per epoch drawn
  from ``(seed, epoch)``. An epoch's tail that does not fill a batch continues into the next
  epoch, so no row is dropped or repeated within an epoch. Process ``p`` of ``n`` takes the
  ``p``-th of ``n`` equal slices of every global batch, so batch ``i`` never depends on how
  many workers read it.
* :class:`OnePass`, a ``val(partition)`` function for validation: the table once, in order,
  the last batch completed with filler rows the caller provides (rows that count for nothing,
  such as zero masks), so every process sees the same batch shape.
* :func:`parse_json_records`, their ``records=`` argument: a sequence of JSON strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dew.data.dataset import Partition


def parse_json_records(records: object, owner: str) -> list[Any]:
    """Each JSON string of ``records`` parsed; errors name ``<owner>.records[i]``."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise TypeError(
            f"{owner}.records must be a tuple of JSON strings, got {type(records).__name__}"
        )
    rows = []
    for index, text in enumerate(records):
        if not isinstance(text, (str, bytes)):
            raise TypeError(
                f"{owner}.records[{index}] must be a JSON string, got {type(text).__name__}"
            )
        try:
            rows.append(json.loads(text))
        except json.JSONDecodeError as err:
            raise ValueError(f"{owner}.records[{index}] is not valid JSON: {err}") from err
    return rows


def _local_rows(batch: int, partition: Partition, owner: str) -> int:
    if batch % partition.count:
        raise ValueError(f"{owner}: batch {batch} does not split over {partition.count} processes")
    return batch // partition.count


class RowBatches:
    """Endless, random-access training batches of a table (see the module docstring)."""

    def __init__(
        self, arrays: Mapping[str, np.ndarray], batch: int, seed: int | None, owner: str
    ) -> None:
        self.arrays = dict(arrays)
        self.batch = batch
        self.seed = seed
        self.owner = owner
        self.records = int(next(iter(self.arrays.values())).shape[0])

    def num_batches(self, partition: Partition) -> int | None:
        return None

    def rows(self, first: int, count: int) -> np.ndarray:
        """Table rows at stream positions ``first ... first + count - 1``."""
        positions = np.arange(first, first + count)
        epochs, offsets = np.divmod(positions, self.records)
        if self.seed is None:
            return offsets
        rows = np.empty_like(offsets)
        for epoch in np.unique(epochs):
            order = np.random.default_rng((self.seed, int(epoch))).permutation(self.records)
            chosen = epochs == epoch
            rows[chosen] = order[offsets[chosen]]
        return rows

    def batch_at(self, partition: Partition, index: int) -> dict[str, np.ndarray]:
        local = _local_rows(self.batch, partition, self.owner)
        rows = self.rows(index * self.batch + partition.index * local, local)
        return {name: value[rows] for name, value in self.arrays.items()}


class OnePass:
    """``val(partition)``: one ordered pass; ``filler`` (one row per column) pads the end."""

    def __init__(
        self,
        arrays: Mapping[str, np.ndarray],
        filler: Mapping[str, np.ndarray],
        batch: int,
        owner: str,
    ) -> None:
        self.arrays = dict(arrays)
        self.filler = dict(filler)
        self.batch = batch
        self.owner = owner

    def __call__(self, partition: Partition) -> Iterator[dict[str, np.ndarray]]:
        local = _local_rows(self.batch, partition, self.owner)
        count = int(next(iter(self.arrays.values())).shape[0])
        for first in range(0, count, self.batch):
            start = first + partition.index * local
            out = {}
            for name, value in self.arrays.items():
                part = value[start : start + local]
                missing = local - part.shape[0]
                if missing:
                    fill = np.broadcast_to(self.filler[name], (missing, *value.shape[1:]))
                    part = np.concatenate([part, fill.astype(value.dtype)])
                out[name] = part
            yield out
