"""The ``rollout`` section (``dew.recipes.rollout_config``): defaults, every check naming its
key, and bad sections refused by ``dew train grpo`` and ``dew chain`` with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dew.cli import main
from dew.recipes.rollout_config import EngineConfig, EngineLaunch, RolloutConfig, rollout_config
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import train_config

MODEL = {"name": "causal_transformer", "vocab_size": 32, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32}  # fmt: skip


def test_defaults_are_sync_on_the_native_engine():
    config = rollout_config(None)
    assert config == RolloutConfig()
    assert (config.mode, config.ahead, config.max_lag, config.sync_every) == ("sync", 1, 1, 1)
    assert config.engine == EngineConfig() and config.engine.kind == "native"
    assert not config.is_async


def test_max_lag_defaults_to_the_smallest_the_schedule_allows():
    assert rollout_config({"mode": "async", "ahead": 0}).max_lag == 1
    assert rollout_config({"mode": "async", "ahead": 2}).max_lag == 2
    assert rollout_config({"mode": "async", "ahead": 2, "sync_every": 3}).max_lag == 4
    assert rollout_config({"mode": "async", "ahead": 1, "max_lag": 5}).max_lag == 5


def test_a_launched_engine_is_typed():
    config = rollout_config({"mode": "async", "engine": {"kind": "vllm", "publish": "nccl",
                             "nccl_library": "/venv/nccl/libnccl.so.2", "launch": {"python": "/venv/bin/python", "args": ["--enforce-eager"],
                                        "cpus": [0, 1], "env": {"VLLM_X": "1"}, "port": 8011}}})  # fmt: skip
    launch = config.engine.launch
    assert config.engine.nccl_library == "/venv/nccl/libnccl.so.2"
    assert isinstance(launch, EngineLaunch)
    assert launch.args == ("--enforce-eager",) and launch.cpus == (0, 1)
    assert launch.env == {"VLLM_X": "1"} and launch.ready_timeout == 600.0
    url = rollout_config({"mode": "async", "engine": {"kind": "sglang", "url": "http://h:1",
                                                      "directory": "/ckpt"}})  # fmt: skip
    assert url.engine.launch is None and url.engine.directory == "/ckpt"


BAD = [
    ({"mode": "async", "ahead": -1}, "rollout.ahead: expected an integer >= 0, got -1"),
    ({"mode": "async", "ahead": 2, "max_lag": 1}, "rollout.max_lag: expected an integer >= "),
    ({"mode": "async", "ahaed": 1}, "rollout.ahaed: unknown key; did you mean 'ahead'?"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"tokenizer": "/no/such/dir"}}},
     "rollout.engine.launch.tokenizer: expected null or a tokenizer directory, got "
     "'/no/such/dir'"),
    ({"mode": "async", "engine": {"kind": "vllm"}}, "rollout.engine.url: a vllm engine takes "
     "exactly one of url"),
    ({"mode": "async", "engine": {"kind": "vllm", "url": "http://h:1", "directory": "/d",
                                  "launch": {}}}, "rollout.engine.url: a vllm engine takes"),
    ({"mode": "async", "engine": {"kind": "trt"}}, "rollout.engine.kind: expected one of "),
    ({"mode": "sync", "ahead": 2}, "rollout.ahead: only mode async reads it"),
    ({"engine": {"kind": "vllm", "url": "http://h:1", "directory": "/d"}},
     "rollout.engine.kind: only mode async"),
    ({"mode": "later"}, "rollout.mode: expected one of sync, async, got 'later'"),
    ({"mode": "async", "sync_every": 0}, "rollout.sync_every: expected an integer >= 1"),
    ({"mode": "async", "admit": 0}, "rollout.admit: expected null or an integer >= 1"),
    ({"mode": "async", "timeout": 0}, "rollout.timeout: expected a number > 0"),
    ({"mode": "async", "truncation": "drop"}, "rollout.truncation: expected one of mask"),
    ({"mode": "async", "engine": {"kind": "sglang", "url": "http://h:1"}},
     "rollout.engine.directory: required with url"),
    ({"mode": "async", "engine": {"directory": "/d"}}, "rollout.engine.directory: the native"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"args": "--x"}}},
     "rollout.engine.launch.args: expected a list of strings"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"cpus": [0, -1]}}},
     "rollout.engine.launch.cpus[1]: expected an integer >= 0"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"env": {"A": 1}}}},
     "rollout.engine.launch.env: expected a mapping of names to strings"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"ready_timeout": 0}}},
     "rollout.engine.launch.ready_timeout: expected a number > 0"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"port": 0}}},
     "rollout.engine.launch.port: expected null or a port"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {"pyhton": "p"}}},
     "rollout.engine.launch.pyhton: unknown key; did you mean 'python'?"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {}, "publish": "nccl"}},
     "rollout.engine.nccl_library: expected the path of the engine's libnccl.so.2"),
    ({"mode": "async", "engine": {"kind": "sglang", "launch": {}, "publish": "nccl",
                                  "nccl_library": "/l"}}, "rollout.engine.publish: nccl pushes "
     "follow vLLM's"),
    ({"mode": "async", "engine": {"kind": "vllm", "launch": {}, "nccl_library": "/l"}},
     "rollout.engine.nccl_library: only publish nccl reads it (publish is reload)"),
    ({"mode": "async", "engine": {"nccl_library": "/l"}}, "rollout.engine.nccl_library: the "
     "native engine"),
]  # fmt: skip


@pytest.mark.parametrize(("section", "message"), BAD)
def test_each_bad_value_names_its_key(section, message):
    with pytest.raises(ConfigError) as err:
        rollout_config(section)
    assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(ConfigError) as nested:
        rollout_config(section, "stages.3.rollout")
    assert str(nested.value) == "stages.3." + str(err.value)


@pytest.fixture
def prompts(tmp_path):
    rows = [{"prompt": [1, 2, 3], "ground_truth": "x"}] * 4
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def grpo(base, rollout, **objective):
    return {"run": {"run_dir": str(base / "run"), "steps": 1, "batch": 2}, "model": MODEL,
            "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
            "objective": {"groups": 2, "max_new_tokens": 4, **objective},
            "rollout": rollout}  # fmt: skip


def test_train_config_takes_the_section_for_grpo_and_ppo_only(prompts):
    config = train_config(grpo(prompts, {"mode": "async"}, behavior_importance=2.0), "grpo")
    assert config.rollout.is_async and config.as_dict()["rollout"]["engine"]["kind"] == "native"
    assert train_config(grpo(prompts, None), "grpo").rollout == RolloutConfig()
    with pytest.raises(ConfigError, match="^objective.behavior_importance: rollout.max_lag 1"):
        train_config(grpo(prompts, {"mode": "async"}), "grpo")
    tokens = prompts / "tokens.npy"
    import numpy as np

    np.save(tokens, np.arange(64, dtype=np.uint16))
    lm = {"run": {"run_dir": str(prompts / "lm"), "steps": 1}, "model": MODEL,
          "data": {"tokens": str(tokens)}, "rollout": {"mode": "sync"}}  # fmt: skip
    with pytest.raises(
        ConfigError, match="^rollout: only dew train grpo and dew train ppo take it"
    ):
        train_config(lm, "lm")
    ppo = train_config(grpo(prompts, {"mode": "async"}, behavior_importance=2.0), "ppo")
    assert ppo.rollout.is_async
    with pytest.raises(ConfigError, match="^objective.behavior_importance: rollout.max_lag 1"):
        train_config(grpo(prompts, {"mode": "async"}), "ppo")


CLI_BAD = [
    ({"mode": "async", "ahead": -1}, "rollout.ahead: expected an integer >= 0, got -1"),
    ({"mode": "async", "ahead": 2, "max_lag": 1}, "rollout.max_lag: expected an integer >= 2"),
    ({"mode": "async", "speed": 2}, "rollout.speed: unknown key"),
    ({"mode": "async", "engine": {"kind": "vllm"}}, "rollout.engine.url: "),
    ({"mode": "async", "engine": {"kind": "vllm", "url": "http://h:1", "directory": "/d",
                                  "launch": {"port": 9000}}}, "rollout.engine.url: "),
    ({"mode": "async", "engine": {"kind": "tgi"}}, "rollout.engine.kind: expected one of"),
    ({"mode": "sync", "oversample": 2}, "rollout.oversample: only mode async reads it"),
]  # fmt: skip


@pytest.mark.parametrize(("section", "message"), CLI_BAD)
def test_dew_train_grpo_refuses_a_bad_section_with_one_line(prompts, capsys, section, message):
    path = prompts / "bad.json"
    path.write_text(json.dumps(grpo(prompts, section, behavior_importance=2.0)))
    assert main(["train", "grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dew: error: {message}"), err
    assert not (prompts / "run").exists()


def test_the_console_prints_one_line_without_a_traceback(prompts):
    path = prompts / "bad.json"
    path.write_text(json.dumps(grpo(prompts, {"mode": "async", "ahead": -1})))
    done = subprocess.run([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                           str(path)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "dew: error: rollout.ahead: expected an integer >= 0, got -1"


def test_a_chain_stage_names_its_rollout_keys(tmp_path, capsys):
    rows = [{"prompt": [1, 2, 3], "ground_truth": "x"}] * 4
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pair = {"prompt": [1, 2], "chosen": [3, 4], "rejected": [5, 6]}
    (tmp_path / "pairs.jsonl").write_text(json.dumps(pair) + "\n")
    stage = {"name": "grpo", "steps": 1, "reward": "math", "groups": 2, "max_new_tokens": 4,
             "data": {"type": "Prompts", "path": "prompts.jsonl", "max_prompt_len": 4}}  # fmt: skip
    dpo = {"name": "dpo", "steps": 1, "rollout": {"mode": "sync"},
           "data": {"type": "PreferencePairs", "path": "pairs.jsonl", "seq_len": 8}}  # fmt: skip
    cases = [
        ([{**stage, "rollout": {"mode": "async", "ahead": -1}}],
         "stages.0.rollout.ahead: expected an integer >= 0, got -1"),
        ([{**stage, "rollout": {"mode": "async", "engine": {"kind": "vllm"}}}],
         "stages.0.rollout.engine.url: "),
        ([stage, {**stage, "name": "b", "rollout": {"mode": "async"}}],
         "stages.1.behavior_importance: rollout.max_lag 1"),
        ([dpo], "stages.0.rollout: only a GRPO or PPO stage"),
    ]  # fmt: skip
    for stages, message in cases:
        path = tmp_path / "chain.json"
        path.write_text(json.dumps({"output": "out", "batch": 2, "model": MODEL,
                                    "stages": stages}))  # fmt: skip
        assert main(["chain", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"dew: error: {message}"), err
    assert not (tmp_path / "out").exists()


def test_async_without_dew_rollout_names_the_key_and_the_distribution(prompts, capsys, monkeypatch):
    import dew.recipes.plugins

    monkeypatch.setattr(dew.recipes.plugins, "entry_points", lambda **kw: [])
    path = prompts / "async.json"
    path.write_text(json.dumps(grpo(prompts, {"mode": "async"}, behavior_importance=2.0)))
    assert main(["train", "grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "dew: error: rollout.mode: needs the dew-rollout distribution"
    ), err
    assert not (prompts / "run" / "config.json").exists()


def test_the_getting_started_async_config_is_a_valid_config(tmp_path, monkeypatch):
    """The asynchronous config docs/getting-started.md shows passes every check."""
    import yaml

    page = (Path(__file__).resolve().parents[3] / "docs" / "getting-started.md").read_text()
    section = page.split("## Asynchronous RL from one config", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    mapping = yaml.safe_load(block)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "sft-export").mkdir(parents=True)
    for name in ("prompts.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("")
    config = train_config(mapping, "grpo")
    assert config.rollout.is_async and config.rollout.ahead == 1
    assert config.rollout.engine.kind == "vllm"
    assert config.rollout.engine.launch.cpus == (2, 3)
    assert config.run.eval_every == 20 and config.objective.behavior_importance == 2.0
