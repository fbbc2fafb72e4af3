"""``dew train flow`` (alias ``flow-grpo``): the entry point this distribution registers in
``dew.recipes``, a tiny run that checkpoints, a stopped run resumed to the parameters of an
uninterrupted one, and one-line errors naming the key."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dew.cli import main
from dew.flow.recipe import train
from dew.recipes.plugins import load_plugin


def _mapping(run_dir, steps: int) -> dict:
    return {
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "seed": 3,
                "log_every": 1, "checkpoint_every": 1},
        "model": {"preset": "flow", "emb_features": 16, "num_layers": 1, "num_heads": 2},
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "data": {"labels": [0, 1, 2, 3]},
        "objective": {"reward": "colour", "colour": "red", "groups": 2, "steps": 3,
                      "noise_level": 0.7, "beta": 0.0, "epsilon_low": 0.2, "epsilon_high": 0.2},
    }  # fmt: skip


def _write(path, mapping) -> str:
    path.write_text(json.dumps(mapping))
    return str(path)


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(state.params))]


def test_dew_finds_the_trainer_by_its_entry_point() -> None:
    assert load_plugin("flow", "kind", "dew-flow") is train


def test_a_stopped_run_resumed_ends_where_an_uninterrupted_one_does(tmp_path, capsys) -> None:
    stopped = tmp_path / "stopped"
    config = _write(tmp_path / "flow.json", _mapping(stopped, 3))
    # the command line stops after 2 of the 3 steps, checkpointing each
    assert main(["train", "flow", "--config", config, "--set", "run.steps=2"]) == 0
    assert "trained to step 2 (2 updates)" in capsys.readouterr().out
    assert sorted(p.name for p in (stopped / "checkpoints").iterdir()) == [
        "step_00000001", "step_00000002"]  # fmt: skip
    records = [json.loads(line) for line in open(stopped / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert json.load(open(stopped / "config.json"))["kind"] == "flow"
    two = train(_mapping(stopped, 2))  # nothing left to train: the step-2 state
    resumed = train(_mapping(stopped, 3))
    whole = train(_mapping(tmp_path / "whole", 3))
    assert int(resumed.step) == int(whole.step) == 3
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(two), _leaves(resumed)))
    for a, b in zip(_leaves(resumed), _leaves(whole), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kind", "override", "expected"),
    [
        ("flow", "objective.clip=0.2", "objective.clip: unknown key"),
        ("flow-grpo", "objective.groups=1", "objective.groups: expected an integer >= 2"),
        ("flow", "objective.colour=purple", "objective.colour: expected one of red, green, blue"),
        ("flow", "objective.reward=nowhere_module_x:f", "objective.reward: cannot import module"),
        ("flow", "model.preset=ddpm", "model.preset: expected one of flow, got 'ddpm'"),
        ("flow", "model.num_heads=3", "model.num_heads: 3 does not divide model.emb_features"),
        ("flow", "data.labels=[9]", "data.labels[0]: expected a shape label 0..5, got 9"),
        ("flow", "run.steps=0", "run.steps: expected a number > 0"),
        ("flow", "objective.train_steps=5", "objective.train_steps: expected at most"),
    ],
)
def test_config_errors_are_one_line_naming_the_key(tmp_path, capsys, kind, override, expected):
    run_dir = tmp_path / "bad"
    config = _write(tmp_path / "flow.json", _mapping(run_dir, 2))
    assert main(["train", kind, "--config", config, "--set", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not run_dir.exists()  # refused before anything was written
