"""tools/audit_template.py on tokenizers built here around the real Qwen3 and Llama 3.1 chat
templates (``tests/fixtures/chat_templates/``, copied from TRL 1.16.0; see the README there),
and on recorded traces."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "audit_template.py"
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"

spec = importlib.util.spec_from_file_location("audit_template", TOOL)
assert spec is not None and spec.loader is not None
audit_template = importlib.util.module_from_spec(spec)
sys.modules["audit_template"] = audit_template  # dataclasses look their module up by name
spec.loader.exec_module(audit_template)


def _build(directory: Path, template: str, special: list[str], config: dict[str, str]) -> str:
    """A byte-level BPE trained on the template text, with the family's special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [template, "What is 12 times 7? Let me compute it. multiply 84 The tool"] * 3
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    directory.mkdir(parents=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"chat_template": template, **config}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return str(directory)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> str:
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    special += ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    return _build(
        tmp_path_factory.mktemp("qwen3") / "tok",
        (TEMPLATES / "qwen3.jinja").read_text(),
        special,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> str:
    special = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    special += ["<|eom_id|>", "<|python_tag|>"]
    return _build(
        tmp_path_factory.mktemp("llama3") / "tok",
        (TEMPLATES / "llama3_1.jinja").read_text(),
        special,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    )


def _table(out: str) -> dict[tuple[str, str, str], dict[str, str]]:
    """The printed table as {(reasoning, observation, arguments): {merges, calls, where}}."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("reasoning")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith(("yes ", "no ")):
            break
        reasoning, observation, arguments, merges, calls, where = line.split(maxsplit=5)
        rows[(reasoning, observation, arguments)] = {
            "merges": merges,
            "calls": calls,
            "where": where,
        }
    return rows


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = audit_template.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_qwen3_only_reasoning_with_tool_role_observations_merges(
    qwen3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["template", "--tokenizer", qwen3], capsys)
    assert code == 0
    rows = _table(out)
    assert len(rows) == 14
    merged = {key for key, row in rows.items() if row["merges"] == "yes"}
    # Qwen3 keeps <think> in history only after the last user query and only when the turn
    # has reasoning; a tool-role result keeps that query, a user-role one replaces it.
    assert merged == {("yes", "tool", "object"), ("yes", "tool", "string")}
    assert all(rows[key]["calls"] == "2" for key in merged)
    # a turn without reasoning is sampled after an empty think block that history drops
    assert "'<think>\\n\\n</think>" in rows[("no", "tool", "object")]["where"]
    # compact tool-call JSON comes back re-serialized with spaces
    compact = rows[("yes", "tool", "compact")]
    assert compact["merges"] == "no" and '"b": 7' in compact["where"]
    # user-role observations drop the reasoning from history
    assert "'<think>\\nThe user wants" in rows[("yes", "user", "object")]["where"]
    assert "2 of 14 kinds of turn keep the history append-only" in out


def test_llama3_splits_only_on_re_serialized_arguments(
    llama3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["template", "--tokenizer", llama3], capsys)
    assert code == 0
    rows = _table(out)
    split = {key for key, row in rows.items() if row["merges"] == "no"}
    # Llama 3.1 writes history turns the way it writes a final turn (it has no reasoning
    # syntax), and writes arguments with tojson: a call sampled as compact JSON and sent back
    # parsed comes back with spaces.
    assert split == {key for key in rows if key[2] == "compact"}
    assert all('{"a": 12, "b": 7}' in rows[key]["where"] for key in split)
    assert "'<|eot_id|>'" in out.splitlines()[0]


def _traces(path: Path, records: list[Any]) -> str:
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records))
    return str(path)


def test_sessions_counts_calls_per_chain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def trace(session: str, prompt: list[int], completion: list[int]) -> dict[str, Any]:
        return {
            "trace_id": f"{session}-{len(prompt)}",
            "session_id": session,
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "logprobs": [-0.5] * len(completion),
            "finish_reason": "stop",
        }

    records = [
        trace("a", [1, 2], [3, 4]),
        trace("b", [9, 9], [5]),
        trace("a", [1, 2, 3, 4, 7], [8]),  # extends a's chain
        trace("b", [9, 8], [6]),  # a prompt-only prefix: a new chain
        trace("a", [1, 2, 3, 4, 7, 8, 0], [2]),  # extends again
    ]
    path = _traces(tmp_path / "traces.jsonl", records)
    code, out, _ = _run(["sessions", path], capsys)
    assert code == 0
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:]}
    assert lines["a"] == ["3", "1", "3.00"]
    assert lines["b"] == ["2", "2", "1.00"]
    assert lines["all"] == ["5", "3", "1.67"]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (
            [{"session_id": "a", "prompt_token_ids": [1], "completion_token_ids": []}, "{oops\n"],
            "traces.jsonl:2: not a JSON line (Expecting property name enclosed in double quotes)",
        ),
        (
            ["\n", {"session_id": "a", "completion_token_ids": [1]}],
            "traces.jsonl:2: missing field 'prompt_token_ids' (or prompt_ids)",
        ),
        (
            [{"session_id": "a", "prompt_token_ids": [-1], "completion_token_ids": [1]}],
            "traces.jsonl:1: Call.prompt_ids[0]: expected a nonnegative id, got -1",
        ),
        (["[1, 2]\n"], "traces.jsonl:1: expected a JSON object, got list"),
        ([], "traces.jsonl: no trace records"),
    ],
)
def test_bad_traces_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], records: list[Any], message: str
) -> None:
    path = _traces(tmp_path / "traces.jsonl", records)
    code, out, err = _run(["sessions", path], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("audit_template: error: ")
    assert err.rstrip("\n").endswith(message)


def test_command_line_errors_are_one_line(tmp_path: Path) -> None:
    """The real command line: a missing or empty tokenizer directory, a missing traces file."""
    (tmp_path / "empty").mkdir()
    cases = [
        (["template", "--tokenizer", str(tmp_path / "nope")], "not a directory"),
        (["template", "--tokenizer", str(tmp_path / "empty")], "tokenizer.json' not found"),
        (["sessions", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file"),
    ]
    for argv, message in cases:
        done = subprocess.run(
            [sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("audit_template: error: ") and message in done.stderr
