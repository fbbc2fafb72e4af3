"""``dew chain`` with a ``lora`` section: an adapter stage (top-level keys) on a pretrained
base, a GRPO adapter stage (its own rank) on the first one's merged weights and a full-weight
DPO stage (``lora: false``), run from the CLI after the GRPO stage was stopped midway; each
adapter stage leaves its base bit-identical, writes its adapter (PEFT's layout, its base
named) and hands on the merged weights it wrote; the stopped stage resumes against the same
base; bad lora keys are one-line errors named ``lora.<key>`` or ``stages.N.lora.<key>``,
given before anything is written."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import models
from dew.cli import main
from dew.data.tokens import write_tokens
from dew.models.lora import load_peft_adapter
from dew.objectives.lora import base_digest
from dew.recipes.cli import recipe_from_config
from dew.recipes.generate import load_model
from dew.trainer import checkpoint as ckpt

PAIR = {"chosen": [5, 6, 7], "rejected": [5, 6, 3], "chosen_mask": [0, 1, 1],
        "rejected_mask": [0, 1, 1]}  # fmt: skip
PROMPTS = [{"prompt": [1, 2, 3], "ground_truth": "a"}, {"prompt": [4, 5], "ground_truth": "b"}]
TARGETS = ("q_proj", "v_proj")
STAGES = [
    {"name": "lm", "steps": 3, "data": {"type": "TokenFile", "path": "tokens.bin", "seq_len": 7}},
    {"name": "grpo", "steps": 2, "lora": {"rank": 4}, "reward": "chain_lora_rewards:low",
     "groups": 2, "max_new_tokens": 4,
     "data": {"type": "Prompts", "records": PROMPTS, "max_prompt_len": 4}},
    {"name": "dpo", "steps": 2, "beta": 0.1, "lora": False,
     "data": {"type": "PreferencePairs", "records": [PAIR], "seq_len": 8}},
]  # fmt: skip


def _config(base, output="out", stages=STAGES, lora=None):
    lora = {"rank": 2, "alpha": 4, "targets": list(TARGETS)} if lora is None else lora
    path = base / "chain.json"
    path.write_text(json.dumps({"output": output, "batch": 2, "seed": 0, "log_every": 1,
                                "model": {"pretrained": "base-model"}, "lora": lora,
                                "optimizer": {"name": "adam", "learning_rate": 3e-2},
                                "stages": stages}))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    base = tmp_path_factory.mktemp("chain-lora")
    model = models.build("causal_transformer", vocab_size=32, emb_features=16, num_layers=1,
                         num_heads=2, mlp_features=32, max_seq_len=32)  # fmt: skip
    variables = model.init(jax.random.key(7), jnp.zeros((1, 8), jnp.int32))
    models.Pretrained.from_model(model, variables).save(base / "base-model", dtype="float32")
    write_tokens(base / "tokens.bin", np.tile(np.asarray([5, 6, 7, 2], np.uint16), 32), "uint16")
    (base / "chain_lora_rewards.py").write_text(
        "def low(data_source, completion, ground_truth, extra_info):\n"
        "    ids = [int(t) for t in completion.split()]\n"
        "    return sum(i < 16 for i in ids) / max(len(ids), 1)\n"
    )
    path = _config(base)
    stopped_run = recipe_from_config(path, ["stages.1.steps=1"])
    stopped_run.stages = stopped_run.stages[:2]
    stopped_run.run()  # killed after grpo's first step, before dpo
    stopped = _frozen(base / "out" / "grpo")
    shutil.rmtree(base / "out" / "lm" / "merged")  # written again from the restored adapter
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["chain", str(path)]) == 0
    return base, base / "out", stopped, printed.getvalue()


def _params(directory):
    return jax.device_get(dict(models.load_pretrained(str(directory)).variables)["params"])


def _flat(tree, prefix=()):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = np.asarray(value)
    return out


def _only_targets_moved(before, after, targets):
    before, after = _flat(before), _flat(after)
    assert before.keys() == after.keys()
    moved = {path for path in before if not np.array_equal(before[path], after[path])}
    assert moved and all(path[-2] in targets and path[-1] == "kernel" for path in moved), moved


def _frozen(stage_dir):
    (_, newest), *_ = ckpt.list_checkpoints(stage_dir)[::-1]
    return json.load(open(f"{newest}/meta.json"))["extra"]["frozen"]


def test_adapter_stages_keep_their_base_and_hand_on_merged_weights(ran):
    base, out, _, printed = ran
    assert "lm (lm): step 3, 3 updates" in printed and "dpo (dpo): step 2" in printed
    pretrained = _params(base / "base-model")
    # lm: the adapter of the top-level section on the pretrained base
    frozen = _frozen(out / "lm")
    assert frozen == {"base": str(base / "base-model"), "sha256": base_digest(pretrained)}
    config = models.load_pretrained(str(base / "base-model")).config
    _, lora = load_peft_adapter(out / "lm" / "adapter", config)
    assert (lora.rank, lora.targets) == (2, TARGETS)
    lm = _params(out / "lm" / "merged")
    _only_targets_moved(pretrained, lm, TARGETS)
    # grpo: its own rank over the top-level keys, on lm's merged weights
    assert _frozen(out / "grpo") == {"base": str(out / "lm" / "merged"), "sha256": base_digest(lm)}
    adapter = json.load(open(out / "grpo" / "adapter" / "adapter_config.json"))
    assert adapter["r"] == 4 and adapter["base_model_name_or_path"] == str(out / "lm" / "merged")
    grpo = _params(out / "grpo" / "merged")
    _only_targets_moved(lm, grpo, TARGETS)
    # dew generate's loader reads a LoRA stage's merged weights
    loaded = load_model(str(out / "grpo"))
    for a, b in zip(jax.tree.leaves(loaded.variables["params"]), jax.tree.leaves(grpo)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # dpo (lora: false) trained every weight, starting from grpo's merged weights
    assert not (out / "dpo" / "adapter").exists()
    dpo = _flat(jax.device_get(dict(load_model(str(out / "dpo")).variables)["params"]))
    moved = [p for p, x in _flat(grpo).items() if not np.array_equal(x, dpo[p])]
    assert any(p[-2] not in TARGETS for p in moved), moved


def test_a_stage_stopped_midway_resumes_against_the_same_base(ran):
    _, out, stopped, _ = ran
    # lm restored without training; its merged weights, written again, are the same bits
    assert _frozen(out / "grpo") == stopped
    steps = [json.loads(line)["step"] for line in open(out / "grpo" / "metrics.jsonl")]
    assert steps == [1, 2]  # resumed at step 1, not retrained


@pytest.mark.parametrize(
    ("top", "change", "expected"),
    [
        ({"rank": 0}, {}, "lora.rank: expected an int >= 1, got 0"),
        ({"dropout": 1.5}, {}, "lora.dropout: expected a probability in [0, 1), got 1.5"),
        (None, {"lora": {"rnak": 2}}, "stages.1.lora.rnak: unknown key; did you mean 'rank'?"),
        (None, {"lora": {"rank": 0}}, "stages.1.lora.rank: expected an int >= 1, got 0"),
        (None, {"lora": {"targets": ["qproj"]}},
         "stages.1.lora.targets: 'qproj' matches no projection"),
        (None, {"lora": {"rank": 64}}, "stages.1.lora.rank: expected at most 16 for"),
        (None, {"lora": 3}, "stages.1.lora: expected a mapping of lora keys, or false"),
    ],
)  # fmt: skip
def test_bad_lora_keys_are_one_line_naming_the_key(ran, capsys, top, change, expected):
    base = ran[0]
    stages = [STAGES[0], {**STAGES[2], **change}]
    assert main(["chain", str(_config(base, "bad", stages, top))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dew: error: {expected}"), err
    assert not (base / "bad").exists()


def test_an_adapter_on_tool_episodes_is_refused(ran):
    """A stage of environment episodes refuses an adapter by name. (The same stage from a
    config needs dew-sandbox for its source kind; tests/test_chain_lora_episodes.py runs it.)"""
    from dew.models.lora import LoraConfig
    from dew.recipes.chain import Stage
    from dew.recipes.source_config import SourceConfig

    source = SourceConfig(kind="environment", command=[sys.executable, "-c", "pass"], tasks=4)
    expected = r"Stage.lora \(tools\): expected prompts from data \(adapters are not served"
    with pytest.raises(ValueError, match=expected):
        Stage("tools", None, steps=1, eos_id=1, max_new_tokens=4, source=source,
              lora=LoraConfig(rank=2, alpha=4))  # fmt: skip
    base = ran[0]
    with pytest.raises(TypeError, match=r"Stage.lora \(lm\): expected a LoraConfig or None"):
        recipe = recipe_from_config(_config(base, "bad", [STAGES[0]]))
        dataclasses.replace(recipe.stages[0], lora={"rank": 2})


def test_an_adapter_stage_on_sglang_is_refused_naming_the_engine_kind(ran, capsys):
    """An adapter stage drawing asynchronously needs run-time adapters (vLLM or the native
    server); SGLang is refused in one line before anything runs."""
    base = ran[0]
    engine = {"kind": "sglang", "url": "http://127.0.0.1:1", "directory": str(base)}
    grpo = {**STAGES[1], "behavior_importance": 2.0,
            "rollout": {"mode": "async", "engine": engine}}  # fmt: skip
    assert main(["chain", str(_config(base, "bad", [STAGES[0], grpo]))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = "stages.1: Stage.rollout.engine.kind (grpo): a lora section needs an engine"
    assert (
        len(err) == 1 and expected in err[0] and "expected vllm or native, got sglang" in err[0]
    ), err
    assert not (base / "bad").exists()
