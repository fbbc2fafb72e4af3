"""PreferencePairs: chosen/rejected token rows for DPO, padded into ``[N, 2, S]`` arrays.

Each row holds two token-id lists that share a prompt, ``chosen`` and ``rejected``, and
optionally ``chosen_mask`` / ``rejected_mask``: one 0/1 flag per id, 1 on completion
(answer) tokens. A missing or null mask marks every id as completion; no boundary is ever
guessed from text. Rows come from a Parquet file (``path``) or from a tuple of JSON object
strings (``records``), never both. Other columns are ignored.

Batches are ``{"input_ids": [B, 2, S], "completion_mask": [B, 2, S]}`` (int32), index 0 of
the middle axis the chosen side and 1 the rejected side. Shorter rows are right-padded with
``pad_id`` and mask 0; a row longer than ``S = seq_len`` raises with its index. Because the
first id of a row has no preceding token, the objective never scores it: a side whose mask
has no 1 after position 0 is refused, since it would contribute nothing to the loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dew.data.dataset import Dataset, IndexedStream, Loading
from dew.data.row_batches import OnePass, RowBatches, parse_json_records

_SIDES = ("chosen", "rejected")


def _check_ids(values: object, row: int, name: str) -> list[int]:
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise TypeError(
            f"PreferencePairs row {row}: {name} must be a list of token ids, "
            f"got {type(values).__name__}"
        )
    ids: list[int] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"PreferencePairs row {row}: {name} must hold integer token ids, "
                f"got {value!r} ({type(value).__name__})"
            )
        if value < 0:
            raise ValueError(
                f"PreferencePairs row {row}: {name} must hold non-negative ids, got {value}"
            )
        ids.append(int(value))
    if not ids:
        raise ValueError(f"PreferencePairs row {row}: {name} is empty")
    return ids


def _check_mask(values: object, row: int, name: str, length: int) -> list[int]:
    if values is None:
        return [1] * length
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise TypeError(
            f"PreferencePairs row {row}: {name} must be a list of 0/1 flags, "
            f"got {type(values).__name__}"
        )
    flags = []
    for value in values:
        if value not in (0, 1) or isinstance(value, float):
            raise ValueError(f"PreferencePairs row {row}: {name} must hold 0 or 1, got {value!r}")
        flags.append(int(value))
    if len(flags) != length:
        raise ValueError(
            f"PreferencePairs row {row}: {name} must have one flag per id "
            f"({length}), got {len(flags)}"
        )
    return flags


def pair_arrays(
    rows: Sequence[Mapping[str, Any]], seq_len: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``rows`` and pad them: ``(input_ids, completion_mask)``, each ``[N, 2, S]``."""
    count = len(rows)
    input_ids = np.full((count, 2, seq_len), pad_id, dtype=np.int32)
    completion_mask = np.zeros((count, 2, seq_len), dtype=np.int32)
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(
                f"PreferencePairs row {index}: expected a JSON object, got {type(row).__name__}"
            )
        for side_index, side in enumerate(_SIDES):
            if row.get(side) is None:
                raise ValueError(f"PreferencePairs row {index}: missing field {side!r}")
            ids = _check_ids(row[side], index, side)
            mask = _check_mask(row.get(f"{side}_mask"), index, f"{side}_mask", len(ids))
            if len(ids) > seq_len:
                raise ValueError(
                    f"PreferencePairs row {index}: {side} has {len(ids)} ids, more than "
                    f"seq_len={seq_len}"
                )
            if not any(mask[1:]):
                raise ValueError(
                    f"PreferencePairs row {index}: {side}_mask marks no completion token "
                    "after the first id, so the pair would not be scored"
                )
            input_ids[index, side_index, : len(ids)] = ids
            completion_mask[index, side_index, : len(ids)] = mask
    return input_ids, completion_mask


def _read_parquet(path: str | Path) -> list[Mapping[str, Any]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for side in _SIDES:
        if side not in table.column_names:
            raise ValueError(
                f"PreferencePairs.path {str(path)!r}: missing column {side!r} "
                f"(columns: {table.column_names})"
            )
    wanted = [
        c for c in ("chosen", "rejected", "chosen_mask", "rejected_mask") if c in table.column_names
    ]
    return table.select(wanted).to_pylist()


class PreferencePairs:
    """Preference pairs for DPO (see the module docstring for the row format).

    Args:
      path: a Parquet file with list-of-int columns ``chosen``, ``rejected`` and optionally
        ``chosen_mask``, ``rejected_mask``.
      records: a tuple of JSON object strings with the same fields.
      seq_len: the full row width ``S`` (use ``DPOObjective(model, seq_len=S - 1)``).
      pad_id: the id written into padding (its mask is 0).
      loading: how batches are read ahead (``dew.data.Loading``); None takes its defaults.
      seed: None keeps file order; an int shuffles each epoch deterministically.

    Every row is read and checked when the object is made, so a bad row fails early.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        records: Sequence[str] | None = None,
        *,
        seq_len: int,
        pad_id: int = 0,
        loading: Loading | None = None,
        seed: int | None = None,
    ) -> None:
        if (path is None) == (records is None):
            raise ValueError("PreferencePairs: give exactly one of path= or records=, not both")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"PreferencePairs.seq_len: expected an int >= 2, got {seq_len!r}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
            raise ValueError(f"PreferencePairs.pad_id: expected an int >= 0, got {pad_id!r}")
        if loading is not None and not isinstance(loading, Loading):
            raise TypeError(
                f"PreferencePairs.loading: expected a dew.data.Loading, got {type(loading).__name__}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"PreferencePairs.seed: expected None or an int, got {seed!r}")
        self.path = path
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.loading = loading if loading is not None else Loading()
        self.seed = seed
        rows = (
            _read_parquet(path)
            if path is not None
            else parse_json_records(records, "PreferencePairs")
        )
        if not rows:
            raise ValueError("PreferencePairs: the input holds no rows")
        input_ids, completion_mask = pair_arrays(rows, seq_len, pad_id)
        self.arrays = {"input_ids": input_ids, "completion_mask": completion_mask}

    def __len__(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    def load(self, batch: int, val: PreferencePairs | None = None) -> Dataset:
        """A ``Dataset`` of endless training batches of ``batch`` pairs.

        ``val`` (other pairs of the same ``seq_len``) becomes the validation stream: one pass
        in file order, its last batch filled with all-padding rows whose mask is zero, so
        they add nothing to the chosen-answer perplexity.
        """
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"PreferencePairs.load: batch must be a positive int, got {batch!r}")
        if val is not None:
            if not isinstance(val, PreferencePairs):
                raise TypeError(
                    f"PreferencePairs.load: val must be PreferencePairs, got {type(val).__name__}"
                )
            if val.seq_len != self.seq_len:
                raise ValueError(
                    f"PreferencePairs.load: val.seq_len must equal {self.seq_len}, "
                    f"got {val.seq_len}"
                )
        source = RowBatches(self.arrays, batch, self.seed, owner="PreferencePairs")
        validation = None
        if val is not None:
            filler = {
                "input_ids": np.full((2, self.seq_len), val.pad_id, np.int32),
                "completion_mask": np.zeros((2, self.seq_len), np.int32),
            }
            validation = OnePass(val.arrays, filler, batch, owner="PreferencePairs")
        return Dataset(
            train=IndexedStream(source, self.loading),
            val=validation,
            records=len(self),
            batch=batch,
            loading=self.loading,
        )
