"""Prompts: token-id, string and message prompts, verl's parquet layout, metadata bytes,
truncation, refusals and the batch stream."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _chat_tokenizer import build_tokenizer

from dew.data import Dataset, Partition
from dew.data.chat.template import ChatTokenizer
from dew.data.prompts import Prompts, decode_text, encode_text


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_tokenizer(str(tmp_path_factory.mktemp("tokenizer")))


def records(rows: list[dict]) -> tuple[str, ...]:
    return tuple(json.dumps(row) for row in rows)


def test_token_ids_left_pad_without_loading_a_tokenizer() -> None:
    rows = [
        {"prompt": [5, 6, 7], "data_source": "toy", "ground_truth": "3", "extra_info": {"i": 0}},
        {"prompt": [8], "ground_truth": 4},
    ]
    # The tokenizer path does not exist: token-id prompts must never try to load it.
    prompts = Prompts(records=records(rows), tokenizer="/no/such/tokenizer", max_prompt_len=4)
    assert prompts.tokenizer is None
    np.testing.assert_array_equal(prompts.arrays["prompt"], [[0, 5, 6, 7], [0, 0, 0, 8]])
    np.testing.assert_array_equal(prompts.arrays["prompt_length"], [3, 1])
    assert prompts.arrays["prompt"].dtype == np.int32
    assert [prompts.text("data_source", i) for i in range(2)] == ["toy", ""]
    assert [prompts.text("ground_truth", i) for i in range(2)] == ["3", "4"]
    assert [prompts.text("extra_info", i) for i in range(2)] == ['{"i": 0}', ""]


def test_strings_and_messages_use_the_tokenizer(tokenizer_dir: str) -> None:
    chat = ChatTokenizer.load(tokenizer_dir)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is two plus two?"},
    ]
    rows = [{"prompt": "Tom had a red ball."}, {"prompt": messages}, {"prompt": [1, 2]}]
    prompts = Prompts(records=records(rows), tokenizer=tokenizer_dir, max_prompt_len=40)
    string_ids = chat.encode("Tom had a red ball.")
    message_ids = chat.encode(chat.render(messages, add_generation_prompt=True))
    assert chat.decode(message_ids).endswith("<|im_start|>assistant\n")
    for row, ids in enumerate((string_ids, message_ids, [1, 2])):
        length = int(prompts.arrays["prompt_length"][row])
        assert length == len(ids)
        assert prompts.arrays["prompt"][row, 40 - length :].tolist() == ids
    # The tokenizer's pad token is the default padding.
    assert prompts.pad_id == chat.pad_id and chat.pad_id is not None
    assert prompts.arrays["prompt"][0, 0] == chat.pad_id
    # A ready tokenizer object works too and gives the same arrays.
    again = Prompts(records=records(rows), tokenizer=chat, max_prompt_len=40)
    np.testing.assert_array_equal(again.arrays["prompt"], prompts.arrays["prompt"])


def test_verl_parquet_layout(tmp_path: Path, tokenizer_dir: str) -> None:
    tools_kwargs = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    rows = [
        {
            "data_source": "openai/gsm8k",
            "agent_name": "tool_agent",
            "prompt": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is two plus two?"},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "72"},
            "extra_info": {
                "split": "train",
                "index": 0,
                "need_tools_kwargs": True,
                "tools_kwargs": tools_kwargs,
            },
        },
        {
            "data_source": "openai/gsm8k",
            "agent_name": "tool_agent",
            "prompt": [{"role": "user", "content": "Weather in Paris?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "10"},
            "extra_info": {
                "split": "train",
                "index": 1,
                "need_tools_kwargs": True,
                "tools_kwargs": tools_kwargs,
            },
        },
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    prompts = Prompts(path=path, tokenizer=tokenizer_dir, max_prompt_len=64)
    assert set(prompts.arrays) == {
        "prompt",
        "prompt_length",
        "data_source",
        "ground_truth",
        "extra_info",
    }
    assert prompts.text("ground_truth", 0) == "72"
    assert prompts.text("ground_truth", 1) == "10"
    assert prompts.text("data_source", 1) == "openai/gsm8k"
    extra = json.loads(prompts.text("extra_info", 0))
    assert extra["tools_kwargs"] == tools_kwargs and extra["index"] == 0
    assert "ability" not in extra and "agent_name" not in extra
    # The same rows as JSON lines read identically.
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    from_jsonl = Prompts(path=str(jsonl), tokenizer=tokenizer_dir, max_prompt_len=64)
    for name in ("prompt", "prompt_length", "ground_truth"):
        np.testing.assert_array_equal(from_jsonl.arrays[name], prompts.arrays[name])


def test_top_level_ground_truth_wins() -> None:
    row = {"prompt": [1], "ground_truth": "a", "reward_model": {"ground_truth": "b"}}
    assert Prompts(records=records([row]), max_prompt_len=2).text("ground_truth", 0) == "a"


def test_long_prompts_keep_their_end() -> None:
    rows = [{"prompt": list(range(1, 8))}, {"prompt": [9, 9]}]
    with pytest.warns(UserWarning, match="1 of 2 prompts were longer than max_prompt_len=3"):
        prompts = Prompts(records=records(rows), max_prompt_len=3)
    assert prompts.truncated == 1
    np.testing.assert_array_equal(prompts.arrays["prompt"], [[5, 6, 7], [0, 9, 9]])
    np.testing.assert_array_equal(prompts.arrays["prompt_length"], [3, 2])


def test_metadata_bytes_round_trip() -> None:
    values = ["", "π ≈ 3.14", "dog", '{"a": [1, 2]}']
    array = encode_text(values, "ground_truth")
    assert array.dtype == np.int32 and array.shape == (4, max(len(v.encode()) for v in values))
    assert [decode_text(row) for row in array] == values
    assert encode_text([], "x").shape == (0, 0)
    rows = [{"prompt": [1], "ground_truth": [1, "two"], "extra_info": {"unit": "€"}}]
    prompts = Prompts(records=records(rows), max_prompt_len=1)
    assert prompts.text("ground_truth", 0) == '[1, "two"]'
    assert prompts.text("extra_info", 0) == '{"unit": "€"}'
    with pytest.raises(ValueError, match="must lie in"):
        decode_text(np.array([300]))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "exactly one of path= or records="),
        ({"records": ('{"prompt": [1]}',), "path": "x.parquet"}, ValueError, "exactly one"),
        ({"records": '{"prompt": [1]}'}, TypeError, "tuple of JSON strings"),
        ({"records": ("{bad",)}, ValueError, r"records\[0\] is not valid JSON"),
        ({"records": ()}, ValueError, "no rows"),
        ({"records": ('{"prompt": [1]}',), "max_prompt_len": 0}, ValueError, "max_prompt_len"),
        ({"records": ('{"prompt": [1]}',), "pad_id": -2}, ValueError, "pad_id"),
        ({"records": ('{"prompt": [1]}',), "tokenizer": 3.5}, None, None),
    ],
)
def test_bad_arguments(kwargs: dict, error: type[Exception] | None, match: str | None) -> None:
    kwargs.setdefault("max_prompt_len", 4)
    if error is None:  # a bad tokenizer is only an error once a row needs it
        assert len(Prompts(**kwargs)) == 1
        return
    with pytest.raises(error, match=match):
        Prompts(**kwargs)


@pytest.mark.parametrize(
    ("row", "error", "match"),
    [
        ({"data_source": "x"}, ValueError, "row 1: missing field 'prompt'"),
        ({"prompt": []}, ValueError, "row 1: prompt is empty"),
        ({"prompt": [1, -3]}, ValueError, "row 1: prompt holds a negative token id"),
        ({"prompt": [True, 2]}, TypeError, "row 1: prompt must be token ids"),
        ({"prompt": [{"content": "hi"}]}, TypeError, "row 1: prompt must be token ids"),
        ({"prompt": 12}, TypeError, "row 1: prompt must be token ids"),
        ({"prompt": "hello"}, ValueError, "row 1: prompt is a string, which needs tokenizer="),
        (
            {"prompt": [{"role": "user", "content": "hi"}]},
            ValueError,
            "row 1: prompt is a list of messages, which needs tokenizer=",
        ),
        ({"prompt": [1], "ground_truth": "a\x00b"}, ValueError, "ground_truth holds a NUL"),
        ("[1]", TypeError, "row 1: expected a JSON object"),
    ],
)
def test_bad_rows_name_their_index(row: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Prompts(records=(json.dumps({"prompt": [1]}), json.dumps(row)), max_prompt_len=4)


def test_string_prompt_with_an_unusable_tokenizer() -> None:
    with pytest.raises(TypeError, match="Prompts.tokenizer: expected a tokenizer directory"):
        Prompts(records=(json.dumps({"prompt": "hi"}),), tokenizer=3.5, max_prompt_len=4)


def test_load_streams_batches_and_validation() -> None:
    rows = [{"prompt": [i + 1] * (i % 3 + 1), "ground_truth": str(i)} for i in range(5)]
    prompts = Prompts(records=records(rows), max_prompt_len=3)
    data = prompts.load(batch=2, val=prompts)
    assert isinstance(data, Dataset) and data.records == 5
    batches = list(itertools.islice(data.stream(Partition()), 3))
    assert [b["prompt"][:, -1].tolist() for b in batches] == [[1, 2], [3, 4], [5, 1]]
    assert batches[0]["prompt_length"].tolist() == [1, 2]
    assert batches[0]["ground_truth"].shape == (2, 1)
    halves = [next(iter(data.stream(Partition(i, 2)))) for i in range(2)]
    assert [h["prompt"][0, -1] for h in halves] == [1, 2]
    val = list(data.validation(Partition()))
    assert len(val) == 3
    last = val[-1]
    assert last["prompt_length"].tolist() == [2, 0]
    assert (
        decode_text(last["ground_truth"][0]) == "4" and decode_text(last["ground_truth"][1]) == ""
    )
    with pytest.raises(ValueError, match="val.max_prompt_len must equal 3"):
        prompts.load(batch=2, val=Prompts(records=records(rows), max_prompt_len=4))
