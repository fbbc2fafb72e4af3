"""``source: {kind: harbor}`` is checked before anything starts: each bad key is one line of
``dew train grpo`` naming it, and nothing is written to the run directory."""

from __future__ import annotations

import copy
import json
import sys

import pytest

from dew.cli import main
from dew.recipes.harbor_config import GatewayConfig, HarborConfig, HarborRegradeConfig, check_url
from dew.recipes.schema import ConfigError
from dew.recipes.train_config import train_config

MODEL = {"name": "qwen3", "vocab_size": 64, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32}  # fmt: skip


@pytest.fixture
def base(tmp_path, monkeypatch):
    """A valid Harbor config over one task directory (in a working directory of its own)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks" / "one").mkdir(parents=True)
    (tmp_path / "tasks" / "one" / "task.toml").write_text('version = "1.0"\n')
    (tmp_path / "tasks" / "notes").mkdir()  # no task.toml: not a task
    return {
        "run": {"run_dir": str(tmp_path / "run"), "steps": 1, "batch": 2},
        "model": MODEL,
        "objective": {"groups": 2, "behavior_importance": 2.0},
        "rollout": {"mode": "async", "engine": {"kind": "vllm", "url": "http://127.0.0.1:9",
                                                "directory": str(tmp_path)}},
        "source": {"kind": "harbor", "tasks": "tasks", "harbor": [sys.executable, "-m", "x"],
                   "model": "policy", "gateway": {"url": "http://127.0.0.1:9090/"}},
    }  # fmt: skip


def test_a_harbor_section_is_read_with_its_defaults(base, tmp_path):
    config = train_config(base, "grpo")
    source = config.source
    assert isinstance(source, HarborConfig) and config.data is None
    assert source.tasks == str(tmp_path / "tasks")
    assert source.harbor == (sys.executable, "-m", "x")
    assert source.gateway == GatewayConfig(url="http://127.0.0.1:9090", timeout=30.0)
    assert (source.agent, source.sandbox_host, source.width, source.chains) == (
        "terminus-2", "127.0.0.1", 4096, 2)  # fmt: skip
    assert config.as_dict()["source"]["gateway"]["url"] == "http://127.0.0.1:9090"


def with_change(base, path, value):
    config = copy.deepcopy(base)
    *head, last = path.split(".")
    node = config
    for key in head:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return config


DELETE = object()
BAD = [
    ("source.tasks", "nowhere", "source.tasks: expected a directory of Harbor task directories, "
     "got 'nowhere' (no such directory)"),
    ("source.tasks", "tasks/notes", "source.tasks: expected Harbor task directories (each with "
     "task.toml) in "),
    ("source.tasks", DELETE, "source.tasks: required, missing"),
    ("source.harbor", ["no-such-harbor-command"], "source.harbor: no executable "
     "'no-such-harbor-command' on PATH"),
    ("source.harbor", "harbor", "source.harbor: expected a nonempty list of strings"),
    ("source.gateway", {"url": "127.0.0.1:9090"}, "source.gateway.url: expected an http(s) "
     "root URL such as 'http://127.0.0.1:9090', got '127.0.0.1:9090'"),
    ("source.gateway", {"url": "http://h:99999"}, "source.gateway.url: expected an http(s)"),
    ("source.gateway", {"url": "http://h:1/v1"}, "source.gateway.url: expected an http(s)"),
    ("source.gateway", {"adress": "http://h:1"}, "source.gateway.adress: unknown key"),
    ("source.gateway", DELETE, "source.gateway: required, missing"),
    ("source.model", DELETE, "source.model: required, missing"),
    ("source.workers", 0, "source.workers: expected an integer >= 1, got 0"),
    ("source.width", 1, "source.width: expected an integer >= 2, got 1"),
    ("source.args", "--x", "source.args: expected a list of strings, got '--x'"),
    ("source.ready_timeout", -1, "source.ready_timeout: expected a number > 0, got -1"),
    ("source.agnet", "x", "source.agnet: unknown key; did you mean 'agent'?"),
    ("source.regrade", 3, "source.regrade: expected true, null or a mapping of re-grading keys, "
     "got 3"),
    ("source.regrade", {"tolerance": -1}, "source.regrade.tolerance: expected a finite number "
     ">= 0, got -1"),
    ("source.regrade", {"tasks": "nowhere"}, "source.regrade.tasks: expected a directory of "
     "Harbor task directories, got 'nowhere' (no such directory)"),
    ("source.regrade", {"verifier_env": {"A": 1}}, "source.regrade.verifier_env: expected a "
     "mapping of names to strings, got {'A': 1}"),
    ("source.regrade", {"args": "--x"}, "source.regrade.args: expected a list of strings"),
    ("source.regrade", {"timeout": 0}, "source.regrade.timeout: expected a number > 0, got 0"),
    ("source.regrade", {"tolerence": 0}, "source.regrade.tolerence: unknown key; did you mean "
     "'tolerance'?"),
    ("rollout.mode", "sync", "rollout.mode: source.kind harbor runs trials while the trainer "
     "updates and needs mode async, got 'sync'"),
    ("rollout", DELETE, "rollout.mode: source.kind harbor runs trials while the trainer"),
    ("rollout.engine", {"kind": "native"}, "rollout.engine.kind: source.kind harbor needs an "
     "engine behind the gateway (vllm or sglang at rollout.engine.url), got 'native'"),
    ("rollout.engine.launch", {"port": 8000}, "rollout.engine.launch.tokenizer: source.kind "
     "harbor's agents send chats, which a launched engine renders with a tokenizer"),
    ("rollout.engine.publish", "nccl", "rollout.engine.publish: source.kind harbor pushes "
     "weights by reload, got 'nccl'"),
    ("data", {"path": "p.jsonl"}, "data: source.kind harbor draws task ids from source.tasks"),
    ("objective.reward", "math", "objective.reward: source.kind harbor scores trials with each"),
]  # fmt: skip


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_harbor_config_is_one_line_naming_the_key(base, tmp_path, capsys, key, value,
                                                         message):  # fmt: skip
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(with_change(base, key, value)))
    assert main(["train", "grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dew: error: {message}"), err
    assert not (tmp_path / "run").exists()


def test_the_regrade_key_reads_true_or_a_mapping(base, tmp_path):
    assert train_config(base, "grpo").source.regrade is None
    on = train_config(with_change(base, "source.regrade", True), "grpo").source.regrade
    assert on == HarborRegradeConfig() and on.tolerance == 0.0 and on.tasks is None
    mapping = {"tolerance": 0.5, "tasks": "tasks", "environment": "docker",
               "verifier_env": {"K": "v"}, "args": ["--x"], "timeout": 30}  # fmt: skip
    config = train_config(with_change(base, "source.regrade", mapping), "grpo")
    assert config.source.regrade == HarborRegradeConfig(0.5, str(tmp_path / "tasks"), "docker",
                                                        {"K": "v"}, ("--x",), 30.0)  # fmt: skip
    assert config.as_dict()["source"]["regrade"]["verifier_env"] == {"K": "v"}


def test_regrade_tasks_are_read_from_the_config_files_folder(base, tmp_path, monkeypatch):
    from dew.cli import _file_config

    path = tmp_path / "harbor.json"
    path.write_text(json.dumps(with_change(base, "source.regrade", {"tasks": "tasks"})))
    monkeypatch.chdir(tmp_path / "tasks")  # elsewhere
    assert _file_config(str(path))["source"]["regrade"]["tasks"] == str(tmp_path / "tasks")


def test_harbor_trains_with_grpo_only(base):
    with pytest.raises(ConfigError, match="^source.kind: Harbor trials train with 'dew train "
                                          "grpo', not 'dew train ppo'"):  # fmt: skip
        train_config({k: v for k, v in base.items() if k != "rollout"}, "ppo")


def test_without_dew_rollout_the_error_names_the_source_kind(base, tmp_path, capsys, monkeypatch):
    import dew.recipes.plugins

    monkeypatch.setattr(dew.recipes.plugins, "entry_points", lambda **kw: [])
    path = tmp_path / "harbor.json"
    path.write_text(json.dumps(base))
    assert main(["train", "grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "dew: error: source.kind: needs the dew-rollout distribution"
    ), err
    assert not (tmp_path / "run" / "config.json").exists()


def test_check_url_keeps_the_root():
    assert check_url("https://gw.internal:443/", "k") == "https://gw.internal:443"
    for bad in (None, "ftp://h:1", "http://", "http://h:1?x=1"):
        with pytest.raises(ConfigError, match="^k: expected an http"):
            check_url(bad, "k")
