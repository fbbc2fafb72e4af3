"""``reward: code`` in ``dew train grpo`` and ``dew chain`` configs: the entry point this
distribution registers in ``dew.recipes``, a real run whose completions run as programs, the
one-line errors of bad ``reward_args``, and no fleet left behind (finished or failed)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from dew.cli import main
from dew.recipes.plugins import load_plugin
from dew.sandbox import recipe
from dew.sandbox.recipe import code_reward

TINY_MODEL = {"name": "qwen3", "emb_features": 16, "num_layers": 1, "num_heads": 2,
              "mlp_features": 32}  # fmt: skip
# A word-level vocabulary whose every token is a whole line of a Python block, decoded by
# concatenation: a random policy writes "```python\n", "pass\n" and "```\n" in random order,
# so some of its completions are closed blocks that run and print nothing (about half of
# uniformly random 8-token completions; the run samples 24).
VOCAB = ["```python\n", "```\n", "pass\n"]
NOTHING = json.dumps([{"stdin": "", "stdout": ""}])


def _tokenizer(directory) -> str:
    from tokenizers import Tokenizer, decoders, models

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="pass\n"))
    tok.decoder = decoders.Fuse()
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages }}"}
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return str(directory)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("code_reward")
    tok = _tokenizer(base / "tok")
    rows = [{"prompt": [0, 2], "ground_truth": NOTHING}, {"prompt": [2], "ground_truth": NOTHING}]
    (base / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
    return base, tok


def _grpo_config(files, run_dir, reward_args: str) -> str:
    base, tok = files
    path = base / f"{run_dir.name}.yaml"
    path.write_text(
        f"run: {{run_dir: {run_dir}, steps: 3, batch: 2, log_every: 1, seed: 0}}\n"
        f"model: {json.dumps(TINY_MODEL)}\n"
        "optimizer: {name: adam, learning_rate: 1e-3}\n"
        f"data: {{path: {base / 'prompts.jsonl'}, tokenizer: {tok}, max_prompt_len: 4}}\n"
        "objective: {reward: code, groups: 4, max_new_tokens: 8, "
        f"reward_args: {reward_args}}}\n"
    )
    return str(path)


def _sandbox_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dew-sandbox")]


def _children() -> list[str]:
    """This process's live child processes (ppid == our pid), read from /proc."""
    mine = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                mine.append(entry)
    return mine


def test_dew_finds_the_factory_by_its_entry_point() -> None:
    assert load_plugin("code_reward", "objective.reward", "dew-sandbox") is code_reward


def test_grpo_with_the_code_reward_runs_the_sampled_programs(files, tmp_path, capsys) -> None:
    run_dir = tmp_path / "code_run"
    args = "{runner: process, workers: 2, limits: {cpu_seconds: 2, deadline_seconds: 10}}"
    before = set(_children())
    assert main(["train", "grpo", "--config", _grpo_config(files, run_dir, args)]) == 0
    assert "trained to step 3" in capsys.readouterr().out
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3]
    # 24 completions; a score above 0 is a program that ran to completion and printed nothing.
    rewards = [r["reward/mean"] for r in records]
    assert all(0.0 <= x <= 1.0 for x in rewards) and max(rewards) > 0.0
    assert _sandbox_threads() == []
    assert set(_children()) <= before
    saved = json.load(open(run_dir / "config.json"))["objective"]
    assert saved["reward"] == "code" and saved["reward_args"]["runner"] == "process"


def test_a_run_that_fails_after_the_fleet_started_closes_it(files, tmp_path, capsys) -> None:
    run_dir = tmp_path / "bad_resume"
    config = _grpo_config(files, run_dir, "{workers: 1}")
    # resume_from is checked after prepare() started the fleet
    assert main(["train", "grpo", "--config", config, "--set", "run.resume_from=7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.resume_from" in err[0]
    assert _sandbox_threads() == []


@pytest.mark.parametrize(
    ("reward_args", "expected"),
    [
        ("{runner: vm}", "objective.reward_args.runner: expected one of process, container, "
                         "got 'vm'"),
        ("{limits: {cpu_seconds: -1}}", "objective.reward_args.limits.cpu_seconds: expected a "
                                        "positive finite number, got -1"),
        ("{limits: {memory_bytes: 1024}}", "objective.reward_args.limits.memory_bytes: expected "
                                           "at least 6 MiB"),
        ("{limits: {cpu: 1}}", "objective.reward_args.limits.cpu: unknown key"),
        ("{worker: 2}", "objective.reward_args.worker: unknown key; expected one of runner, "
                        "workers"),
        ("{workers: 0}", "objective.reward_args.workers: expected an integer >= 1, got 0"),
        ("{runner: container}", "objective.reward_args.container.image: expected an image name"),
        ("{container: {image: x}}", "objective.reward_args.container: given with runner "
                                    "'process'"),
    ],
)  # fmt: skip
def test_bad_reward_args_are_one_line_errors(files, tmp_path, capsys, reward_args, expected):
    run_dir = tmp_path / "bad"
    assert main(["train", "grpo", "--config", _grpo_config(files, run_dir, reward_args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not (run_dir / "config.json").exists()
    assert _sandbox_threads() == []


def test_a_chain_stage_names_its_own_reward_args(files, tmp_path, capsys) -> None:
    base, tok = files
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"output: {tmp_path / 'out'}\nbatch: 2\nmodel: {json.dumps(TINY_MODEL)}\n"
        "stages:\n"
        f"  - {{name: code, steps: 1, reward: code, groups: 2, max_new_tokens: 4,\n"
        f"     data: {{type: Prompts, path: {base / 'prompts.jsonl'}, tokenizer: {tok},\n"
        "            max_prompt_len: 4},\n"
        "     reward_args: {runner: process, limits: {deadline_seconds: 0}}}\n"
    )
    assert main(["chain", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stages.0.reward_args.limits.deadline_seconds: expected" in err[0]


def test_a_chain_with_the_code_reward_trains_and_closes_its_fleet(files, tmp_path, capsys):
    base, tok = files
    path = tmp_path / "chain.yaml"
    path.write_text(
        f"output: {tmp_path / 'out'}\nbatch: 2\nmodel: {json.dumps(TINY_MODEL)}\n"
        "stages:\n"
        f"  - {{name: code, steps: 1, reward: code, groups: 2, max_new_tokens: 4,\n"
        f"     data: {{type: Prompts, path: {base / 'prompts.jsonl'}, tokenizer: {tok},\n"
        "            max_prompt_len: 4}, reward_args: {workers: 1}}\n"
    )
    chain_model = json.dumps({**TINY_MODEL, "vocab_size": len(VOCAB)})
    path.write_text(path.read_text().replace(json.dumps(TINY_MODEL), chain_model))
    assert main(["chain", str(path)]) == 0
    assert "code (grpo): step 1" in capsys.readouterr().out
    assert _sandbox_threads() == []


def test_runner_container_reaches_the_container_runner_with_its_arguments(monkeypatch) -> None:
    made = []

    class Recorded:
        def __init__(self, *args, **kwargs):
            made.append((args, kwargs))

        def run(self, program, limits, cancel=None):
            raise AssertionError("no program runs in this test")

        def close(self):
            made.append("closed")

    monkeypatch.setattr(recipe, "ContainerRunner", Recorded)
    args = {"runner": "container", "workers": 3, "limits": {"memory_bytes": 64 << 20},
            "container": {"image": "img:tag", "runtime": "podman", "cpus": 0.5,
                          "oci_runtime": "runsc"}}  # fmt: skip
    context = code_reward(args)
    assert made == []  # checking the arguments reaches no engine
    with context as reward:
        assert made == [((), {"image": "img:tag", "runtime": "podman", "cpus": 0.5,
                              "oci_runtime": "runsc"})]  # fmt: skip
        assert reward.fleet.workers == 3 and reward.fleet.limits.memory_bytes == 64 << 20
    assert made[-1] == "closed"
