"""PreferencePairs: reading, validation, padding and the batch stream."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.data import Dataset, Loading, Partition, PreferencePairs

ROWS = [
    {
        "chosen": [1, 2, 3, 5],
        "rejected": [1, 2, 4],
        "chosen_mask": [0, 0, 1, 1],
        "rejected_mask": [0, 0, 1],
    },
    {
        "chosen": [1, 6, 3],
        "rejected": [1, 6, 4, 4, 5],
        "chosen_mask": [0, 1, 1],
        "rejected_mask": [0, 0, 1, 1, 1],
    },
    {"chosen": [7, 3], "rejected": [7, 4]},
]


def records(rows: list[dict]) -> tuple[str, ...]:
    return tuple(json.dumps(row) for row in rows)


def test_records_pad_right_with_zero_mask() -> None:
    pairs = PreferencePairs(records=records(ROWS), seq_len=6, pad_id=9)
    ids, mask = pairs.arrays["input_ids"], pairs.arrays["completion_mask"]
    assert ids.shape == mask.shape == (3, 2, 6)
    assert ids.dtype == mask.dtype == np.int32
    np.testing.assert_array_equal(ids[0, 0], [1, 2, 3, 5, 9, 9])
    np.testing.assert_array_equal(mask[0, 0], [0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(ids[1, 1], [1, 6, 4, 4, 5, 9])
    np.testing.assert_array_equal(mask[1, 1], [0, 0, 1, 1, 1, 0])
    # A missing mask marks every real id as completion; padding stays 0.
    np.testing.assert_array_equal(mask[2, 0], [1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(mask[2, 1], [1, 1, 0, 0, 0, 0])
    assert len(pairs) == 3


def test_parquet_matches_records(tmp_path: Path) -> None:
    table = pa.table(
        {
            "chosen": [row["chosen"] for row in ROWS],
            "rejected": [row["rejected"] for row in ROWS],
            "chosen_mask": [row.get("chosen_mask") for row in ROWS],
            "rejected_mask": [row.get("rejected_mask") for row in ROWS],
            "prompt": ["a", "b", "c"],
        }
    )
    path = tmp_path / "pairs.parquet"
    pq.write_table(table, path)
    from_file = PreferencePairs(path=path, seq_len=6)
    from_records = PreferencePairs(records=records(ROWS), seq_len=6)
    for key in ("input_ids", "completion_mask"):
        np.testing.assert_array_equal(from_file.arrays[key], from_records.arrays[key])


def test_parquet_without_mask_columns(tmp_path: Path) -> None:
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"chosen": [[1, 2]], "rejected": [[1, 3, 4]]}), path)
    pairs = PreferencePairs(path=str(path), seq_len=3)
    np.testing.assert_array_equal(pairs.arrays["completion_mask"][0], [[1, 1, 0], [1, 1, 1]])


def test_parquet_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"chosen": [[1, 2]]}), path)
    with pytest.raises(ValueError, match="missing column 'rejected'"):
        PreferencePairs(path=path, seq_len=3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "exactly one of path= or records="),
        ({"records": records(ROWS), "path": "x.parquet"}, ValueError, "exactly one"),
        ({"records": json.dumps(ROWS[0])}, TypeError, "tuple of JSON strings"),
        ({"records": (ROWS[0],)}, TypeError, r"records\[0\] must be a JSON string"),
        ({"records": ("{not json",)}, ValueError, r"records\[0\] is not valid JSON"),
        ({"records": ("[1, 2]",)}, TypeError, "row 0: expected a JSON object"),
        ({"records": ()}, ValueError, "no rows"),
        ({"records": records(ROWS), "seq_len": 1}, ValueError, "seq_len"),
        ({"records": records(ROWS), "pad_id": -1}, ValueError, "pad_id"),
        ({"records": records(ROWS), "loading": 2}, TypeError, "loading"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    kwargs.setdefault("seq_len", 6)
    with pytest.raises(error, match=match):
        PreferencePairs(**kwargs)


@pytest.mark.parametrize(
    ("row", "error", "match"),
    [
        ({"rejected": [1, 2]}, ValueError, "row 1: missing field 'chosen'"),
        ({"chosen": [1, 2], "rejected": []}, ValueError, "row 1: rejected is empty"),
        ({"chosen": [1, -2], "rejected": [1, 2]}, ValueError, "non-negative"),
        ({"chosen": [1, True], "rejected": [1, 2]}, TypeError, "integer token ids"),
        ({"chosen": [1, 2.0], "rejected": [1, 2]}, TypeError, "integer token ids"),
        ({"chosen": "1 2", "rejected": [1, 2]}, TypeError, "chosen must be a list"),
        (
            {"chosen": [1, 2], "rejected": [1, 2], "chosen_mask": [1]},
            ValueError,
            r"chosen_mask must have one flag per id \(2\), got 1",
        ),
        (
            {"chosen": [1, 2], "rejected": [1, 2], "rejected_mask": [0, 2]},
            ValueError,
            "rejected_mask must hold 0 or 1",
        ),
        (
            {"chosen": [1, 2], "rejected": [1, 2], "rejected_mask": [1, 0]},
            ValueError,
            "rejected_mask marks no completion token after the first id",
        ),
        (
            {"chosen": [1, 2, 3, 4, 5, 6, 7], "rejected": [1, 2]},
            ValueError,
            "row 1: chosen has 7 ids, more than seq_len=6",
        ),
    ],
)
def test_bad_rows_name_their_index(row: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        PreferencePairs(records=records([ROWS[0], row]), seq_len=6)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 50), min_size=2, max_size=8),
            st.lists(st.integers(0, 50), min_size=2, max_size=8),
            st.integers(1, 7),
            st.integers(1, 7),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_rows_round_trip(raw: list[tuple[list[int], list[int], int, int]]) -> None:
    rows = []
    for chosen, rejected, cut_c, cut_r in raw:
        cut_c, cut_r = min(cut_c, len(chosen) - 1), min(cut_r, len(rejected) - 1)
        rows.append(
            {
                "chosen": chosen,
                "rejected": rejected,
                "chosen_mask": [0] * cut_c + [1] * (len(chosen) - cut_c),
                "rejected_mask": [0] * cut_r + [1] * (len(rejected) - cut_r),
            }
        )
    pairs = PreferencePairs(records=records(rows), seq_len=8, pad_id=99)
    for index, row in enumerate(rows):
        for side, name in enumerate(("chosen", "rejected")):
            length = len(row[name])
            ids = pairs.arrays["input_ids"][index, side]
            mask = pairs.arrays["completion_mask"][index, side]
            assert ids[:length].tolist() == row[name]
            assert mask[:length].tolist() == row[f"{name}_mask"]
            assert np.all(ids[length:] == 99) and np.all(mask[length:] == 0)


def _stream(data: Dataset, partition: Partition | None = None, count: int = 4) -> list[dict]:
    return list(itertools.islice(data.stream(partition or Partition()), count))


def test_load_cycles_in_file_order() -> None:
    rows = [{"chosen": [i, i + 1], "rejected": [i, i + 2]} for i in range(5)]
    pairs = PreferencePairs(records=records(rows), seq_len=3, loading=Loading(threads=1))
    data = pairs.load(batch=2)
    assert isinstance(data, Dataset) and data.records == 5 and data.batch == 2
    firsts = [batch["input_ids"][:, 0, 0].tolist() for batch in _stream(data, count=4)]
    assert firsts == [[0, 1], [2, 3], [4, 0], [1, 2]]
    batch = _stream(data, count=1)[0]
    assert batch["input_ids"].shape == batch["completion_mask"].shape == (2, 2, 3)


def test_load_resumes_at_a_position() -> None:
    rows = [{"chosen": [i, i + 1], "rejected": [i, i + 2]} for i in range(5)]
    data = PreferencePairs(records=records(rows), seq_len=3, seed=3).load(batch=2)
    whole = list(itertools.islice(data.stream(Partition()), 6))
    later = list(itertools.islice(data.stream(Partition(), start=4), 2))
    for a, b in zip(whole[4:], later, strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_seeded_epochs_are_permutations() -> None:
    rows = [{"chosen": [i, 1], "rejected": [i, 2]} for i in range(6)]
    data = PreferencePairs(records=records(rows), seq_len=2, seed=7).load(batch=3)
    again = PreferencePairs(records=records(rows), seq_len=2, seed=7).load(batch=3)
    firsts = [b["input_ids"][:, 0, 0] for b in _stream(data, count=4)]
    epochs = [np.concatenate(firsts[:2]), np.concatenate(firsts[2:])]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(6))
    assert epochs[0].tolist() != epochs[1].tolist()
    for a, b in zip(_stream(data, count=4), _stream(again, count=4), strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_partitions_split_each_global_batch() -> None:
    rows = [{"chosen": [i, 1], "rejected": [i, 2]} for i in range(8)]
    data = PreferencePairs(records=records(rows), seq_len=2).load(batch=4)
    whole = _stream(data, count=3)
    parts = [_stream(data, Partition(index, 2), count=3) for index in range(2)]
    for step in range(3):
        joined = np.concatenate([parts[0][step]["input_ids"], parts[1][step]["input_ids"]])
        np.testing.assert_array_equal(joined, whole[step]["input_ids"])
    with pytest.raises(ValueError, match="do not split over 3 processes"):
        _stream(data, Partition(0, 3), count=1)


def test_worker_processes_give_the_same_batches() -> None:
    rows = [{"chosen": [i, 1], "rejected": [i, 2]} for i in range(5)]
    plain = PreferencePairs(records=records(rows), seq_len=2, seed=1).load(batch=2)
    workers = PreferencePairs(
        records=records(rows), seq_len=2, seed=1, loading=Loading(workers=1, read_buffer=2)
    ).load(batch=2)
    for a, b in zip(_stream(plain, count=3), _stream(workers, count=3), strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_validation_pass_pads_with_empty_rows() -> None:
    train = PreferencePairs(records=records(ROWS), seq_len=6)
    val = PreferencePairs(records=records(ROWS), seq_len=6, pad_id=0)
    data = train.load(batch=2, val=val)
    batches = list(data.validation(Partition()))
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[0]["input_ids"], val.arrays["input_ids"][:2])
    last = batches[1]
    np.testing.assert_array_equal(last["input_ids"][0], val.arrays["input_ids"][2])
    assert np.all(last["completion_mask"][1] == 0) and np.all(last["input_ids"][1] == 0)
    with pytest.raises(ValueError, match="val.seq_len must equal 6"):
        train.load(batch=2, val=PreferencePairs(records=records(ROWS), seq_len=7))
    with pytest.raises(ValueError, match="batch must be a positive int"):
        train.load(batch=0)
