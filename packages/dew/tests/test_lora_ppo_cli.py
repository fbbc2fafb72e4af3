"""``dew train ppo`` with a LoRA adapter (the ``--lora-*`` flags): the pretrained base stays
bit-identical while the policy's adapter and the critic train, ``RUN_DIR/adapter`` loads in
PEFT's layout, ``--export`` holds the merged policy (its targeted kernels alone moved), the
held-out reward samples the adapter's policy, and a run stopped after step 1 resumes to the
same bits as one run straight through."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from dew import models
from dew.cli import main
from dew.models.lora import BASE, load_peft_adapter
from dew.recipes.train import run_train
from dew.recipes.train_config import train_config

TARGETS = ("q_proj", "v_proj")
LORA = ["--lora-rank", "2", "--lora-alpha", "4", "--lora-targets", ",".join(TARGETS)]
PROMPTS = [{"prompt": [1, 2, 3], "ground_truth": "a"}, {"prompt": [4, 5], "ground_truth": "b"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("lora-ppo-cli")
    model = models.build("causal_transformer", vocab_size=32, emb_features=16, num_layers=1,
                         num_heads=2, mlp_features=32, max_seq_len=32)  # fmt: skip
    variables = model.init(jax.random.key(5), jnp.zeros((1, 8), jnp.int32))
    models.Pretrained.from_model(model, variables).save(base / "base-model", dtype="float32")
    (base / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS * 2))
    (base / "lora_ppo_cli_rewards.py").write_text(
        "def low(data_source, completion, ground_truth, extra_info):\n"
        "    ids = [int(t) for t in completion.split()]\n"
        "    return sum(i < 16 for i in ids) / max(len(ids), 1)\n"
    )
    return base


def mapping(base, run_dir, steps):
    return {
        "kind": "ppo",
        "run": {"run_dir": str(run_dir), "steps": steps, "batch": 2, "log_every": 1,
                "checkpoint_every": 1, "progress": False},
        "model": {"pretrained": str(base / "base-model")},
        "optimizer": {"name": "adam", "learning_rate": 3e-2},
        "data": {"path": str(base / "prompts.jsonl"), "max_prompt_len": 4},
        "objective": {"reward": "lora_ppo_cli_rewards:low", "max_new_tokens": 4, "groups": 2,
                      "beta": 0.1},
        "lora": {"rank": 2, "alpha": 4, "targets": list(TARGETS)},
    }  # fmt: skip


def flat(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = np.asarray(jax.device_get(value))
    return out


@pytest.fixture(scope="module")
def ran(files, tmp_path_factory):
    """A run stopped after step 1 through the CLI, resumed to step 2, and one run of 2."""
    out = tmp_path_factory.mktemp("lora-ppo-runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(files)
        path = out / "ppo.yaml"
        config = mapping(files, out / "stopped", 2)
        del config["lora"]  # the flags give it
        path.write_text(yaml.safe_dump(config))
        code = main(["train", "ppo", "--config", str(path), "--set", "run.steps=1", *LORA,
                     "--eval-every", "1", "--val-data", str(files / "prompts.jsonl")])  # fmt: skip
        assert code == 0
        resumed = run_train(train_config(mapping(files, out / "stopped", 2), "ppo"))
        whole_config = mapping(files, out / "whole", 2)
        whole_config["run"]["export"] = str(out / "export")
        whole_config["run"]["export_dtype"] = "float32"
        whole = run_train(train_config(whole_config, "ppo"))
    return out, jax.device_get(resumed.params), jax.device_get(whole.params)


def test_the_base_stays_and_the_adapter_and_critic_train(files, ran):
    out, _, params = ran
    assert set(params) == {"params", BASE} and set(params["params"]) == {"policy", "critic"}
    base = flat(dict(models.load_pretrained(str(files / "base-model")).variables)["params"])
    kept = flat(params[BASE]["policy"])
    assert kept.keys() == base.keys()
    assert all(np.array_equal(kept[p], base[p]) for p in base)  # bit-identical
    adapter = flat(params["params"]["policy"])
    assert any(p[-1] == "b" and np.abs(v).max() > 0 for p, v in adapter.items())  # b starts at 0
    critic = flat(params["params"]["critic"])
    backbone = {p[1:]: v for p, v in critic.items() if p[0] == "backbone"}
    assert backbone.keys() == base.keys()  # the critic started from the policy's decoder
    assert all(not np.array_equal(backbone[p], base[p]) for p in base)  # every leaf trained
    records = [json.loads(x) for x in open(out / "whole" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2]
    assert all(np.isfinite(r["loss"]) and r["critic/loss"] > 0 for r in records)


def test_the_adapter_loads_and_the_export_is_the_merged_policy(files, ran):
    out, _, params = ran
    config = models.load_pretrained(str(files / "base-model")).config
    adapters, lora = load_peft_adapter(out / "whole" / "adapter", config)
    assert (lora.rank, lora.alpha, lora.targets) == (2, 4.0, TARGETS)
    ours, loaded = flat(params["params"]["policy"]), flat(dict(adapters))
    assert ours.keys() == loaded.keys()
    assert all(np.array_equal(ours[p], loaded[p]) for p in ours)
    base = flat(dict(models.load_pretrained(str(files / "base-model")).variables)["params"])
    merged = flat(dict(models.load_pretrained(str(out / "export")).variables)["params"])
    assert merged.keys() == base.keys()  # the policy alone: no critic
    moved = {p for p in base if not np.array_equal(base[p], merged[p])}
    assert moved and all(p[-2] in TARGETS and p[-1] == "kernel" for p in moved), moved


def test_a_run_stopped_after_step_one_resumes_bit_identically(ran):
    out, resumed, whole = ran
    a, b = flat(resumed), flat(whole)
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[p], b[p]) for p in a)
    meta_dirs = sorted((out / "stopped" / "checkpoints").iterdir())
    first = json.load(open(meta_dirs[0] / "meta.json"))
    assert first["step"] == 1 and set(first["extra"]["frozen"]) == {"base", "sha256"}
    (record,) = [json.loads(x) for x in open(out / "stopped" / "metrics.jsonl")][:1]
    # the held-out reward of the stopped run: greedy completions of the adapter's policy
    assert 0.0 <= record["val/reward"] <= 1.0 and record["val/prompts"] == 4
