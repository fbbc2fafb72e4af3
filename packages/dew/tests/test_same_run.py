"""dew.recipes.train.check_same_run: a run directory holding checkpoints of other settings is
refused with every difference named; keys allowed to change, and a fresh directory, pass."""

from __future__ import annotations

import json

import pytest

from dew.recipes.schema import ConfigError
from dew.recipes.train import check_same_run

OLD = {"kind": "grpo", "model": {"name": "qwen3", "num_layers": 2},
       "data": {"path": "a.jsonl", "val_path": "v.jsonl"}, "run": {"steps": 10}}  # fmt: skip


def run_dir_with(tmp_path, config, checkpoint=True):
    if checkpoint:
        (tmp_path / "checkpoints" / "step_00000004").mkdir(parents=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_same_settings_pass_and_allowed_keys_may_change(tmp_path):
    run_dir = run_dir_with(tmp_path, OLD)
    new = {**OLD, "data": {**OLD["data"], "val_path": "w.jsonl"}, "run": {"steps": 99}}
    check_same_run(run_dir, new, ("kind", "model", "data"), ("val_path",))


def test_every_difference_is_named(tmp_path):
    run_dir = run_dir_with(tmp_path, OLD)
    new = {**OLD, "kind": "ppo", "model": {"name": "qwen3", "num_layers": 3}}
    with pytest.raises(ConfigError) as err:
        check_same_run(run_dir, new, ("kind", "model", "data"))
    message = str(err.value)
    assert message.startswith(f"run.run_dir: {run_dir} holds a run started with other settings")
    assert "kind 'grpo' -> 'ppo'" in message and "model.num_layers 2 -> 3" in message
    assert message.endswith("use a new run directory") and "\n" not in message


def test_tuples_compare_as_the_file_holds_them(tmp_path):
    run_dir = run_dir_with(tmp_path, {**OLD, "data": {"band": [0.5, 2.0]}})
    check_same_run(run_dir, {**OLD, "data": {"band": (0.5, 2.0)}}, ("data",))


def test_a_directory_without_checkpoints_is_free(tmp_path):
    run_dir = run_dir_with(tmp_path, {"kind": "dpo"}, checkpoint=False)
    check_same_run(run_dir, OLD, ("kind",))


def test_an_unreadable_config_is_named(tmp_path):
    run_dir = run_dir_with(tmp_path, OLD)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"^run\.run_dir: .*config\.json is unreadable"):
        check_same_run(run_dir, OLD, ("kind",))
