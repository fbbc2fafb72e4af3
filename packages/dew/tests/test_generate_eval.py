"""``dew generate`` and ``dew eval`` on a tiny SFT run: its run directory and its export give
the same completions, eval's summary matches a recomputation through ``TextGeneration``, and
bad input is refused in one line with exit status 2."""

from __future__ import annotations

import json
import math
import sys

import pytest
from _chat_tokenizer import CONVERSATIONS, build_tokenizer

from dew.cli import main

TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "2", "--log-every", "1"]  # fmt: skip
PROMPTS = [
    {"prompt": "What is two plus two?", "ground_truth": "4"},
    {"prompt": [{"role": "user", "content": "Weather in Paris?"}], "ground_truth": "sunny"},
    {"prompt": "Tom had a red ball. He kicked it to his dog. The dog ran after it. " * 3,
     "ground_truth": "dog"},
]  # fmt: skip
REWARDS = """
class Contains:
    needs = ("ground_truth",)

    def __init__(self, char):
        self.char = char

    def __call__(self, data_source, completion, ground_truth, extra_info):
        return 1.0 if self.char in completion else 0.0
"""
GEN = ["--max-prompt-len", "24", "--max-new-tokens", "6"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-step SFT run (``run``), its float32 export (``out``), prompts and a reward module."""
    base = tmp_path_factory.mktemp("geneval")
    tok = build_tokenizer(str(base / "tok"))
    data = base / "chat.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS[:2]))
    code = main(["train", "sft", "--data", str(data), "--tokenizer", tok, "--run-dir",
                 str(base / "run"), "--seq-len", "64", "--steps", "1", "--lr", "1e-2",
                 "--export", str(base / "out"), "--export-dtype", "float32", *TINY])  # fmt: skip
    assert code == 0
    (base / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    bare = [{"prompt": p["prompt"]} for p in PROMPTS]
    (base / "bare.jsonl").write_text("".join(json.dumps(p) + "\n" for p in bare))
    (base / "rewards_geneval.py").write_text(REWARDS)
    sys.path.insert(0, str(base))
    yield base
    sys.path.remove(str(base))


def _lines(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_run_dir_and_export_give_the_same_completions(run, capsys):
    outs = []
    for name in ("run", "out"):
        out = run / f"gen-{name}.jsonl"
        code = main(["generate", str(run / name), "--prompts", str(run / "prompts.jsonl"),
                     "--samples", "2", "--seed", "3", "--temperature", "1.0",
                     "--batch", "4", "--out", str(out), *GEN])  # fmt: skip
        assert code == 0
        assert "wrote 6 completions of 3 prompts" in capsys.readouterr().out
        outs.append(_lines(out))
    assert outs[0] == outs[1]
    records = outs[0]
    assert [(r["row"], r["sample"]) for r in records] == [(i, s) for i in range(3) for s in (0, 1)]
    for r in records:
        assert set(r) == {"row", "sample", "ids", "length", "finish_reason", "text"}
        assert r["length"] == len(r["ids"]) and 1 <= r["length"] <= 6
        assert r["finish_reason"] in ("eos", "length")
        if r["finish_reason"] == "length":
            assert r["length"] == 6
    assert len({tuple(r["ids"]) for r in records}) > 1  # sampled, not one repeated answer


def test_eval_matches_a_recomputation(run, capsys):
    import numpy as np

    from dew.data.prompts import Prompts
    from dew.inference import TextGeneration
    from dew.recipes.generate import load_model
    from dew.rewards import standard_error
    from dew.sampling import Sampling

    out = run / "eval.json"
    code = main(["eval", str(run / "run"), "--prompts", str(run / "prompts.jsonl"),
                 "--reward", "rewards_geneval:Contains", "--reward-args", '{"char": "e"}',
                 "--out", str(out), *GEN])  # fmt: skip
    assert code == 0
    line = capsys.readouterr().out.strip()
    saved = json.load(open(out))
    # the same greedy completions, decoded and scored here
    loaded = load_model(str(run / "run"))
    prompts = Prompts(run / "prompts.jsonl", tokenizer=loaded.tokenizer, max_prompt_len=24)
    sampler = TextGeneration(loaded.model, loaded.variables)
    contexts = [prompts.arrays["prompt"][i, 24 - int(n):]
                for i, n in enumerate(prompts.arrays["prompt_length"])]  # fmt: skip
    greedy = Sampling(temperature=0.0, eos_id=loaded.eos_id)
    gens = sampler(contexts, 6, 0, greedy)
    texts = [loaded.tokenizer.decode(g.ids[:-1] if g.eos else g.ids) for g in gens]
    rewards = [1.0 if "e" in t else 0.0 for t in texts]
    mean = float(np.mean(rewards))
    assert [r["reward"] for r in saved["rows"]] == rewards
    assert [r["text"] for r in saved["rows"]] == texts
    assert saved["n"] == 3 and saved["mean"] == pytest.approx(mean)
    assert saved["standard_error"] == pytest.approx(standard_error(mean, 3))
    assert line.startswith("eval: mean reward ")
    assert f"mean reward {mean:.6g} standard error {standard_error(mean, 3):.6g} n 3" in line


def test_a_spread_of_rewards_has_the_population_standard_error(run):
    from dew.data.prompts import Prompts
    from dew.recipes.generate import evaluate, load_model

    loaded = load_model(str(run / "out"))
    prompts = Prompts(run / "prompts.jsonl", tokenizer=loaded.tokenizer, max_prompt_len=24)
    result = evaluate(loaded, prompts, lambda s, c, g, e: float(len(g)), max_new_tokens=2)
    values = [1.0, 5.0, 3.0]  # the ground truths' lengths: 4, sunny, dog
    mean = sum(values) / 3
    var = sum((v - mean) ** 2 for v in values) / 3
    assert result["mean"] == pytest.approx(mean)
    assert result["standard_error"] == pytest.approx(math.sqrt(var / 3))


def test_help_says_long_prompts_are_truncated_from_the_left(capsys):
    for command in ("generate", "eval"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "truncated from the left, keeping its last P ids" in out and "example" in out


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing_model", "MODEL: no such directory"),
        ("no_checkpoint", "holds no checkpoint"),
        ("unknown_reward", "--reward: cannot import module 'no_such_rewards'"),
        ("missing_prompts", "--prompts: no such file or directory"),
        ("reward_needs", "--prompts: 3 of 3 rows have no 'ground_truth'"),
        ("bad_reward_args", "--reward-args: expected a JSON object"),
        ("unknown_chain_stage", "chain-config.json names no stage 'other'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, capsys, case, expected):
    model, prompts = str(run / "run"), str(run / "prompts.jsonl")
    reward = ["--reward", "math"]
    if case == "missing_model":
        model = str(tmp_path / "nothing")
    elif case == "no_checkpoint":
        (tmp_path / "config.json").write_text(json.dumps({"kind": "sft", "run": {}}))
        model = str(tmp_path)
    elif case == "unknown_reward":
        reward = ["--reward", "no_such_rewards:f"]
    elif case == "missing_prompts":
        prompts = str(tmp_path / "missing.jsonl")
    elif case == "reward_needs":
        prompts = str(run / "bare.jsonl")
    elif case == "bad_reward_args":
        reward += ["--reward-args", "{oops"]
    elif case == "unknown_chain_stage":  # a dew chain output whose record lacks the stage
        chain = {"output": "out", "model": {}, "stages": [{"name": "sft"}]}
        (tmp_path / "chain-config.json").write_text(json.dumps(chain))
        (tmp_path / "other" / "checkpoints").mkdir(parents=True)
        model = str(tmp_path / "other")
    out = tmp_path / "eval.json"
    code = main(["eval", model, "--prompts", prompts, *reward, "--out", str(out), *GEN])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("dew: error: ") and expected in err, err
    assert not out.exists()


def test_generate_refuses_a_missing_model_and_writes_nothing(run, tmp_path, capsys):
    out = tmp_path / "gen.jsonl"
    code = main(["generate", str(tmp_path / "nothing"), "--prompts",
                 str(run / "prompts.jsonl"), "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "MODEL: no such directory" in err
    assert not out.exists()


def test_a_long_prompt_is_truncated_with_a_warning(run, capsys):
    with pytest.warns(UserWarning, match="2 of 3 prompts were longer than max_prompt_len=8"):
        code = main(["generate", str(run / "out"), "--prompts", str(run / "prompts.jsonl"),
                     "--max-prompt-len", "8", "--max-new-tokens", "2"])  # fmt: skip
    assert code == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["row"] for r in lines] == [0, 1, 2] and all(r["length"] == 2 for r in lines)


def test_a_chain_stage_outside_its_config_directory_finds_its_tokenizer(run, capsys):
    """``output: ../chain-out``: the stage's relative tokenizer is read from the config's own
    directory, which ``chain-config.json`` records (it cannot be told from ``OUTPUT``)."""
    configs = run / "configs"
    configs.mkdir()
    sft = {"name": "sft", "steps": 1,
           "data": {"type": "ChatMessages", "path": "../chat.jsonl", "tokenizer": "../tok",
                    "seq_len": 63}}  # fmt: skip
    model = {"name": "causal_transformer", "emb_features": 16, "num_layers": 1, "num_heads": 2,
             "mlp_features": 32, "vocab_size": 512, "max_seq_len": 64}  # fmt: skip
    config = {"output": "../chain-out", "batch": 2, "model": model, "stages": [sft]}
    (configs / "chain.json").write_text(json.dumps(config))
    assert main(["chain", str(configs / "chain.json")]) == 0
    capsys.readouterr()
    record = json.loads((run / "chain-out" / "chain-config.json").read_text())
    assert record["_config_dir"] == str(configs.resolve())
    out = run / "gen-chain.jsonl"
    code = main(["generate", str(run / "chain-out" / "sft"), "--prompts",
                 str(run / "prompts.jsonl"), "--out", str(out), *GEN])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    records = _lines(out)
    assert len(records) == 3 and all(isinstance(r["text"], str) for r in records)
    assert main(["chain", str(configs / "chain.json")]) == 0  # a rerun: the same config
