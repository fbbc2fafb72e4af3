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

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dew.checks import is_int, is_integer
from dew.data.dataset import Dataset, IndexedStream, Loading, reader_loading
from dew.data.preference_text import tokenize_row
from dew.data.row_batches import OnePass, RowBatches, parse_json_records

_SIDES = ("chosen", "rejected")


def _check_ids(values: object, row: str, name: str) -> list[int]:
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise TypeError(f"{row}: {name} must be a list of token ids, got {type(values).__name__}")
    ids: list[int] = []
    for value in values:
        if not is_integer(value):
            raise TypeError(
                f"{row}: {name} must hold integer token ids, got {value!r} ({type(value).__name__})"
            )
        if value < 0:
            raise ValueError(f"{row}: {name} must hold non-negative ids, got {value}")
        ids.append(int(value))
    if not ids:
        raise ValueError(f"{row}: {name} is empty")
    return ids


def _check_mask(values: object, row: str, name: str, length: int) -> list[int]:
    if values is None:
        return [1] * length
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise TypeError(f"{row}: {name} must be a list of 0/1 flags, got {type(values).__name__}")
    flags = []
    for value in values:
        if value not in (0, 1) or isinstance(value, float):
            raise ValueError(f"{row}: {name} must hold 0 or 1, got {value!r}")
        flags.append(int(value))
    if len(flags) != length:
        raise ValueError(f"{row}: {name} must have one flag per id ({length}), got {len(flags)}")
    return flags


def pair_arrays(
    rows: Sequence[Mapping[str, Any]],
    seq_len: int,
    pad_id: int,
    labels: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``rows`` and pad them: ``(input_ids, completion_mask)``, each ``[N, 2, S]``.

    ``labels`` name the rows in errors (``"data.jsonl: line 3"``); default ``row <index>``.
    """
    count = len(rows)
    input_ids = np.full((count, 2, seq_len), pad_id, dtype=np.int32)
    completion_mask = np.zeros((count, 2, seq_len), dtype=np.int32)
    for position, row in enumerate(rows):
        index = f"PreferencePairs row {position}" if labels is None else labels[position]
        if not isinstance(row, Mapping):
            raise TypeError(f"{index}: expected a JSON object, got {type(row).__name__}")
        for side_index, side in enumerate(_SIDES):
            if row.get(side) is None:
                raise ValueError(f"{index}: missing field {side!r}")
            ids = _check_ids(row[side], index, side)
            mask = _check_mask(row.get(f"{side}_mask"), index, f"{side}_mask", len(ids))
            if len(ids) > seq_len:
                raise ValueError(f"{index}: {side} has {len(ids)} ids, more than seq_len={seq_len}")
            if not any(mask[1:]):
                raise ValueError(
                    f"{index}: {side}_mask marks no completion token "
                    "after the first id, so the pair would not be scored"
                )
            input_ids[position, side_index, : len(ids)] = ids
            completion_mask[position, side_index, : len(ids)] = mask
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
    from dew.data.chat.messages import _strip_nulls

    columns = ("prompt", "chosen", "rejected", "chosen_mask", "rejected_mask")
    wanted = [c for c in columns if c in table.column_names]
    return [_strip_nulls(row) for row in table.select(wanted).to_pylist()]


def _read_path(path: str, split: str) -> tuple[list[Any], list[str]]:
    """Rows of a Parquet or JSONL file or a Hub dataset, each with its label for errors."""
    from dew.data.chat.messages import read_labeled_rows

    if path.endswith(".parquet") and os.path.isfile(path):
        rows = _read_parquet(path)
        return rows, [f"{path}: row {i}" for i in range(len(rows))]
    name, rows, labels = read_labeled_rows(path, split)
    return rows, [f"{name}: {label}" for label in labels]


class _LazyChatTokenizer:
    """Loads the tokenizer when the first text or conversation row needs it."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._loaded: Any = None

    def _get(self) -> Any:
        if self._loaded is None:
            from dew.data.chat.template import ChatTokenizer, load_chat_tokenizer

            spec = self.spec
            self._loaded = (
                spec if isinstance(spec, ChatTokenizer) or hasattr(spec, "render")
                else load_chat_tokenizer(spec, "PreferencePairs.tokenizer")
            )  # fmt: skip
        return self._loaded

    def __bool__(self) -> bool:
        return self.spec is not None

    def pad_id(self) -> int | None:
        return getattr(self._loaded, "pad_id", None) if self._loaded is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


class PreferencePairs:
    """Preference pairs for DPO (see the module docstring for the row format).

    Args:
      path: a ``.parquet`` or ``.jsonl`` file, or a Hub dataset id (``hf`` extra), with
        ``chosen``, ``rejected`` and optionally ``prompt`` (token ids with optional
        ``chosen_mask``/``rejected_mask``, or TRL's text or conversational layout, which
        ``tokenizer`` turns into ids: see ``dew.data.preference_text``).
      records: a tuple of JSON object strings with the same fields.
      tokenizer: a ``ChatTokenizer``, a local tokenizer directory or a Hub name, for text and
        conversation rows (loaded only when a row needs it).
      split: the Hub split when ``path`` is a dataset id.
      seq_len: the full row width ``S`` (use ``DPOObjective(model, seq_len=S - 1)``).
      pad_id: the id written into padding (its mask is 0); default the tokenizer's pad id
        when a tokenizer is loaded, else 0.
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
        pad_id: int | None = None,
        loading: Loading | None = None,
        seed: int | None = None,
        tokenizer: Any = None,
        split: str = "train",
    ) -> None:
        if (path is None) == (records is None):
            raise ValueError("PreferencePairs: give exactly one of path= or records=, not both")
        if not is_int(seq_len) or seq_len < 2:
            raise ValueError(f"PreferencePairs.seq_len: expected an int >= 2, got {seq_len!r}")
        if pad_id is not None and (not is_int(pad_id) or pad_id < 0):
            raise ValueError(f"PreferencePairs.pad_id: expected an int >= 0, got {pad_id!r}")
        self.path = path
        self.seq_len = seq_len
        self.loading = reader_loading("PreferencePairs", loading, seed)
        self.seed = seed
        if path is not None:
            rows, labels = _read_path(os.fspath(path), split)
        else:
            rows = parse_json_records(records, "PreferencePairs")
            labels = [f"PreferencePairs row {i}" for i in range(len(rows))]
        if not rows:
            raise ValueError("PreferencePairs: the input holds no rows")
        chat = _LazyChatTokenizer(tokenizer)
        rows = [tokenize_row(row, chat, label) for row, label in zip(rows, labels)]
        if pad_id is None:
            pad_id = chat.pad_id() or 0
        self.pad_id = pad_id
        input_ids, completion_mask = pair_arrays(rows, seq_len, pad_id, labels)
        self.arrays = {"input_ids": input_ids, "completion_mask": completion_mask}

    def __len__(self) -> int:
        return int(self.arrays["input_ids"].shape[0])

    def load(self, batch: int, val: PreferencePairs | None = None) -> Dataset:
        """A ``Dataset`` of endless training batches of ``batch`` pairs.

        ``val`` (other pairs of the same ``seq_len``) becomes the validation stream: one pass
        in file order, its last batch filled with all-padding rows whose mask is zero, so
        they add nothing to the chosen-answer perplexity.
        """
        if not is_int(batch) or batch < 1:
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
