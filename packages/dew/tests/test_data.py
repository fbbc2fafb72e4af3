"""Dataset, Loading and token files."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.data import Dataset, Loading, Partition, TokenFile, open_tokens, write_tokens
from dew.data.tokens import segments


@given(st.lists(st.integers(0, 5), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None)
def test_segments_restart_after_eos(row):
    row = np.array(row)
    seg, pos = segments(row, eos_id=0)
    assert seg[0] == 1 and pos[0] == 0
    for i in range(1, len(row)):
        if row[i - 1] == 0:
            assert seg[i] == seg[i - 1] + 1 and pos[i] == 0
        else:
            assert seg[i] == seg[i - 1] and pos[i] == pos[i - 1] + 1
    seg, pos = segments(row, eos_id=None)
    assert (seg == 1).all() and pos.tolist() == list(range(len(row)))


@pytest.mark.parametrize("suffix", [".bin", ".npy"])
def test_token_file_rows(tmp_path, suffix):
    ids = np.arange(1, 10 * 9 + 5) % 50  # 10 windows of 9 plus a dropped tail
    path = write_tokens(tmp_path / f"t{suffix}", ids)
    assert open_tokens(path).tolist() == ids.tolist()
    data = TokenFile(path, seq_len=8, eos_id=0, shuffle=False).load(batch=2)
    assert data.records == 10
    first = next(data.stream(Partition()))
    np.testing.assert_array_equal(first["text"], ids[:18].reshape(2, 9))
    assert first["text"].dtype == np.int32 and first["text_segment_ids"].shape == (2, 9)
    # one epoch covers every window exactly once, shuffled by seed
    shuffled = TokenFile(path, seq_len=8, seed=4).load(batch=2)
    epoch = list(itertools.islice(shuffled.stream(Partition()), 5))
    rows = sorted(tuple(r) for b in epoch for r in b["text"].tolist())
    assert rows == sorted(tuple(r) for r in ids[:90].reshape(10, 9).tolist())
    again = list(itertools.islice(shuffled.stream(Partition()), 7))
    for a, b in zip(epoch, again):
        np.testing.assert_array_equal(a["text"], b["text"])
    assert not np.array_equal(again[5]["text"], again[0]["text"])  # epoch 2 is reshuffled
    # resuming seeks; partitions split each global batch
    np.testing.assert_array_equal(
        next(shuffled.stream(Partition(), start=3))["text"], epoch[3]["text"]
    )
    halves = [next(shuffled.stream(Partition(i, 2), start=3))["text"] for i in range(2)]
    np.testing.assert_array_equal(np.concatenate(halves), epoch[3]["text"])


def test_worker_processes_and_threads_agree(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.random.default_rng(0).integers(0, 100, 3000))
    base = list(itertools.islice(TokenFile(path, 15, seed=1).load(4).stream(Partition()), 12))
    for loading in (Loading(workers=2, read_buffer=3), Loading(threads=3, read_buffer=4)):
        got = list(itertools.islice(TokenFile(path, 15, seed=1, loading=loading).load(4).stream(Partition()), 12))  # fmt: skip
        for a, b in zip(base, got):
            np.testing.assert_array_equal(a["text"], b["text"])


def test_token_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        TokenFile(str(tmp_path / "missing.bin"), 8).load(2)
    path = write_tokens(tmp_path / "short.bin", np.arange(20))
    with pytest.raises(ValueError, match="fewer than one batch of 4"):
        TokenFile(path, 8).load(4)
    with pytest.raises(ValueError, match="1-D integer"):
        write_tokens(tmp_path / "x.bin", np.zeros((2, 2)))


def test_dataset_checks_rows_and_resumes_plain_iterators():
    def train(partition):
        for i in itertools.count():
            yield {"x": np.full((4,), i)}

    data = Dataset(train=train, batch=4, loading=Loading(read_buffer=3))
    assert next(data.stream(Partition(), start=5))["x"][0] == 5  # skipped ahead
    with pytest.raises(ValueError, match=r"field 'x' has 4 rows, expected 2"):
        next(data.stream(Partition(0, 2)))

    def broken(partition):
        yield {"x": np.zeros(4)}
        raise OSError("disk gone")

    it = Dataset(train=broken, batch=4).stream(Partition())
    next(it)
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    with pytest.raises(ValueError, match="Loading.read_buffer"):
        Loading(read_buffer=0)
    with pytest.raises(ValueError, match="index < count"):
        Partition(2, 2)
    with pytest.raises(TypeError, match="Dataset.train"):
        Dataset(train=None)  # type: ignore[arg-type]
