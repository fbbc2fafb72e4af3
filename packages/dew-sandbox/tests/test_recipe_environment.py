"""``source: {kind: environment}`` in ``dew train grpo`` (and ``ppo``) configs: tool episodes
against a real worker process from one config file. A run trains on the worker's episodes and leaves no
worker behind, a ``dew train grpo`` process killed with SIGKILL after its first checkpoint
resumes (through its episode journal) to the bit-identical final state, and bad configs are
one-line errors naming the key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dew.cli import main
from dew.recipes.plugins import load_plugin
from dew.sandbox.episode_recipe import subprocess_environment
from dew.testing import checkpoint_arrays, wait_for_checkpoint

#: A two-turn tool: ``reset`` shows ``[5, x]`` (``x = 2 + task % 3``); the first turn gets
#: ``x`` appended to its context as the tool's answer; the second completes the episode with
#: reward "1" when it says ``x`` again, else "0". ``WORKER_SLEEP`` slows each step (so a run
#: can be killed between two checkpoints); ``WORKER_DETAIL`` replaces the verdict.
WORKER = """import base64, json, os, sys, time

EOS = 1
SLEEP = float(os.environ.get("WORKER_SLEEP", "0"))
state = {"x": 0, "turn": 0}
for line in sys.stdin:
    request = json.loads(line)
    op = request["op"]
    if op == "reset":
        state = {"x": 2 + request["episode"]["task"] % 3, "turn": 0}
        reply = {"context": [5, state["x"]], "status": "running"}
    elif op == "step":
        time.sleep(SLEEP)
        state["turn"] += 1
        if state["turn"] == 1:
            reply = {"context": request["context"] + request["tokens"] + [state["x"]],
                     "status": "running"}
        else:
            hit = state["x"] in [t for t in request["tokens"] if t != EOS]
            detail = os.environ.get("WORKER_DETAIL", "1" if hit else "0")
            reply = {"context": None, "status": "completed", "detail": detail}
    elif op == "get_state":
        reply = {"state": base64.b64encode(json.dumps(state).encode()).decode()}
    elif op == "set_state":
        state = json.loads(base64.b64decode(request["state"]))
        reply = {"restored": True}
    else:
        reply = {"error": "unknown op"}
    print(json.dumps(reply), flush=True)
"""

MODEL = {"name": "causal_transformer", "vocab_size": 8, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32}  # fmt: skip


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("env_worker") / "tool_worker.py"
    path.write_text(WORKER)
    return path


def grpo_config(worker: Path, run_dir: Path, steps: int, **source) -> Path:
    """A config of 8-token turns over vocabulary 8 (EOS 1): an untrained policy ends about
    two turns in three, so each step collects completed, scored and truncated episodes."""
    config = {
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": MODEL,
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "objective": {"groups": 4, "max_new_tokens": 8, "eos_id": 1},
        "source": {"kind": "environment", "command": [sys.executable, str(worker)], "tasks": 6,
                   "max_turns": 2, "max_prompt_tokens": 16,
                   "limits": {"cpu_seconds": 10, "deadline_seconds": 60}, **source},
    }  # fmt: skip
    path = run_dir.parent / f"{run_dir.name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def workers_alive(worker: Path) -> list[str]:
    """The pids of live processes running ``worker`` (read from /proc)."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if str(worker).encode() in argv and not zombie:
            alive.append(entry)
    return alive


def test_dew_finds_the_factory_by_its_entry_point() -> None:
    found = load_plugin("subprocess_environment", "source.kind", "dew-sandbox")
    assert found is subprocess_environment


def test_a_config_trains_grpo_on_worker_episodes(tmp_path, capsys) -> None:
    worker = tmp_path / "tool_worker.py"
    worker.write_text(WORKER)
    run_dir = tmp_path / "run"
    # the worker runs in a temporary directory: its file, relative to the config, is made
    # absolute
    config = grpo_config(worker, run_dir, 2, command=[sys.executable, "tool_worker.py"])
    assert main(["train", "grpo", "--config", str(config)]) == 0
    assert "trained to step 2 (2 updates)" in capsys.readouterr().out
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]
    assert len(episodes) == 2 * 2 * 4  # steps * tasks per batch * groups
    for m in metrics:  # the loss's reward is the mean over the step's episodes
        rewards = [e["reward"] for e in episodes if e["step"] == m["step"]]
        assert len(rewards) == 8 and m["reward/mean"] == pytest.approx(np.mean(rewards))
    completed = [e for e in episodes if e["status"] == "completed"]
    assert completed and all(e["turns"] == 2 and e["detail"] in ("0", "1") for e in completed)
    assert all(e["reward"] == float(e["detail"]) for e in completed)
    assert {e["status"] for e in episodes} <= {"completed", "truncated"}
    assert {e["task"] for e in episodes} <= set(range(6))
    saved = json.load(open(run_dir / "config.json"))
    assert saved["source"]["command"] == [os.path.abspath(sys.executable), str(worker)]
    assert saved["data"] is None and (run_dir / "journal").is_dir()
    assert workers_alive(worker) == []


def test_a_config_trains_ppo_with_a_critic_on_worker_episodes(worker, tmp_path, capsys) -> None:
    import jax

    from dew.objectives.rl import ValueHead
    from dew.recipes.builder import build_model, model_config
    from dew.recipes.generate import load_model

    run_dir = tmp_path / "ppo"
    config = grpo_config(worker, run_dir, 2)
    raw = json.loads(config.read_text())
    raw["objective"].update(gamma=1.0, lam=0.95)
    config.write_text(json.dumps(raw))
    assert main(["train", "ppo", "--config", str(config)]) == 0
    assert "trained to step 2 (2 updates)" in capsys.readouterr().out
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(np.isfinite(m["loss"]) and m["critic/loss"] > 0 for m in metrics)
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    assert len(episodes) == 2 * 2 * 4 and {e["step"] for e in episodes} == {1, 2}
    assert {e["status"] for e in episodes} <= {"completed", "truncated"}
    # the checkpoint holds the critic (a ValueHead on the policy's decoder: its leaves come
    # first after step and updates), then the policy
    model, _ = build_model(model_config({**MODEL, "max_seq_len": 32}))
    ids = np.zeros((1, 1), np.int32)
    critic = jax.tree.leaves(jax.eval_shape(lambda: ValueHead(model).init(jax.random.key(0), ids)))
    policy = jax.tree.leaves(jax.eval_shape(lambda: model.init(jax.random.key(0), ids)))
    saved = [x.shape for x in checkpoint_arrays(run_dir)]
    assert saved[2 : 2 + len(critic)] == [x.shape for x in critic]
    assert saved[2 + len(critic) : 2 + len(critic) + len(policy)] == [x.shape for x in policy]
    loaded = load_model(str(run_dir))  # dew generate reads the policy half
    assert len(jax.tree.leaves(loaded.variables)) == len(policy)
    assert json.load(open(run_dir / "config.json"))["kind"] == "ppo"
    assert workers_alive(worker) == []


def dew_process(config: Path) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, "-m", "dew.cli", "train", "grpo", "--config",
                             str(config)], cwd=config.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def kill_after_first_checkpoint(
    proc: subprocess.Popen, run_dir: Path, worker: Path, steps: int
) -> None:
    """SIGKILL the run ``proc`` once it has written a checkpoint short of ``steps``, and wait
    until none of its ``worker`` processes is left (they die with their parent)."""
    assert wait_for_checkpoint(proc, run_dir, 240), "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    saved = sorted(n for n in os.listdir(run_dir / "checkpoints") if n.startswith("step_"))
    assert saved and saved[-1] < f"step_{steps:08d}"
    deadline = time.time() + 10
    while workers_alive(worker) and time.time() < deadline:
        time.sleep(0.05)
    assert workers_alive(worker) == []


STEPS = 4
#: Each tool step sleeps this long, so a collection takes a moment and the process can be
#: killed between two checkpoints; the episodes themselves do not depend on time.
SLOW = {"env": {"WORKER_SLEEP": "0.3"}}


@pytest.mark.slow
def test_a_killed_run_resumes_to_bit_identical_arrays(worker, tmp_path) -> None:
    full = tmp_path / "full"
    finish(dew_process(grpo_config(worker, full, STEPS, **SLOW)))
    expected = checkpoint_arrays(full)

    run_dir = tmp_path / "killed"
    config = grpo_config(worker, run_dir, STEPS, **SLOW)
    kill_after_first_checkpoint(dew_process(config), run_dir, worker, STEPS)

    out = finish(dew_process(config))
    assert f"trained to step {STEPS} ({STEPS} updates)" in out
    got = checkpoint_arrays(run_dir)
    assert len(got) == len(expected) > 2
    for x, y in zip(expected, got):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    assert {e["step"] for e in episodes} == set(range(1, STEPS + 1))
    assert workers_alive(worker) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"command": ["no-such-dew-worker-program"]},
         "source.command: no executable 'no-such-dew-worker-program' on PATH"),
        ({"command": ["./missing/worker"]}, "source.command: './missing/worker' is not an "
                                            "executable file"),
        ({"kind": "bogus"}, "source.kind: expected one of prompts, environment, harbor, got "
                           "'bogus'"),
        ({"max_turns": 0}, "source.max_turns: expected an integer >= 1, got 0"),
        ({"tasks": None}, "source.tasks: required, missing"),
        ({"limits": {"cpu_seconds": -1}}, "source.limits.cpu_seconds: expected a positive "
                                          "finite number, got -1"),
        ({"limits": {"cpu": 1}}, "source.limits.cpu: unknown key"),
        ({"env": {"A": 1}}, "source.env.A: expected a string, got 1"),
        ({"verifier": "nothing"}, "source.verifier: expected 'outcome' or 'module:object'"),
        ({"verifier": "no_such_dew_module:f"}, "source.verifier: cannot import module"),
        ({"bogus": 1}, "source.bogus: unknown key"),
    ],
)  # fmt: skip
def test_bad_source_keys_are_one_line_errors(worker, tmp_path, capsys, source, expected):
    run_dir = tmp_path / "bad"
    config = grpo_config(worker, run_dir, 1, **source)
    if source.get("tasks", 1) is None:
        raw = json.loads(config.read_text())
        del raw["source"]["tasks"]
        config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("section", "value", "expected"),
    [
        ("data", {"path": "prompts.jsonl"}, "data: source.kind environment draws task ids"),
        ("objective", {"reward": "math", "eos_id": 1}, "objective.reward: source.kind "
                                                       "environment scores episodes"),
        ("objective", {"groups": 4}, "objective.eos_id: required with source.kind environment"),
        ("model", {**MODEL, "vocab_size": None}, "model.vocab_size: required with source.kind "
                                                 "environment"),
    ],
)  # fmt: skip
def test_sections_environment_episodes_do_not_read_are_refused(
    worker, tmp_path, capsys, section, value, expected
):
    run_dir = tmp_path / "bad"
    config = grpo_config(worker, run_dir, 1)
    raw = json.loads(config.read_text())
    raw[section] = value
    config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not run_dir.exists()


def test_a_verdict_that_is_no_number_stops_the_run_naming_the_verifier(worker, tmp_path, capsys):
    run_dir = tmp_path / "verdict"
    config = grpo_config(worker, run_dir, 1, env={"WORKER_DETAIL": "great"})
    assert main(["train", "grpo", "--config", str(config)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "source.verifier: outcome reads the detail" in err[0], err
    assert "'great'" in err[0]
    assert workers_alive(worker) == []


def _chat_tokenizer(directory: Path) -> Path:
    """A word-level chat tokenizer of 8 ids (``<eos>`` is 1, as the worker's EOS), so an
    ``lm`` stage trains the same vocabulary-8 decoder the tool episodes sample from."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<eos>", "hi", "yes", "no", "two", "four", "."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>",
              "chat_template": "{% for m in messages %}{{ m.content }} <eos> {% endfor %}"}  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(("kind", "mode"), [("grpo", "sync"), ("ppo", "sync"), ("ppo", "async")])
def test_a_chain_trains_an_lm_stage_then_rl_on_worker_episodes(tmp_path, capsys, kind,
                                                               mode) -> None:  # fmt: skip
    """A GRPO or a PPO stage (with its critic) on worker episodes after an LM stage, the
    episodes collected by the trainer or drawn one batch ahead by dew-rollout's scheduler."""
    base = tmp_path / "configs"
    base.mkdir()
    worker = base / "chain_tool_worker.py"
    worker.write_text(WORKER)
    chat = {"messages": [{"role": "user", "content": "hi two"},
                         {"role": "assistant", "content": "four ."}]}  # fmt: skip
    (base / "chat.jsonl").write_text((json.dumps(chat) + "\n") * 4)
    _chat_tokenizer(base / "tok")
    # the worker's file and the data are named relative to the config's directory
    config = {
        "output": "out", "batch": 2, "log_every": 1,
        "model": {**MODEL, "max_seq_len": 32},
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "stages": [
            {"name": "lm", "kind": "lm", "steps": 1,
             "data": {"type": "ChatMessages", "path": "chat.jsonl", "tokenizer": "tok",
                      "seq_len": 7}},
            {"name": "tools", "kind": kind, "steps": 2, "groups": 4, "max_new_tokens": 8,
             "eos_id": 1, "source": {"kind": "environment", "command": [sys.executable,
                                                           "chain_tool_worker.py"],
                        "tasks": 6, "max_turns": 2, "max_prompt_tokens": 16,
                        "limits": {"cpu_seconds": 10, "deadline_seconds": 60}}},
        ],
    }  # fmt: skip
    if mode == "async":
        config["stages"][1].update(behavior_importance=2.0, rollout={
            "mode": "async", "ahead": 1, "truncation": "score"})  # fmt: skip
    path = base / "chain.yaml"
    path.write_text(json.dumps(config))
    assert main(["chain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lm (lm): step 1, 1 updates" in out and f"tools ({kind}): step 2, 2 updates" in out
    run_dir = base / "out" / "tools"
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(("critic/loss" in m) == (kind == "ppo") for m in metrics)
    assert len(episodes) == 2 * 2 * 4  # steps * tasks per batch * groups
    assert {e["task"] for e in episodes} <= set(range(6))
    # the scheduler keeps its own journal; the trainer's collection, the episode journal
    assert (run_dir / ("rollout-journal" if mode == "async" else "journal")).is_dir()
    if mode == "async":
        lags = [json.loads(line)["lag"] for line in open(run_dir / "rollout.jsonl")]
        assert lags == [0, 1] and {e["lag"] for e in episodes} == {0, 1}
    completed = [e for e in episodes if e["status"] == "completed"]
    assert all(e["turns"] == 2 and e["reward"] == float(e["detail"]) for e in completed)
    assert workers_alive(worker) == []


def test_a_chain_model_too_short_for_a_turn_is_one_line(tmp_path, capsys) -> None:
    """The chain's decoder must hold a turn: the context and the turn, each padded to a
    power of two (at least 16); a shorter one is refused naming both stage keys."""
    source = {"kind": "environment", "command": [sys.executable, "-c", "pass"], "tasks": 4,
              "max_prompt_tokens": 64}  # fmt: skip
    tools = {"name": "tools", "steps": 1, "eos_id": 1, "max_new_tokens": 17, "source": source}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"output": "out", "batch": 2, "model": {**MODEL, "max_seq_len": 32},
                                "stages": [tools]}))  # fmt: skip
    assert main(["chain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "dew: error: model.max_seq_len: 32 is shorter than stages.0.source.max_prompt_tokens 64 + "
        "stages.0.max_new_tokens 17 need (96;"
    ), err
    assert not (tmp_path / "out").exists()
