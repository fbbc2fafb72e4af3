"""ChatMessages: conversations from Parquet, JSONL or the Hub, packed into SFT rows.

``ChatMessages(path, tokenizer, seq_len).load(batch=B)`` returns a ``Dataset`` whose batches
hold ``text``, ``text_roles``, ``text_segment_ids`` and ``text_positions``, each
``[B / processes, seq_len + 1]``.

Reading: ``path`` is a ``.parquet`` file, a ``.jsonl`` file (one JSON object a line) or,
when it is neither an existing file nor ends in those suffixes, a Hub dataset id read with
``datasets.load_dataset(path, split=split, **options)`` (needs the ``hf`` extra). Each row's
messages are in ``column`` (default ``messages``) or, when the row has no such field, in
``prompt`` (verl's layout). An optional ``tools`` field holds the tool schemas (a list, or a
JSON string of one) and is passed to the template with the messages; tool calls
(``tool_calls``) and tool messages pass through unchanged.

Checks, each raising with the file and row: malformed JSON, a missing messages column, an
empty conversation, a message that is not an object, an unknown role, content that is
neither a string nor null, a conversation whose first message is neither a system nor a user
message (an assistant or a tool message), and a rendered conversation longer than
``seq_len + 1`` tokens.

Packing: conversations (shuffled per epoch by ``seed`` unless ``shuffle=False``) are placed
one after another into rows of ``seq_len + 1`` tokens; a conversation that does not fit in
what is left of a row starts the next row. Each conversation gets its own segment id (from 1)
and positions from 0; the rest of a row is padding (``pad_id``, role ``NONE``, segment 0).
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dew.data.chat.render import render_roles
from dew.data.chat.roles import Role
from dew.data.chat.template import ChatTokenizer, load_chat_tokenizer
from dew.data.dataset import Dataset, IndexedStream, Loading, Partition

Row = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def _strip_nulls(value: Any) -> Any:
    """Parquet gives every struct field of a list of structs; drop the absent (null) ones."""
    if isinstance(value, Mapping):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def read_labeled_rows(
    path: str, split: str = "train", options: Mapping[str, Any] | None = None
) -> tuple[str, list[Any], list[str]]:
    """``(name for errors, raw rows, a label per row)`` of a JSONL or Parquet file or a Hub
    dataset. A JSONL row's label is its line in the file (``line 3``, counting from 1, blank
    lines counted and skipped); a Parquet or Hub row's is its index (``row 0``).

    A missing local file (a path ending in ``.jsonl``/``.json``/``.parquet``, or starting
    with ``.`` or ``/``) raises ``FileNotFoundError``; anything else that is not a file is
    read as a Hub dataset id. Text that is not UTF-8 names the line and byte.
    """
    local_like = path.endswith((".jsonl", ".json", ".parquet")) or path.startswith((".", "/"))
    if not os.path.isfile(path) and local_like:
        raise FileNotFoundError(f"path: no such file {path!r}")
    if os.path.isfile(path) and not path.endswith(".parquet"):
        rows: list[Any] = []
        labels: list[str] = []
        with open(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ValueError(
                        f"{path}: line {number}: not UTF-8 text (byte {err.start} of the line)"
                    ) from None
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}: line {number}: malformed JSON ({err.msg})") from None
                labels.append(f"line {number}")
        return path, rows, labels
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = [_strip_nulls(r) for r in pq.read_table(path).to_pylist()]
        return path, table, [f"row {i}" for i in range(len(table))]
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as err:
        raise ImportError(
            f"path {path!r} is not a local .jsonl or .parquet file; reading it as a Hub dataset "
            "needs the optional 'hf' extra (pip install 'dew[hf]')"
        ) from err
    ds = datasets.load_dataset(path, split=split, **dict(options or {}))
    hub = [_strip_nulls(r) for r in ds]
    return f"{path}[{split}]", hub, [f"row {i}" for i in range(len(hub))]


def read_rows(
    path: str, split: str = "train", options: Mapping[str, Any] | None = None
) -> tuple[str, list[Any]]:
    """``(name for errors, list of raw rows)``: ``read_labeled_rows`` without the labels."""
    name, rows, _ = read_labeled_rows(path, split, options)
    return name, rows


def conversation(raw: Any, column: str, where: str) -> Row:
    """Validated ``(messages, tools)`` of one raw row."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if column in raw:
        messages = raw[column]
    elif "prompt" in raw:
        messages = raw["prompt"]
    else:
        raise ValueError(
            f"{where}: no {column!r} column (nor verl's 'prompt'); the row has {sorted(raw)}"
        )
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError:
            raise ValueError(
                f"{where}: {column!r} is a string, expected a list of messages"
            ) from None
    if not isinstance(messages, list):
        raise ValueError(
            f"{where}: {column!r} should be a list of messages, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError(f"{where}: empty conversation")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"{where}: message {k} should be an object, got {type(m).__name__}")
        if "role" not in m:
            raise ValueError(f"{where}: message {k} has no 'role'")
        try:
            Role.parse(m["role"], where=f"{where}: message {k} role")
        except TypeError as err:
            raise ValueError(str(err)) from None
        content = m.get("content")
        if content is None and not m.get("tool_calls"):
            raise ValueError(
                f"{where}: message {k} content is null (or missing); expected a string (only "
                "an assistant message with tool_calls may leave it empty)"
            )
        if content is not None and not isinstance(content, str):
            raise ValueError(
                f"{where}: message {k} content should be a string, got {type(content).__name__}"
            )
        out.append(dict(m))
    first = Role.parse(out[0]["role"])
    if first not in (Role.SYSTEM, Role.USER):
        raise ValueError(
            f"{where}: the conversation starts with a{'n' if first is Role.ASSISTANT else ''} "
            f"{first.name.lower()} message (role {out[0]['role']!r}); expected system or user"
        )
    tools = raw.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise ValueError(f"{where}: 'tools' is not valid JSON") from None
    if tools is not None and not isinstance(tools, list):
        raise ValueError(
            f"{where}: 'tools' should be a list of schemas, got {type(tools).__name__}"
        )
    return out, tools or None


def packed_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """The documents (by index) of each row that ``pack`` fills from documents of ``lengths``
    tokens, in order: a document that does not fit in what is left of a row starts the next.
    Reads only the lengths, so counting an epoch's rows costs no array."""
    rows: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, length in enumerate(lengths):
        if length > width:
            raise ValueError(f"document {i}: {length} tokens exceed the row width {width}")
        if used + length > width:
            rows.append(current)
            current, used = [], 0
        current.append(i)
        used += length
    if current:
        rows.append(current)
    return rows


def pack(
    docs: Sequence[tuple[np.ndarray, np.ndarray]], width: int, pad_id: int
) -> dict[str, np.ndarray]:
    """Pack ``(ids, roles)`` documents in order into rows of ``width``; see the module doc."""
    rows = packed_rows([len(ids) for ids, _ in docs], width)
    n = len(rows)
    text = np.full((n, width), pad_id, np.int32)
    roles = np.zeros((n, width), np.int8)
    seg = np.zeros((n, width), np.int32)
    pos = np.zeros((n, width), np.int32)
    for r, members in enumerate(rows):
        at = 0
        for s, i in enumerate(members, start=1):
            ids, rl = docs[i]
            text[r, at : at + len(ids)] = ids
            roles[r, at : at + len(ids)] = rl
            seg[r, at : at + len(ids)] = s
            pos[r, at : at + len(ids)] = np.arange(len(ids))
            at += len(ids)
    return {"text": text, "text_roles": roles, "text_segment_ids": seg, "text_positions": pos}


@dataclass
class _ChatSource:
    """The packed batches of every epoch, one after another.

    Each epoch is its own shuffle, so its packing (and its count of rows) differs from the
    others'. ``batch_at`` finds an index's epoch from the cumulative batch counts, each
    counted once from the documents' lengths (``packed_rows``), and packs only that epoch
    (the one epoch kept in memory): a batch costs the same at step 10 and at step 10,000.
    """

    docs: list[tuple[np.ndarray, np.ndarray]]
    width: int
    batch: int
    pad_id: int
    seed: int
    shuffle: bool
    epochs: int | None
    _cache: dict[int, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    #: ``_ends[e]``: the batches of epochs ``0..e`` together.
    _ends: list[int] = field(default_factory=list, repr=False)

    def order(self, epoch: int) -> np.ndarray:
        """The documents of ``epoch`` in their packing order."""
        if not self.shuffle:
            return np.arange(len(self.docs))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.docs))

    def rows(self, epoch: int) -> dict[str, np.ndarray]:
        if epoch not in self._cache:
            order = self.order(epoch)
            self._cache.clear()
            self._cache[epoch] = pack([self.docs[i] for i in order], self.width, self.pad_id)
        return self._cache[epoch]

    def batches_in(self, epoch: int) -> int:
        """Whole batches in ``epoch``'s packing (its last partial batch is dropped)."""
        order = self.order(epoch)
        rows = len(packed_rows([len(self.docs[i][0]) for i in order], self.width))
        if rows < self.batch:
            raise ValueError(
                f"ChatMessages: {rows} packed rows, fewer than one batch of {self.batch}"
            )
        return rows // self.batch

    def _count_next_epoch(self) -> None:
        """Append the next epoch's cumulative batch count to ``_ends``."""
        before = self._ends[-1] if self._ends else 0
        self._ends.append(before + self.batches_in(len(self._ends)))

    def epoch_of(self, index: int) -> tuple[int, int]:
        """``(epoch, index within it)`` of the ``index``-th batch."""
        while not self._ends or self._ends[-1] <= index:
            self._count_next_epoch()
        epoch = bisect.bisect_right(self._ends, index)
        return epoch, index - (self._ends[epoch - 1] if epoch else 0)

    def num_batches(self, partition: Partition) -> int | None:
        if self.epochs is None:
            return None
        while len(self._ends) < self.epochs:
            self._count_next_epoch()
        return self._ends[self.epochs - 1] if self.epochs else 0

    def batch_at(self, partition: Partition, index: int) -> dict[str, np.ndarray]:
        epoch, index = self.epoch_of(index)
        rows = self.rows(epoch)
        local = self.batch // partition.count
        lo = index * self.batch + partition.index * local
        return {k: v[lo : lo + local] for k, v in rows.items()}


@dataclass(frozen=True)
class ChatMessages:
    """Conversations for SFT (see the module docstring).

    Args:
      path: a ``.parquet`` or ``.jsonl`` file, or a Hub dataset id (``hf`` extra).
      tokenizer: a local tokenizer directory (``tokenizer.json`` + ``tokenizer_config.json``
        with a chat template), a Hub name (``hf`` extra) or a ``ChatTokenizer``.
      seq_len: ``L``; rows hold ``L + 1`` tokens.
      column: the messages column (rows without it are read from ``prompt``).
      split, options: the Hub split and ``datasets.load_dataset`` keyword arguments.
      val_path: a separate file of validation conversations.
      pad_id: padding id (default: the tokenizer's pad token, else 0).
    """

    path: str
    tokenizer: Any
    seq_len: int
    column: str = "messages"
    split: str = "train"
    options: Mapping[str, Any] | None = None
    val_path: str | None = None
    pad_id: int | None = None
    seed: int = 0
    shuffle: bool = True
    epochs: int | None = None
    loading: Loading = Loading()

    def chat_tokenizer(self) -> ChatTokenizer:
        tok = self.tokenizer
        if isinstance(tok, ChatTokenizer):
            return tok
        return load_chat_tokenizer(tok)

    def encode(self, path: str, tokenizer: ChatTokenizer) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every conversation of ``path`` as ``(ids, roles)``, checked against the row width."""
        name, raw_rows, labels = read_labeled_rows(path, self.split, self.options)
        width = self.seq_len + 1
        docs = []
        for i, raw in enumerate(raw_rows):
            where = f"{name}: {labels[i]}"
            messages, tools = conversation(raw, self.column, where)
            ids, roles = render_roles(tokenizer, messages, tools, where=where)
            if len(ids) > width:
                raise ValueError(
                    f"{where}: the conversation renders to {len(ids)} tokens, more than a row of "
                    f"seq_len + 1 = {width}"
                )
            docs.append((ids, roles))
        if not docs:
            raise ValueError(f"{name}: no conversations")
        return docs

    def load(self, batch: int) -> Dataset:
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch: expected a positive integer, got {batch!r}")
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ValueError(f"seq_len: expected a positive integer, got {self.seq_len!r}")
        tokenizer = self.chat_tokenizer()
        pad = self.pad_id if self.pad_id is not None else (tokenizer.pad_id or 0)
        width = self.seq_len + 1
        docs = self.encode(os.fspath(self.path), tokenizer)
        source = _ChatSource(docs, width, batch, pad, self.seed, self.shuffle, self.epochs)
        source.batch_at(Partition(), 0)  # fail early when there is not one batch
        val = None
        if self.val_path is not None:
            vdocs = self.encode(os.fspath(self.val_path), tokenizer)
            vrows = pack(vdocs, width, pad)
            short = -len(vrows["text"]) % batch  # pad the last batch with empty rows
            vrows = {
                k: np.concatenate([v, np.full((short, width), pad if k == "text" else 0, v.dtype)])
                for k, v in vrows.items()
            }

            def val(partition: Partition):
                local = batch // partition.count
                for i in range(len(vrows["text"]) // batch):
                    lo = i * batch + partition.index * local
                    yield {k: v[lo : lo + local] for k, v in vrows.items()}

        return Dataset(
            train=IndexedStream(source, self.loading),
            val=val,
            records=len(docs),
            batch=batch,
            loading=self.loading,
        )
