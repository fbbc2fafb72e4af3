"""Bad input: each case gets one error line naming where (file, line, key or flag) and what
was expected, from the command line, the config files, the readers and the Python API."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _chat_tokenizer import build_tokenizer

from dew.cli import main
from dew.data import PreferencePairs, Prompts, open_tokens
from dew.data.chat import ChatMessages

TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "4", "--log-every", "1"]  # fmt: skip
GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}]}  # fmt: skip


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    base = tmp_path_factory.mktemp("errors")
    tok = build_tokenizer(str(base / "tok"))
    np.arange(1, 200, dtype=np.uint16).tofile(base / "tokens.bin")
    (base / "chat.jsonl").write_text(json.dumps(GOOD_CHAT) + "\n")
    (base / "rewards_err.py").write_text("VALUE = 3\n")
    return base, tok


def error_line(capsys, argv, code=2):
    """Run ``dew argv``; return its only stderr line (no traceback, the expected status)."""
    try:
        status = main(argv)
    except SystemExit as done:
        status = done.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == code, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


def lm(work, *extra):
    base, _ = work
    return ["train", "lm", "--tokens", str(base / "tokens.bin"), "--run-dir",
            str(base / "lm-run"), "--steps", "2", "--seq-len", "8", *TINY, *extra]  # fmt: skip


def sft(work, data, *extra):
    base, tok = work
    return ["train", "sft", "--data", str(data), "--tokenizer", tok, "--run-dir",
            str(base / "sft-run"), "--steps", "2", *TINY, *extra]  # fmt: skip


def write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------- flags and keys
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--steps", "-3"], "dew: error: run.steps: expected a number > 0, got -3"),
        (["--lr=-1e-3"], "dew: error: optimizer.learning_rate: expected a number > 0, got -0.001"),
        (["--lr", "-1e-3"], "dew: error: optimizer.learning_rate: expected a number > 0, got -0.001"),
        (["--lr", "nan"], "dew: error: optimizer.learning_rate: expected a finite number > 0, got nan"),
        (["--lr", "inf"], "dew: error: optimizer.learning_rate: expected a finite number > 0, got inf"),
        (["--lr", "-inf"], "dew: error: optimizer.learning_rate: expected a finite number > 0, got -inf"),
        (["--steps", "-3", "--lr", "-2"], "dew: error: run.steps: expected a number > 0, got -3"),
        (["--set", "optimizer.learning_rat=1e-5"],
         "dew: error: optimizer.learning_rat: unknown key; did you mean 'learning_rate'?"),
        (["--set", "optimiser.learning_rate=1e-5"], "dew: error: optimiser: unknown key; did you mean 'optimizer'?"),
        (["--set", "optimizer"], "dew: error: --set 'optimizer': expected KEY.PATH=VALUE"),
        (["--schedule", "cosin"], "dew: error: schedule.kind: expected one of constant, cosine, linear, got 'cosin'"),
        (["--schedule", "cosine", "--warmup", "2"],
         "dew: error: schedule.warmup_steps: 2 leaves no steps to decay over (decay_steps 2); expected fewer warmup steps"),
        (["--microbatches", "3"], "dew: error: run.microbatches: 3 does not divide run.batch 4"),
        (["--ema-decay", "1.5"], "dew: error: objective.ema_decay: expected a number in (0, 1), got 1.5"),
        (["--optimizer", "adam", "--weight-decay", "0.1"], "dew: error: optimizer.weight_decay: only adamw decays weights"),
        (["--set", "objective.all_tokens=true"], "dew: error: objective.all_tokens: only 'dew train sft' takes it"),
        (["--pretrained", "./no-such-model"], "dew: error: model.pretrained: no such file or directory"),
        (["--vocab-size", "10"], "dew: error: data.tokens: "),
        (["--set", "run.batch=four"], "dew: error: run.batch: expected an integer, got 'four'"),
        (["--layers", "0"], "dew: error: model.num_layers: expected a number > 0, got 0"),
        (["--export-dtype", "int8"], "dew: error: run.export_dtype: expected one of bfloat16, float32, float16, got 'int8'"),
        (["--batch", "0"], "dew: error: run.batch: expected a number > 0, got 0"),
        (["--log-every", "0"], "dew: error: run.log_every: expected a number > 0, got 0"),
        (["--checkpoint-every", "-5"], "dew: error: run.checkpoint_every: expected a number > 0, got -5"),
        (["--set", "run.keep=0"], "dew: error: run.keep: expected a number > 0, got 0"),
        (["--eval-every", "0"], "dew: error: run.eval_every: expected a number > 0, got 0"),
        (["--heads", "-2"], "dew: error: model.num_heads: expected a number > 0, got -2"),
        (["--emb-features", "0"], "dew: error: model.emb_features: expected a number > 0, got 0"),
        (["--clip", "-1"], "dew: error: optimizer.clip: expected a number >= 0, got -1"),
        (["--clip", "nan"], "dew: error: optimizer.clip: expected a finite number >= 0, got nan"),
        (["--warmup", "-1"], "dew: error: schedule.warmup_steps: expected a number >= 0, got -1"),
        (["--optimizer", "lion"], "dew: error: optimizer.name: expected one of adam, adamw, sgd, got 'lion'"),
        (["--trackers", "neptune"], "dew: error: run.trackers: expected names from"),
        (["--set", "run.steps=2.5"], "dew: error: run.steps: expected an integer, got 2.5"),
        (["--set", "model.nmae=x"], "dew: error: model.nmae: unknown key; did you mean 'name'?"),
    ],
)  # fmt: skip
def test_bad_values_are_one_line_naming_the_key(work, capsys, extra, message):
    line = error_line(capsys, lm(work, *extra))
    assert line.startswith(message), line


def test_token_id_outside_the_vocabulary_names_the_position(work, capsys):
    line = error_line(capsys, lm(work, "--vocab-size", "10"))
    assert "holds id 10 at position 9, outside model.vocab_size 10" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "lm", "--steps", "2", "--tokens", "t.bin"], "dew: error: --run-dir (run.run_dir): required, missing"),
        (["train", "lm", "--steps", "2", "--run-dir", "r"], "dew: error: --tokens (data.tokens): required, missing"),
        (["train", "sft", "--data", "c.jsonl", "--steps", "1", "--run-dir", "r"],
         "dew: error: --tokenizer (data.tokenizer): required, missing"),
    ],
)  # fmt: skip
def test_missing_required_flags(capsys, argv, message):
    assert error_line(capsys, argv) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "lm", "--lrr", "1"], "dew train lm: error: unrecognized arguments: --lrr 1; did you mean --lr? (see 'dew train lm --help')"),
        (["train", "lm", "--learning-rate", "1e-3"], "dew train lm: error: unrecognized arguments: --learning-rate 1e-3; did you mean --lr?"),
        (["train", "lm", "--num-layers", "2"], "dew train lm: error: unrecognized arguments: --num-layers 2; did you mean --layers?"),
        (["train", "lm", "--steps", "ten"], "dew train lm: error: argument --steps: invalid int value: 'ten' (see 'dew train lm --help')"),
        (["train", "rlhf"], "dew train: error: argument KIND: invalid choice: 'rlhf'"),
    ],
)  # fmt: skip
def test_bad_command_lines_are_one_line(capsys, argv, message):
    assert error_line(capsys, argv, code=2).startswith(message)


# ----------------------------------------------------------------------- paths and files
def test_mistyped_local_path_is_a_missing_file_not_a_hub_id(work, capsys):
    base, tok = work
    line = error_line(capsys, sft(work, base / "chat.jsnl"))
    assert line == f"dew: error: path: no such file {str(base / 'chat.jsnl')!r}" or (
        "no such file or directory" in line and "chat.jsnl" in line
    ), line
    line = error_line(capsys, sft(work, base / "chat.jsonl", "--tokenizer", str(base / "tokk")))
    assert line == f"dew: error: data.tokenizer: no such file or directory {str(base / 'tokk')!r}"
    line = error_line(capsys, ["train", "lm", "--tokens", "./tokns.bin", "--run-dir", "r",
                               "--steps", "1"])  # fmt: skip
    assert (
        line.startswith("dew: error: data.tokens: no such file or directory")
        and "tokns.bin" in line
    )


def test_empty_and_odd_sized_token_files_name_the_file(work, capsys, tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    line = error_line(capsys, ["train", "lm", "--tokens", str(tmp_path / "empty.bin"),
                               "--run-dir", str(tmp_path / "r"), "--steps", "1"])  # fmt: skip
    assert (
        line
        == f"dew: error: tokens {str(tmp_path / 'empty.bin')!r}: the file is empty; expected uint16 token ids"
    )
    line = error_line(capsys, ["train", "lm", "--tokens", str(tmp_path / "odd.bin"),
                               "--run-dir", str(tmp_path / "r"), "--steps", "1"])  # fmt: skip
    assert line == (
        f"dew: error: tokens {str(tmp_path / 'odd.bin')!r}: 3 bytes is not a whole number of "
        "uint16 ids (2 bytes each); the last id is cut off at byte 2"
    )


def test_negative_token_ids_name_the_position(capsys, tmp_path):
    np.save(tmp_path / "neg.npy", np.array([3, 4, -5, 6], np.int32))
    line = error_line(capsys, ["train", "lm", "--tokens", str(tmp_path / "neg.npy"),
                               "--run-dir", str(tmp_path / "r"), "--steps", "1"])  # fmt: skip
    assert line.endswith("holds a negative token id -5 at position 2; expected ids >= 0")


def test_failed_start_does_not_block_the_run_directory(work, capsys):
    base, _ = work
    run_dir = base / "blocked"
    bad = ["train", "lm", "--tokens", str(base / "missing.bin"), "--run-dir", str(run_dir),
           "--steps", "1", *TINY]  # fmt: skip
    assert "no such file" in error_line(capsys, bad)
    assert not (run_dir / "config.json").exists()
    bad_model = ["train", "lm", "--tokens", str(base / "tokens.bin"), "--run-dir",
                 str(run_dir), "--steps", "1", *TINY, "--vocab-size", "5"]  # fmt: skip
    assert "outside model.vocab_size 5" in error_line(capsys, bad_model)
    good = ["train", "lm", "--tokens", str(base / "tokens.bin"), "--run-dir", str(run_dir),
            "--steps", "1", "--seq-len", "8", *TINY, "--layers", "1"]  # fmt: skip
    assert main(good) == 0
    assert "trained to step 1" in capsys.readouterr().out


# ----------------------------------------------------------------------- chat rows
@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([GOOD_CHAT, {"messages": [{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": None}]}],
         "bad.jsonl: line 2: message 1 content is null (or missing); expected a string"),
        ([GOOD_CHAT, {"messages": [{"role": "user", "content": "only a question"}]}],
         "bad.jsonl: line 2: the conversation has no assistant turn, and SFT counts only assistant tokens"),
        ([GOOD_CHAT, "", '{"messages": ['], "bad.jsonl: line 3: malformed JSON"),
        ([GOOD_CHAT, {"messages": [{"role": "wizard", "content": "x"}]}],
         "bad.jsonl: line 2: message 0 role: unknown role 'wizard'"),
    ],
)  # fmt: skip
def test_bad_conversations_name_the_line(work, capsys, tmp_path, rows, message):
    path = write(tmp_path / "bad.jsonl", rows)
    line = error_line(capsys, sft(work, path))
    assert message in line and str(tmp_path) in line, line


def test_non_utf8_conversations_name_line_and_byte(work, capsys, tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(GOOD_CHAT).encode() + b'\n{"messages": "caf\xe9"}\n')
    line = error_line(capsys, sft(work, path))
    assert line == f"dew: error: {path}: line 2: not UTF-8 text (byte 17 of the line)"


# ----------------------------------------------------------------------- DPO and GRPO
def test_dpo_rows(work, capsys, tmp_path):
    base, tok = work
    text = write(tmp_path / "text.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    line = error_line(capsys, ["train", "dpo", "--data", str(text), "--run-dir",
                               str(tmp_path / "r"), "--steps", "1"])  # fmt: skip
    assert line == (f"dew: error: {text}: line 1: chosen/rejected are text, which needs "
                    "tokenizer= (a tokenizer directory with a chat template)")  # fmt: skip
    half = write(tmp_path / "half.jsonl", [{"prompt": "a", "chosen": "b"}])
    line = error_line(capsys, ["train", "dpo", "--data", str(half), "--tokenizer", tok,
                               "--run-dir", str(tmp_path / "r"), "--steps", "1"])  # fmt: skip
    assert line == f"dew: error: {half}: line 1: missing field 'rejected'"


def test_grpo_settings(work, capsys, tmp_path):
    base, tok = work
    prompts = write(tmp_path / "p.jsonl", [{"prompt": [1, 2, 3], "ground_truth": "4"}])
    argv = ["train", "grpo", "--data", str(prompts), "--run-dir", str(tmp_path / "r"),
            "--steps", "1"]  # fmt: skip
    assert error_line(capsys, [*argv, "--groups", "1"]).startswith(
        "dew: error: objective.groups: expected an integer >= 2 (a group of one has no baseline), got 1"
    )
    assert error_line(capsys, argv).startswith(
        "dew: error: model.vocab_size: required for GRPO on token-id prompts without data.tokenizer"
    )
    os.chdir(base)
    for reward, message in [
        ("nope", "objective.reward: expected 'math', 'code' or 'module:object', got 'nope'"),
        ("no_such_module_x:f", "objective.reward: cannot import module 'no_such_module_x'"),
        ("rewards_err:score", "objective.reward: module 'rewards_err' has no attribute 'score'"),
        ("rewards_err:VALUE", "objective.reward: 'rewards_err:VALUE' is not callable"),
    ]:
        line = error_line(capsys, [*argv, "--vocab-size", "16", "--reward", reward])
        assert line.startswith(f"dew: error: {message}"), line


def test_a_tokenizer_name_that_is_no_directory_says_so_first(work, capsys, tmp_path, monkeypatch):
    """A typo'd tokenizer directory is named as a missing directory; only a name that could
    be a Hub id adds that the Hub lookup failed too (no network here, or offline)."""
    base, _ = work
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat.jsonl").write_text(json.dumps(GOOD_CHAT) + "\n")
    argv = ["train", "sft", "--data", "chat.jsonl", "--run-dir", "r", "--steps", "1", *TINY]
    for name in ("tokk", "org/tokk"):
        line = error_line(capsys, [*argv, "--tokenizer", name])
        assert line.startswith(
            f"dew: error: data.tokenizer: no such directory {name!r}; looked up as a Hub name, "
            "it failed too ("
        ), line
    line = error_line(capsys, [*argv, "--tokenizer", "chat.jsonl"])
    assert line == (
        f"dew: error: data.tokenizer: {str(tmp_path / 'chat.jsonl')!r} is a file; expected a "
        "tokenizer directory"
    )
    assert not (tmp_path / "r").exists()
    from dew.data.chat.template import looks_like_hub_id

    assert looks_like_hub_id("gpt2") and looks_like_hub_id("Qwen/Qwen3-0.6B")
    for path in ("./tok", "/abs/tok", "~/tok", "a/b/c", "../tok", "a/../b", ""):
        assert not looks_like_hub_id(path), path


def test_grpo_lengths_beyond_the_models_positions_name_the_options(work, capsys, tmp_path):
    base, _ = work
    prompts = write(tmp_path / "p.jsonl", [{"prompt": [1, 2, 3], "ground_truth": "4"}])
    argv = ["train", "grpo", "--data", str(prompts), "--run-dir", str(tmp_path / "r"),
            "--steps", "1", "--vocab-size", "16", "--set", "data.max_prompt_len=20",
            "--set", "objective.max_new_tokens=20"]  # fmt: skip
    need = ("data.max_prompt_len 20 + objective.max_new_tokens 20 need (64; sampling pads "
            "each to a power of two, at least 16)")  # fmt: skip
    line = error_line(capsys, [*argv, "--set", "model.max_seq_len=32"])
    assert line == f"dew: error: model.max_seq_len: 32 is shorter than {need}"
    exported = tmp_path / "small-model"
    assert main(["train", "lm", "--tokens", str(base / "tokens.bin"), "--run-dir",
                 str(tmp_path / "lm"), "--steps", "1", "--seq-len", "8", *TINY,
                 "--export", str(exported), "--export-dtype", "float32"]) == 0  # fmt: skip
    capsys.readouterr()
    positions = json.loads((exported / "config.json").read_text())["max_position_embeddings"]
    line = error_line(capsys, [*argv, "--pretrained", str(exported)])
    assert line == (
        f"dew: error: model.pretrained: the model covers {positions} positions, fewer than {need}"
    )


def test_grpo_prompts_without_the_field_the_reward_reads(work, capsys, tmp_path):
    """A math reward on prompts with no ground truth would score every answer 0: refused
    before any step, naming the column, the first row and the reward."""
    rows = [{"prompt": [1, 2, 3], "ground_truth": "4"}, {"prompt": [1, 2]},
            {"prompt": [2], "reward_model": {"ground_truth": "1"}}, {"prompt": [3]}]  # fmt: skip
    prompts = write(tmp_path / "p.jsonl", rows)
    argv = ["train", "grpo", "--data", str(prompts), "--run-dir", str(tmp_path / "r"),
            "--steps", "1", "--vocab-size", "16", "--reward", "dew.rewards:MathReward"]  # fmt: skip
    assert error_line(capsys, argv) == (
        "dew: error: data.path: 2 of 4 rows have no 'ground_truth' (nor "
        "reward_model.ground_truth), first row 1; objective.reward 'dew.rewards:MathReward' "
        "needs it"
    )
    assert not (tmp_path / "r").exists()
    # a reward that declares no needs takes the same rows
    from dew.data import Prompts
    from dew.recipes.chain import Stage
    from dew.rewards import MathReward

    reader = Prompts(path=prompts, max_prompt_len=4)
    Stage("g", reader, steps=1, reward=lambda *a: 0.0)
    with pytest.raises(ValueError, match=r"Stage.data \(g\): 2 of 4 rows have no 'ground_truth'"):
        Stage("g", reader, steps=1, reward=MathReward())


# ----------------------------------------------------------------------- config files
def test_config_file_errors(work, capsys, tmp_path):
    base, _ = work
    cases = [
        (
            "optimiser:\n  learning_rate: 1e-3\n",
            "optimiser: unknown key; did you mean 'optimizer'?",
        ),
        ("kind: sft\n", "kind: the config is for 'sft' but the command is 'dew train lm'"),
        ("optimizer:\n  learning_rate: [1e-3\n", "c.yaml: line 3: malformed YAML"),
        ("run: [1, 2]\n", "run: expected a mapping of keys, got [1, 2]"),
        ("model:\n  num_layer: 2\n", "model.num_layer: unknown key; did you mean 'num_layers'?"),
    ]
    for text, message in cases:
        (tmp_path / "c.yaml").write_text(text)
        line = error_line(capsys, ["train", "lm", "--config", str(tmp_path / "c.yaml"),
                                   "--tokens", str(base / "tokens.bin"), "--steps", "1",
                                   "--run-dir", str(tmp_path / "r")])  # fmt: skip
        assert message in line, line


def test_chain_config_is_checked_before_any_stage_trains(work, capsys, tmp_path):
    base, tok = work
    stage = {"name": "sft", "steps": 1,
             "data": {"type": "ChatMessages", "path": str(base / "chat.jsonl"),
                      "tokenizer": tok, "seq_len": 31}}  # fmt: skip
    config = {"output": str(tmp_path / "out"), "batch": 2,
              "model": {"name": "causal_transformer", "vocab_size": 420, "emb_features": 16,
                        "num_layers": 1, "num_heads": 2, "mlp_features": 32,
                        "max_seq_len": 32}}  # fmt: skip
    cases = [
        ([stage, {**stage, "name": "b", "step": 1}], "stages.1.step: unknown key; did you mean 'steps'?"),
        ([stage, {**stage, "name": "b", "data": {**stage["data"], "type": "Chat"}}],
         "stages.1.data.type: expected one of ChatMessages, PreferencePairs, Prompts, "
         "TokenFile, got 'Chat'"),
        ([stage, {**stage, "name": "b", "data": {**stage["data"], "path": "./nope.jsonl"}}],
         "stages.1.data.path: no such file or directory"),
        ([stage, {**stage, "name": "b", "data": {**stage["data"], "seq_length": 3}}],
         "stages.1.data.seq_length: unknown key; did you mean 'seq_len'?"),
        ([stage, {**stage, "name": "b", "optimizer": {"learning_rate": -1}}],
         "stages.1.optimizer.learning_rate: expected a number > 0, got -1"),
    ]  # fmt: skip
    for stages, message in cases:
        (tmp_path / "chain.json").write_text(json.dumps({**config, "stages": stages}))
        line = error_line(capsys, ["chain", str(tmp_path / "chain.json")])
        assert message in line, line
        assert not (tmp_path / "out" / "sft" / "checkpoints").exists()
    (tmp_path / "chain.json").write_text(json.dumps({**config, "stages": [stage], "outptu": "x"}))
    line = error_line(capsys, ["chain", str(tmp_path / "chain.json")])
    assert "outptu: unknown key; did you mean 'output'?" in line
    (tmp_path / "a-file").write_text("not a directory\n")
    on_file = {**config, "stages": [stage], "output": str(tmp_path / "a-file")}
    (tmp_path / "chain.json").write_text(json.dumps(on_file))
    line = error_line(capsys, ["chain", str(tmp_path / "chain.json")])
    assert (
        line == f"dew: error: output: {str(tmp_path / 'a-file')!r} is a file; expected a directory"
    )
    assert (tmp_path / "a-file").read_text() == "not a directory\n"


def test_chain_reward_classes_are_made_and_checked_before_any_stage(work, capsys, tmp_path):
    """A chain whose GRPO reward is a class (dew.rewards:MathReward) gets an instance, as
    dew train does; a class that cannot be made, or prompts without the field it reads,
    stop the chain before its first stage trains."""
    from dew.recipes.cli import recipe_from_config
    from dew.rewards import MathReward

    base, tok = work
    sft = {"name": "sft", "steps": 1,
           "data": {"type": "ChatMessages", "path": str(base / "chat.jsonl"),
                    "tokenizer": tok, "seq_len": 31}}  # fmt: skip
    prompts = [json.dumps({"prompt": [1, 2], "ground_truth": "3"})]
    grpo = {"name": "grpo", "steps": 1, "reward": "dew.rewards:MathReward", "groups": 2,
            "max_new_tokens": 4, "data": {"type": "Prompts", "records": prompts,
                                          "max_prompt_len": 4}}  # fmt: skip
    config = {"output": str(tmp_path / "out"), "batch": 1, "stages": [sft, grpo],
              "model": {"name": "causal_transformer", "vocab_size": 420, "emb_features": 16,
                        "num_layers": 1, "num_heads": 2, "mlp_features": 32,
                        "max_seq_len": 32}}  # fmt: skip
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(config))
    reward = recipe_from_config(path).stages[1].reward
    assert isinstance(reward, MathReward)
    assert reward("s", "so \\boxed{3}", "3", "") == 1.0
    assert recipe_from_config(path).stages[1].decode is None  # no tokenizer: ids as text
    # The short name, a class made with reward_args, and decoded text with a tokenizer.
    (tmp_path / "rewards_chain_scaled.py").write_text(
        "class Scaled:\n    def __init__(self, scale):\n        self.scale = scale\n"
        "    def __call__(self, source, completion, truth, extra):\n"
        "        return self.scale * (completion == truth)\n"
    )
    path.write_text(json.dumps({**config, "stages": [sft, {**grpo, "reward": "math"}]}))
    assert isinstance(recipe_from_config(path).stages[1].reward, MathReward)
    scaled = {**grpo, "reward": "rewards_chain_scaled:Scaled", "reward_args": {"scale": 2.5},
              "data": {**grpo["data"], "tokenizer": tok}}  # fmt: skip
    path.write_text(json.dumps({**config, "stages": [sft, scaled]}))
    stage = recipe_from_config(path).stages[1]
    assert stage.reward("s", "3", "3", "") == 2.5
    from dew.data.prompts import resolve_tokenizer

    ids = resolve_tokenizer(tok).encode("so \\boxed{3}")
    assert stage.decode(ids) == "so \\boxed{3}"
    (tmp_path / "rewards_needing_args.py").write_text(
        "class Scored:\n    def __init__(self, scale):\n        self.scale = scale\n"
    )
    no_truth = [json.dumps({"prompt": [1, 2]})]
    cases = [
        ({**grpo, "reward": "rewards_needing_args:Scored"},
         "stages.1.reward: Scored() failed (TypeError: "),
        ({**grpo, "reward": "rewards_needing_args:Scored", "reward_args": {"scales": 2}},
         "stages.1.reward: Scored(scales=2) failed (TypeError: "),
        ({**grpo, "reward": "rewards_needing_args:Scored", "reward_args": [2]},
         "stages.1.reward_args: expected a mapping of keyword arguments, got [2]"),
        ({**grpo, "reward": "dew.rewards.math_reward:MathReward", "reward_args": {"x": 1}},
         "stages.1.reward: MathReward(x=1) failed (TypeError: "),
        ({**grpo, "reward": "math", "data": {**grpo["data"], "tokenizer": "./no-such-tok"}},
         "stages.1.data.tokenizer: no such file or directory"),
        ({**grpo, "data": {**grpo["data"], "records": no_truth}},
         "stages.1: Stage.data (grpo): 1 of 1 rows have no 'ground_truth'"),
    ]  # fmt: skip
    for stage, message in cases:
        path.write_text(json.dumps({**config, "stages": [sft, stage]}))
        line = error_line(capsys, ["chain", str(path)])
        assert line.startswith(f"dew: error: {message}"), line
        assert not (tmp_path / "out" / "sft").exists()


def test_a_chain_rerun_with_another_config_is_refused_naming_the_keys(work, capsys, tmp_path):
    base, tok = work
    stage = {"name": "sft", "steps": 2,
             "data": {"type": "ChatMessages", "path": str(base / "chat.jsonl"),
                      "tokenizer": tok, "seq_len": 31}}  # fmt: skip
    config = {"output": str(tmp_path / "out"), "batch": 1, "log_every": 1, "stages": [stage],
              "model": {"name": "causal_transformer", "vocab_size": 420, "emb_features": 16,
                        "num_layers": 1, "num_heads": 2, "mlp_features": 32,
                        "max_seq_len": 32}}  # fmt: skip
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(config))
    assert main(["chain", str(path)]) == 0
    capsys.readouterr()
    checkpoints = sorted((tmp_path / "out" / "sft" / "checkpoints").iterdir())
    wider = {**config, "model": {**config["model"], "emb_features": 32}}
    longer = {**config, "stages": [{**stage, "steps": 3}], "log_every": 2}
    for changed, keys in ((wider, "model.emb_features"), (longer, "stages.0.steps")):
        path.write_text(json.dumps(changed))
        line = error_line(capsys, ["chain", str(path)])
        assert line == (
            f"dew: error: output: {tmp_path / 'out'} holds stages trained with another config "
            f"({keys} differ); pass the same config, --fresh to move the old run aside, or "
            "another output"
        )
        assert sorted((tmp_path / "out" / "sft" / "checkpoints").iterdir()) == checkpoints
    path.write_text(json.dumps({**config, "log_every": 2}))  # logging may change
    assert main(["chain", str(path)]) == 0
    path.write_text(json.dumps(wider))
    assert main(["chain", str(path), "--fresh"]) == 0
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("out.old-")]
    assert sorted((old / "sft" / "checkpoints").iterdir())[-1].name == checkpoints[-1].name
    saved = json.loads((tmp_path / "out" / "chain-config.json").read_text())
    assert saved["model"]["emb_features"] == 32


def _small_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def test_a_full_disk_is_one_line_and_the_last_checkpoint_survives(work, tmp_path):
    """A real full device (a 400 KiB tmpfs: one checkpoint of this model fits, two do not):
    one line naming the directory, status 1, the first checkpoint intact and loadable, no
    partial one left. Mounting needs root, which CI has."""
    base, _ = work
    disk = tmp_path / "disk"
    if not _small_tmpfs(disk, "400k"):
        pytest.skip("mounting a tmpfs needs root")
    try:
        run_dir = disk / "run"
        argv = [sys.executable, "-m", "dew.cli", "train", "lm", "--tokens",
                str(base / "tokens.bin"), "--run-dir", str(run_dir), "--steps", "50",
                "--seq-len", "8", "--checkpoint-every", "1", "--no-progress", *TINY]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))  # fmt: skip
        assert done.returncode == 1, done.stderr[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr[-3000:]
        line = lines[0]
        root = run_dir / "checkpoints"
        kept = sorted(os.listdir(root))
        assert kept and not any(name.startswith(".tmp-") for name in kept), kept
        step = int(kept[-1].split("_")[1])
        assert re.fullmatch(
            re.escape(f"dew: error: checkpoint of step {step + 1}: no space left on the device "
                      f"of {root} (") + r"\d+ bytes free, about \d+ needed" +
            re.escape(f"); the newest, {root / kept[-1]}, is intact"),
            line,
        ), line  # fmt: skip
        from dew.trainer import checkpoint as ckpt

        restored = ckpt.latest(run_dir)
        assert restored is not None and restored.step == step
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_run_dir_that_is_a_file_is_named(work, tmp_path, capsys):
    base, _ = work
    (tmp_path / "runfile").write_text("keep me\n")
    argv = ["train", "lm", "--tokens", str(base / "tokens.bin"), "--steps", "1",
            "--seq-len", "8", *TINY]  # fmt: skip
    line = error_line(capsys, [*argv, "--run-dir", str(tmp_path / "runfile")])
    assert (
        line
        == f"dew: error: run.run_dir: {str(tmp_path / 'runfile')!r} is a file; expected a directory"
    )
    line = error_line(capsys, [*argv, "--run-dir", str(tmp_path / "runfile" / "sub")])
    assert line == (f"dew: error: run.run_dir: {str(tmp_path / 'runfile' / 'sub')!r} lies under "
                    f"the file {str(tmp_path / 'runfile')!r}; expected a directory")  # fmt: skip
    line = error_line(capsys, [*argv, "--run-dir", str(tmp_path / "r"), "--export",
                               str(tmp_path / "runfile")])  # fmt: skip
    assert line.startswith("dew: error: run.export: ") and "is a file" in line
    assert (tmp_path / "runfile").read_text() == "keep me\n"
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------- --debug
def test_debug_shows_the_traceback_and_plain_runs_do_not(tmp_path):
    argv = [sys.executable, "-m", "dew.cli", "train", "lm", "--tokens",
            str(tmp_path / "none.bin"), "--run-dir", str(tmp_path / "r"), "--steps", "1"]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == 2  # the input's fault
    assert plain.stderr.strip().splitlines() == [
        f"dew: error: data.tokens: no such file or directory {str(tmp_path / 'none.bin')!r}"
    ]
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, env=env,
                           timeout=120)  # fmt: skip
    assert debug.returncode == 1 and "Traceback" in debug.stderr  # Python's own status
    assert "ConfigError: data.tokens: no such file or directory" in debug.stderr


# ----------------------------------------------------------------------- the Python API
def test_preference_pairs_api_errors(tmp_path):
    with pytest.raises(
        TypeError,
        match=r"PreferencePairs row 0: chosen must be a string like rejected, got a list of token ids",
    ):
        PreferencePairs(records=(json.dumps({"chosen": [1, 2], "rejected": "x"}),), seq_len=8)
    with pytest.raises(
        ValueError,
        match=r"PreferencePairs row 0: chosen/rejected are messages, which needs tokenizer=",
    ):
        PreferencePairs(records=(json.dumps({"chosen": [{"role": "assistant", "content": "a"}],
                                             "rejected": [{"role": "assistant", "content": "b"}]}),),
                        seq_len=8)  # fmt: skip
    path = write(tmp_path / "pairs.jsonl", [{"chosen": [1, 2], "rejected": [1, 3]}, "",
                                            {"chosen": [1, -2], "rejected": [1, 3]}])  # fmt: skip
    with pytest.raises(
        ValueError, match=r"pairs.jsonl: line 3: chosen must hold non-negative ids, got -2"
    ):
        PreferencePairs(path, seq_len=8)
    with pytest.raises(FileNotFoundError, match=r"path: no such file '.*missing.jsonl'"):
        PreferencePairs(tmp_path / "missing.jsonl", seq_len=8)


def test_conversation_pairs_without_an_assistant_answer(work, tmp_path):
    _, tok = work
    row = {"prompt": [{"role": "user", "content": "q"}],
           "chosen": [{"role": "user", "content": "a"}],
           "rejected": [{"role": "assistant", "content": "b"}]}  # fmt: skip
    with pytest.raises(ValueError, match=r"row 0: chosen: the completion has no assistant message"):
        PreferencePairs(records=(json.dumps(row),), seq_len=64, tokenizer=tok)


def test_prompts_name_the_file_line(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": [1, 2]}, "", {"prompt": [1, -3]}])
    with pytest.raises(ValueError, match=r"p.jsonl: line 3: prompt holds a negative token id"):
        Prompts(path, max_prompt_len=4)


def test_chat_messages_api_null_content(work, tmp_path):
    _, tok = work
    path = write(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": None},
                                                      {"role": "assistant", "content": "x"}]}])  # fmt: skip
    with pytest.raises(ValueError, match=r"c.jsonl: line 1: message 0 content is null"):
        ChatMessages(str(path), tok, seq_len=32).load(batch=1)


def test_open_tokens_api(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match=r"5 bytes is not a whole number of uint32 ids"):
        open_tokens(tmp_path / "odd.bin", "uint32")
    with pytest.raises(
        ValueError, match=r"token dtype: expected a numpy integer dtype, got 'int77'"
    ):
        (tmp_path / "a.bin").write_bytes(b"\x00\x00")
        open_tokens(tmp_path / "a.bin", "int77")
