"""Prompts: the prompt rows GRPO samples from, as fixed-shape numeric batches.

A row has ``prompt`` and the reward metadata ``data_source``, ``ground_truth`` and
``extra_info``. Rows come from ``path`` (a ``.parquet`` or ``.jsonl`` file, or a Hub dataset id
with the ``hf`` extra) or from ``records``, a tuple of JSON object strings; never both.

``prompt`` is one of
  * a list of token ids (used as they are; no tokenizer is loaded for these),
  * a string (tokenized with ``tokenizer.encode``, no special tokens added),
  * a list of ``{"role": ..., "content": ...}`` messages (rendered by the tokenizer's chat
    template with the generation prompt appended, then tokenized).

verl's RL parquet layout reads as it is: ``ground_truth`` may sit in
``reward_model.ground_truth`` (a top-level ``ground_truth`` wins when both exist),
``extra_info`` is kept whole (``tools_kwargs`` included), and the ``ability`` and
``agent_name`` columns are read and dropped, like every other column not named here.

Metadata: a missing or null field becomes the empty string; a value that is not a string
(a number, a list, ``extra_info``'s mapping) travels as its JSON text. Each field becomes a
fixed-width column of UTF-8 byte values (int32, ``[B, W]``, zero-padded on the right, ``W``
the longest value in the file); :func:`decode_text` reads one row back. A string holding a
NUL character is refused, because NUL is the padding.

Batches (``P = max_prompt_len``):

==================  =========  ==========================================================
``prompt``          ``[B, P]``  ids, left-padded with ``pad_id``
``prompt_length``   ``[B]``     real ids per row
``data_source``     ``[B, Wd]`` UTF-8 bytes
``ground_truth``    ``[B, Wg]`` UTF-8 bytes
``extra_info``      ``[B, We]`` UTF-8 bytes
==================  =========  ==========================================================

A prompt longer than ``P`` keeps its last ``P`` ids (the end of a prompt, where the question
and the generation header sit, matters most); the number of truncated prompts is in
``Prompts.truncated`` and a warning names it. An empty prompt is refused.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dew.checks import is_int, is_integer
from dew.data.dataset import Dataset, IndexedStream, Loading, reader_loading
from dew.data.row_batches import OnePass, RowBatches, parse_json_records

METADATA = ("data_source", "ground_truth", "extra_info")


def encode_text(values: Sequence[str], field: str) -> np.ndarray:
    """UTF-8 bytes of each string as an int32 ``[N, W]`` array, zero-padded on the right."""
    encoded = []
    for index, value in enumerate(values):
        if "\x00" in value:
            raise ValueError(f"Prompts row {index}: {field} holds a NUL character (the padding)")
        encoded.append(value.encode("utf-8"))
    width = max((len(b) for b in encoded), default=0)
    out = np.zeros((len(encoded), width), dtype=np.int32)
    for index, data in enumerate(encoded):
        out[index, : len(data)] = np.frombuffer(data, dtype=np.uint8)
    return out


def decode_text(row: Any) -> str:
    """The string of one ``[W]`` byte row written by :func:`encode_text` (padding removed)."""
    data = np.asarray(row)
    if data.ndim != 1:
        raise ValueError(f"decode_text: expected one [W] row, got shape {data.shape}")
    if data.size and (data.min() < 0 or data.max() > 255):
        raise ValueError("decode_text: byte values must lie in [0, 255]")
    return bytes(data.astype(np.uint8)).rstrip(b"\x00").decode("utf-8")


def _metadata_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _is_ids(prompt: list[Any]) -> bool:
    return all(is_integer(v) for v in prompt)


def _is_messages(prompt: list[Any]) -> bool:
    return all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt)


def resolve_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer object from a ``ChatTokenizer``-like object, a local directory or a Hub id.

    Objects are used as they are when they have ``encode`` (and ``render`` for messages).
    """
    if not isinstance(tokenizer, (str, bytes, os.PathLike)) and hasattr(tokenizer, "encode"):
        return tokenizer
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(
            "Prompts.tokenizer: expected a tokenizer directory, a Hub name or an object with "
            f"encode(), got {type(tokenizer).__name__}"
        )
    from dew.data.chat.template import load_chat_tokenizer

    return load_chat_tokenizer(tokenizer, field="Prompts.tokenizer")


class _LazyTokenizer:
    """Loads the tokenizer on first use, so token-id prompts never load one."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.loaded: Any = None

    def get(self, row: int, kind: str) -> Any:
        if self.spec is None:
            raise ValueError(
                f"Prompts row {row}: prompt is {kind}, which needs tokenizer= (only token-id "
                "lists load without one)"
            )
        if self.loaded is None:
            self.loaded = resolve_tokenizer(self.spec)
        return self.loaded


def prompt_ids(prompt: Any, row: int, tokenizer: _LazyTokenizer) -> list[int]:
    """The token ids of one row's ``prompt`` (see the module docstring for its forms)."""
    if isinstance(prompt, str):
        ids = list(tokenizer.get(row, "a string").encode(prompt))
    elif isinstance(prompt, (list, tuple, np.ndarray)):
        prompt = list(prompt)
        if not prompt:
            raise ValueError(f"Prompts row {row}: prompt is empty")
        if _is_ids(prompt):
            ids = [int(v) for v in prompt]
        elif _is_messages(prompt):
            chat = tokenizer.get(row, "a list of messages")
            if not hasattr(chat, "render"):
                raise TypeError(
                    f"Prompts row {row}: message prompts need a tokenizer with a chat template "
                    f"(render), got {type(chat).__name__}"
                )
            messages = [dict(m) for m in prompt]
            ids = list(chat.encode(chat.render(messages, add_generation_prompt=True)))
        else:
            raise TypeError(
                f"Prompts row {row}: prompt must be token ids, a string or role/content "
                f"messages, got a list starting with {prompt[0]!r}"
            )
    else:
        raise TypeError(
            f"Prompts row {row}: prompt must be token ids, a string or role/content messages, "
            f"got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(f"Prompts row {row}: prompt has no tokens")
    if any(i < 0 for i in ids):
        raise ValueError(f"Prompts row {row}: prompt holds a negative token id")
    return ids


def _ground_truth(row: Mapping[str, Any]) -> Any:
    if row.get("ground_truth") is not None:
        return row["ground_truth"]
    reward_model = row.get("reward_model")
    if isinstance(reward_model, str):  # some exports keep the struct as JSON text
        try:
            reward_model = json.loads(reward_model)
        except json.JSONDecodeError:
            reward_model = None
    if isinstance(reward_model, Mapping):
        return reward_model.get("ground_truth")
    return None


def _read(
    path: str | Path | None, records: Sequence[str] | None, split: str
) -> tuple[list[Any], list[str] | None]:
    """The raw rows and, for a file, each row's label (``prompts.jsonl: line 3``)."""
    if path is not None:
        from dew.data.chat.messages import read_labeled_rows

        name, rows, labels = read_labeled_rows(os.fspath(path), split)
        return rows, [f"{name}: {label}" for label in labels]
    return parse_json_records(records, "Prompts"), None


class Prompts:
    """Prompt rows for GRPO (see the module docstring for rows and batches).

    Args:
      path: a ``.parquet`` or ``.jsonl`` file, or a Hub dataset id (``hf`` extra).
      records: a tuple of JSON object strings.
      tokenizer: for string and message prompts: a ``dew.data.chat.ChatTokenizer`` (or any
        object with ``encode`` and, for messages, ``render``), a local tokenizer directory or
        a Hub name. Loaded only when a row needs it.
      max_prompt_len: ``P``, the prompt width.
      pad_id: the left padding id (default: the tokenizer's pad id when one is loaded, else 0).
      loading: how batches are read ahead (``dew.data.Loading``).
      seed: None keeps file order; an int shuffles each epoch deterministically.
      split: the Hub split when ``path`` is a dataset id.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        records: Sequence[str] | None = None,
        *,
        tokenizer: Any = None,
        max_prompt_len: int,
        pad_id: int | None = None,
        loading: Loading | None = None,
        seed: int | None = None,
        split: str = "train",
    ) -> None:
        if (path is None) == (records is None):
            raise ValueError("Prompts: give exactly one of path= or records=, not both")
        if not is_int(max_prompt_len) or max_prompt_len < 1:
            raise ValueError(
                f"Prompts.max_prompt_len: expected a positive int, got {max_prompt_len!r}"
            )
        if pad_id is not None and (not is_int(pad_id) or pad_id < 0):
            raise ValueError(f"Prompts.pad_id: expected None or an int >= 0, got {pad_id!r}")
        self.path = path
        self.max_prompt_len = max_prompt_len
        self.loading = reader_loading("Prompts", loading, seed)
        self.seed = seed
        lazy = _LazyTokenizer(tokenizer)
        rows, labels = _read(path, records, split)
        if not rows:
            raise ValueError("Prompts: the input holds no rows")
        all_ids: list[list[int]] = []
        texts: dict[str, list[str]] = {name: [] for name in METADATA}
        for index, row in enumerate(rows):
            try:
                self._read_row(row, index, lazy, all_ids, texts)
            except (TypeError, ValueError) as err:
                prefix = f"Prompts row {index}"
                if labels is None or not str(err).startswith(prefix):
                    raise
                raise type(err)(labels[index] + str(err)[len(prefix) :]) from None
        self.tokenizer = lazy.loaded
        if pad_id is None:
            pad_id = getattr(self.tokenizer, "pad_id", None) or 0
        self.pad_id = int(pad_id)
        prompt = np.full((len(rows), max_prompt_len), self.pad_id, dtype=np.int32)
        lengths = np.zeros((len(rows),), dtype=np.int32)
        self.truncated = 0
        for index, ids in enumerate(all_ids):
            if len(ids) > max_prompt_len:
                self.truncated += 1
                ids = ids[-max_prompt_len:]
            prompt[index, max_prompt_len - len(ids) :] = ids
            lengths[index] = len(ids)
        if self.truncated:
            warnings.warn(
                f"Prompts: {self.truncated} of {len(rows)} prompts were longer than "
                f"max_prompt_len={max_prompt_len} and keep only their last {max_prompt_len} ids",
                stacklevel=2,
            )
        self.arrays = {"prompt": prompt, "prompt_length": lengths}
        for name in METADATA:
            self.arrays[name] = encode_text(texts[name], name)

    @staticmethod
    def _read_row(
        row: Any,
        index: int,
        lazy: _LazyTokenizer,
        all_ids: list[list[int]],
        texts: dict[str, list[str]],
    ) -> None:
        if not isinstance(row, Mapping):
            raise TypeError(
                f"Prompts row {index}: expected a JSON object, got {type(row).__name__}"
            )
        if row.get("prompt") is None:
            raise ValueError(f"Prompts row {index}: missing field 'prompt'")
        all_ids.append(prompt_ids(row["prompt"], index, lazy))
        texts["data_source"].append(_metadata_text(row.get("data_source")))
        texts["ground_truth"].append(_metadata_text(_ground_truth(row)))
        texts["extra_info"].append(_metadata_text(row.get("extra_info")))

    def __len__(self) -> int:
        return int(self.arrays["prompt"].shape[0])

    def text(self, field: str, row: int) -> str:
        """Row ``row`` of metadata ``field`` as a string."""
        if field not in METADATA:
            raise KeyError(f"Prompts.text: field must be one of {METADATA}, got {field!r}")
        return decode_text(self.arrays[field][row])

    def rows_without(self, field: str) -> list[int]:
        """Indices of the rows whose metadata ``field`` is empty (or was absent)."""
        if field not in METADATA:
            raise KeyError(f"Prompts.rows_without: field must be one of {METADATA}, got {field!r}")
        return [row for row in range(len(self)) if not self.text(field, row)]

    def check_fields(self, needs: Sequence[str], where: str, reader: str) -> None:
        """Raise ``ValueError`` (``where``: the data key) when a field in ``needs`` is empty
        in some row; ``reader`` names what reads it (the reward)."""
        for field in needs:
            missing = self.rows_without(field)
            if missing:
                nested = " (nor reward_model.ground_truth)" if field == "ground_truth" else ""
                raise ValueError(
                    f"{where}: {len(missing)} of {len(self)} rows have no {field!r}{nested}, "
                    f"first row {missing[0]}; {reader} needs it"
                )

    def load(self, batch: int, val: Prompts | None = None) -> Dataset:
        """A ``Dataset`` of endless training batches of ``batch`` prompts.

        ``val`` (other prompts of the same ``max_prompt_len``) is read once per validation,
        in order; its last batch is completed with empty rows (``prompt_length`` 0, empty
        metadata), which hold no real token.
        """
        if not is_int(batch) or batch < 1:
            raise ValueError(f"Prompts.load: batch must be a positive int, got {batch!r}")
        validation = None
        if val is not None:
            if not isinstance(val, Prompts):
                raise TypeError(f"Prompts.load: val must be Prompts, got {type(val).__name__}")
            if val.max_prompt_len != self.max_prompt_len:
                raise ValueError(
                    f"Prompts.load: val.max_prompt_len must equal {self.max_prompt_len}, "
                    f"got {val.max_prompt_len}"
                )
            filler = {
                "prompt": np.full((self.max_prompt_len,), val.pad_id, np.int32),
                "prompt_length": np.zeros((), np.int32),
                **{name: np.zeros((val.arrays[name].shape[1],), np.int32) for name in METADATA},
            }
            validation = OnePass(val.arrays, filler, batch, owner="Prompts")
        return Dataset(
            train=IndexedStream(
                RowBatches(self.arrays, batch, self.seed, owner="Prompts"), self.loading
            ),
            val=validation,
            records=len(self),
            batch=batch,
            loading=self.loading,
        )
