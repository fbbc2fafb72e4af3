"""recipes.chain: SFT -> DPO -> GRPO over one decoder, references, restore, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from _chat_tokenizer import CONVERSATIONS, build_tokenizer

import dew.models
from dew.data.chat import ChatMessages
from dew.data.preference import PreferencePairs
from dew.data.prompts import Prompts
from dew.recipes.chain import Recipe, Stage

MODEL = {
    "name": "causal_transformer",
    "vocab_size": 420,
    "emb_features": 16,
    "num_layers": 1,
    "num_heads": 2,
    "mlp_features": 32,
    "max_seq_len": 96,
}
PAIRS = [
    {"chosen": [5, 6, 7, 8], "rejected": [5, 6, 9, 10], "chosen_mask": [0, 0, 1, 1],
     "rejected_mask": [0, 0, 1, 1]},
    {"chosen": [11, 12, 13], "rejected": [11, 12, 14], "chosen_mask": [0, 1, 1],
     "rejected_mask": [0, 1, 1]},
]  # fmt: skip
PROMPTS = [{"prompt": [1, 2, 3], "ground_truth": "7"}, {"prompt": [4, 5], "ground_truth": "9"}]


def reward(data_source, completion, ground_truth, extra_info):
    """Share of completion ids in the lower half of the vocabulary (varies across samples)."""
    ids = [int(t) for t in completion.split()]
    return sum(i < 210 for i in ids) / max(len(ids), 1)


def leaves_close(a, b, atol=1e-6):
    return all(
        np.allclose(np.asarray(x), np.asarray(y), atol=atol)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("chain")
    tok = build_tokenizer(str(base / "tok"))
    chat = base / "chat.jsonl"
    chat.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS[:2] * 10))
    (base / "rewards_for_chain.py").write_text(
        "def low_half(data_source, completion, ground_truth, extra_info):\n"
        "    ids = [int(t) for t in completion.split()]\n"
        "    return sum(i < 210 for i in ids) / max(len(ids), 1)\n"
    )
    return base, tok, chat


def make_recipe(base: Path, tok: str, chat: Path, output: Path) -> Recipe:
    spec = dict(MODEL)
    model = dew.models.build(spec.pop("name"), **spec)
    stages = (
        Stage("sft", ChatMessages(str(chat), tok, seq_len=95, shuffle=False), steps=2),
        Stage(
            "dpo",
            PreferencePairs(records=tuple(json.dumps(p) for p in PAIRS), seq_len=8),
            steps=2,
            beta=0.1,
        ),
        Stage(
            "grpo",
            Prompts(records=tuple(json.dumps(p) for p in PROMPTS), max_prompt_len=4),
            steps=2,
            beta=0.05,
            reward=reward,
            groups=2,
            max_new_tokens=4,
            sample=20,
        ),
    )
    return Recipe(
        model=model,
        optimizer=optax.adam(1e-2),
        key=jax.random.key(0),
        output=output,
        batch=4,
        stages=stages,
    )


@pytest.fixture(scope="module")
def trained(setup):
    base, tok, chat = setup
    recipe = make_recipe(base, tok, chat, base / "run")
    return recipe, recipe.run()


def test_each_stage_starts_from_the_last_and_freezes_it(trained):
    recipe, (sft, dpo, grpo) = trained
    for stage, state in zip(recipe.stages, (sft, dpo, grpo)):
        assert int(state.step) == stage.steps  # a fresh step counter per stage
        assert (Path(recipe.output) / stage.name).is_dir()
    # DPO's frozen reference is SFT's final policy, GRPO's is DPO's
    assert leaves_close(dpo.ema, sft.params)
    assert leaves_close(grpo.ema, dpo.params)
    # and each stage moved the policy away from where it started
    assert not leaves_close(dpo.params, sft.params, atol=1e-4)
    assert not leaves_close(grpo.params, dpo.params, atol=1e-4)
    assert [s.kind for s in recipe.stages] == ["sft", "dpo", "grpo"]


def test_existing_stage_directories_restore(setup, trained):
    base, tok, chat = setup
    recipe, states = trained
    lines = {
        s.name: (Path(recipe.output) / s.name / "metrics.jsonl").read_text()
        for s in recipe.stages
        if (Path(recipe.output) / s.name / "metrics.jsonl").exists()
    }
    again = make_recipe(base, tok, chat, Path(recipe.output)).run()
    for first, second in zip(states, again):
        assert int(second.step) == int(first.step)
        assert leaves_close(first.params, second.params, atol=0)
    for name, text in lines.items():  # nothing was trained again
        assert (Path(recipe.output) / name / "metrics.jsonl").read_text() == text


def test_cli_runs_a_config(setup, trained):
    base, tok, chat = setup
    recipe, states = trained
    config = {
        "output": str(recipe.output),
        "batch": 4,
        "seed": 0,
        "model": MODEL,
        "optimizer": {"name": "adam", "learning_rate": 1e-2},
        "stages": [
            {"name": "sft", "steps": 2,
             "data": {"type": "ChatMessages", "path": "chat.jsonl", "tokenizer": "tok",
                      "seq_len": 95, "shuffle": False}},
            {"name": "dpo", "steps": 2, "beta": 0.1,
             "data": {"type": "PreferencePairs", "records": PAIRS, "seq_len": 8}},
            {"name": "grpo", "steps": 2, "beta": 0.05, "reward": "rewards_for_chain:low_half",
             "groups": 2, "max_new_tokens": 4, "sample": 20,
             "data": {"type": "Prompts", "records": PROMPTS, "max_prompt_len": 4}},
        ],
    }  # fmt: skip
    path = base / "chain.json"
    path.write_text(json.dumps(config))
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4"
    )
    done = subprocess.run(
        # --set overrides the file: DPO continues one step past the 2 the file asks for
        [sys.executable, "-m", "dew.cli", "chain", str(path), "--set", "stages.1.steps=3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # the Python run recorded no config: the CLI adopts its checkpoints and says so
    assert "holds checkpoints but no chain-config.json; continuing them" in done.stderr
    assert (Path(recipe.output) / "chain-config.json").is_file()
    out = done.stdout.splitlines()
    assert out == [
        f"{s}: step {n}, {n} updates, in {Path(recipe.output) / s.split()[0]}"
        for s, n in (("sft (sft)", 2), ("dpo (dpo)", 3), ("grpo (grpo)", 2))
    ], out


def test_bad_recipes_raise(setup):
    base, tok, chat = setup
    prompts = Prompts(records=tuple(json.dumps(p) for p in PROMPTS), max_prompt_len=4)
    pairs = PreferencePairs(records=tuple(json.dumps(p) for p in PAIRS), seq_len=8)
    with pytest.raises(ValueError, match="reward"):
        Stage("grpo", prompts, steps=1)
    with pytest.raises(ValueError, match="reward"):
        Stage("dpo", pairs, steps=1, reward=reward)
    with pytest.raises(TypeError, match="data"):
        Stage("x", [1, 2, 3], steps=1)
    with pytest.raises(ValueError, match="steps"):
        Stage("dpo", pairs, steps=0)
    with pytest.raises(ValueError, match="name"):
        Stage("a/b", pairs, steps=1)
    model = dew.models.build(
        "causal_transformer", **{k: v for k, v in MODEL.items() if k != "name"}
    )
    with pytest.raises(ValueError, match="distinct"):
        Recipe(model, optax.adam(1e-3), jax.random.key(0), base / "x", 4,
               (Stage("a", pairs, steps=1), Stage("a", pairs, steps=1)))  # fmt: skip
    with pytest.raises(ValueError, match="batch"):
        Recipe(
            model, optax.adam(1e-3), jax.random.key(0), base / "x", 0, (Stage("a", pairs, steps=1),)
        )


def test_grpo_stage_passes_decode_eos_and_temperature_to_the_rollout(setup):
    base, tok, chat = setup
    prompts = Prompts(records=tuple(json.dumps(p) for p in PROMPTS), max_prompt_len=4)
    model = dew.models.build(
        "causal_transformer", **{k: v for k, v in MODEL.items() if k != "name"}
    )

    def decode(ids):
        return "|".join(str(int(i)) for i in ids)

    tuned = Stage("g", prompts, steps=1, reward=reward, temperature=0.3, eos_id=7, decode=decode)
    plain = Stage("p", prompts, steps=1, reward=reward, sample=5)
    recipe = Recipe(model, optax.adam(1e-3), jax.random.key(0), base / "opts", 2, (tuned, plain))
    objective, rollout = recipe.objective(tuned, None)
    assert objective.sampling_temperature == 0.3 and rollout.rescore
    assert rollout.sampling.temperature == 0.3 and rollout.sampling.eos_id == 7
    assert rollout.decode([3, 4]) == "3|4"
    objective, rollout = recipe.objective(plain, None)  # SampledRollout's defaults
    assert objective.sampling_temperature is None
    assert rollout.sampling.temperature == 1.0 and rollout.sampling.eos_id is None
    assert rollout.sampling.top_k == 5 and rollout.decode([3, 4]) == "3 4"


def test_rollout_options_are_checked(setup):
    prompts = Prompts(records=tuple(json.dumps(p) for p in PROMPTS), max_prompt_len=4)
    pairs = PreferencePairs(records=tuple(json.dumps(p) for p in PAIRS), seq_len=8)
    with pytest.raises(ValueError, match=r"Stage.temperature \(g\): expected a finite number > 0"):
        Stage("g", prompts, steps=1, reward=reward, temperature=0.0)
    with pytest.raises(ValueError, match=r"Stage.temperature \(g\).*got True"):
        Stage("g", prompts, steps=1, reward=reward, temperature=True)
    with pytest.raises(ValueError, match=r"Stage.eos_id \(d\): only a Prompts \(GRPO\) stage"):
        Stage("d", pairs, steps=1, eos_id=3)
    with pytest.raises(ValueError, match=r"Stage.decode \(d\).*PreferencePairs"):
        Stage("d", pairs, steps=1, decode=str)
    with pytest.raises(TypeError, match=r"Stage.decode \(g\): expected a callable"):
        Stage("g", prompts, steps=1, reward=reward, decode="text")
    with pytest.raises(ValueError, match=r"Stage.nll_weight \(g\): only a PreferencePairs"):
        Stage("g", prompts, steps=1, reward=reward, nll_weight=1.0)


def test_dpo_stage_passes_its_nll_weight(setup, tmp_path):
    model = dew.models.build(
        "causal_transformer", **{k: v for k, v in MODEL.items() if k != "name"}
    )
    pairs = PreferencePairs(records=tuple(json.dumps(p) for p in PAIRS), seq_len=8)
    rpo, plain = Stage("r", pairs, steps=1, nll_weight=0.5), Stage("d", pairs, steps=1)
    recipe = Recipe(model, optax.adam(1e-3), jax.random.key(0), tmp_path, 2, (rpo, plain))
    assert recipe.objective(rpo, None)[0].nll_weight == 0.5
    assert recipe.objective(plain, None)[0].nll_weight == 0.0
