"""dew quickstart: its settings, the DPO pairs, the plot and a whole tiny run with resume."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from dew.cli import main as dew_main
from dew.data.arithmetic import careless, split
from dew.quickstart import main
from dew.quickstart.command import add_command, run_command
from dew.quickstart.config import Settings
from dew.quickstart.pairs import Pair, PreferenceCheck, parting_index
from dew.quickstart.plot import StageSeries, write_plot


def read_image(path: str) -> np.ndarray:
    """The pixels of a PNG written by the quickstart, decoded by matplotlib."""
    from matplotlib.image import imread

    return np.asarray(imread(path))


def test_plot_draws_one_panel_per_quantity(tmp_path):
    from matplotlib.figure import Figure

    stages = [
        StageSeries("sft", 4, ((2, 2.0), (4, 1.0)), (), (0.0, 0.5), (0.0, 0.035), None, 3.0),
        StageSeries("dpo", 2, ((2, 0.6),), (), (0.5, 0.6), (0.035, 0.035), (0.1, 0.9), 1.0),
        StageSeries("grpo", 4, ((2, 0.1), (4, 0.0)), ((2, 0.5), (4, 0.7)), (0.6, 0.7),
                    (0.035, 0.03), None, 2.0),
    ]  # fmt: skip
    drawn: list[Figure] = []
    original = Figure.savefig

    def keep(self, *args, **kwargs):
        drawn.append(self)
        return original(self, *args, **kwargs)

    Figure.savefig = keep  # type: ignore[method-assign]
    try:
        write_plot(str(tmp_path / "plot.png"), stages)
    finally:
        Figure.savefig = original  # type: ignore[method-assign]
    image = read_image(str(tmp_path / "plot.png"))
    assert image.shape[0] > 400 and image.shape[1] > 600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]  # no temporary left
    (figure,) = drawn
    titles = [ax.get_title() for ax in figure.axes]
    assert len(titles) == 6 and len(set(titles)) == 6
    for ax in figure.axes:
        assert ax.get_ylabel() and ax.get_legend() is not None, ax.get_title()
    accuracy = figure.axes[0]
    (line,) = accuracy.lines[:1]
    np.testing.assert_allclose(np.asarray(line.get_ydata(), float), [0.0, 0.5, 0.6, 0.7])
    reward = next(ax for ax in figure.axes if "reward" in ax.get_title())
    np.testing.assert_allclose(np.asarray(reward.lines[0].get_ydata(), float), [0.5, 0.7])
    with pytest.raises(ValueError, match="stages"):
        write_plot(str(tmp_path / "empty.png"), [])


def test_preference_check_ranks_the_right_id_by_the_model():
    import jax
    import jax.numpy as jnp

    from dew import models

    model = models.build("causal_transformer", vocab_size=12, emb_features=16, num_layers=1,
                         num_heads=2, mlp_features=32, max_seq_len=8)  # fmt: skip
    variables = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    pairs = [
        Pair((1, 2), (3,), 4, 5, (6, 11), "q", "c", "r"),
        Pair((1,), (), 6, 7, (), "q", "c", "r"),
        Pair((2, 3, 4), (5, 6), 8, 9, (10,), "q", "c", "r"),
    ]
    apply = jax.jit(model.apply)
    expected = []
    for pair in pairs:
        log_probs = jax.nn.log_softmax(apply(variables, jnp.asarray([pair.context]))[0, -1])
        expected.append(bool(log_probs[pair.chosen_id] > log_probs[pair.rejected_id]))
    check = PreferenceCheck(model, pairs, pad_id=0)
    assert check(variables) == pytest.approx(np.mean(expected))
    flipped = [
        Pair(p.prompt, p.prefix, p.rejected_id, p.chosen_id, (), "q", "c", "r") for p in pairs
    ]
    assert check(variables) + PreferenceCheck(model, flipped, pad_id=0)(variables) == 1.0
    record = json.loads(pairs[0].record())  # the whole right answer; the wrong id alone
    assert record["chosen"] == [1, 2, 3, 4, 6, 11] and record["rejected"] == [1, 2, 3, 5]
    assert record["chosen_mask"] == [0, 0, 1, 1, 1, 1]
    assert record["rejected_mask"] == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="pairs"):
        PreferenceCheck(model, [], pad_id=0)


def _snapshot(run_dir: str) -> dict[str, tuple[int, int]]:
    out = {}
    for root, _, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            stat = os.stat(path)
            out[os.path.relpath(path, run_dir)] = (stat.st_size, stat.st_mtime_ns)
    return out


def test_tiny_run_writes_summary_metrics_plot_and_resumes(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    argv = ["--size", "tiny", "--steps", "0.5", "--run-dir", run_dir, "--progress", "off"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "accuracy before" in out

    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["complete"] is True
    stages = summary["stages"]
    assert [s["name"] for s in stages] == ["sft", "dpo", "grpo"]
    for previous, stage in zip(stages, stages[1:]):
        assert stage["accuracy_before"] == previous["accuracy_after"]
    for stage in stages:
        assert {"name", "accuracy_before", "accuracy_after", "seconds"} <= set(stage)
        assert 0.0 <= stage["accuracy_before"] <= 1.0 and 0.0 <= stage["accuracy_after"] <= 1.0
        assert stage["seconds"] > 0 and stage["held_out"] == 32
        metrics = os.path.join(run_dir, stage["name"], "metrics.jsonl")
        records = [json.loads(line) for line in open(metrics, encoding="utf-8")]
        assert records and records[-1]["step"] == stage["steps"]
        assert all(np.isfinite(r["loss"]) for r in records)
        assert stage["final_metrics"]["step"] == stage["steps"]
        for side in ("before", "after"):
            accuracy = stage[f"accuracy_{side}"]
            assert stage[f"standard_error_{side}"] == pytest.approx(
                np.sqrt(accuracy * (1 - accuracy) / 32), abs=1e-4
            )
        for example in stage["changed"]:
            assert example["correct_before"] != example["correct_after"]
    grpo = [json.loads(line) for line in open(os.path.join(run_dir, "grpo", "metrics.jsonl"))]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in grpo)
    assert summary["reward_curves"]["grpo"] == [[r["step"], r["reward/mean"]] for r in grpo]
    assert set(summary["reward_curves"]) == {"grpo"}
    dpo = stages[1]
    assert "rewards/accuracy" in dpo["final_metrics"]  # a DPO metric
    pairs = [json.loads(line) for line in open(os.path.join(run_dir, "data", "dpo.jsonl"))]
    assert dpo["pairs"] == len(pairs) > 0
    for pair in pairs:  # the right answer, and the wrong id where the answers part
        at = len(pair["rejected"]) - 1
        assert pair["chosen"][:at] == pair["rejected"][:at]
        assert pair["chosen"][at] != pair["rejected"][at]
        assert pair["rejected_mask"] == [0] * at + [1]
        assert pair["chosen_mask"] == [0] * len(pair["prompt"]) + [1] * (
            len(pair["chosen"]) - len(pair["prompt"])
        )
        assert pair["chosen_text"] != pair["rejected_text"]
    for side in ("before", "after"):
        assert 0.0 <= dpo[f"preference_accuracy_{side}"] <= 1.0
    assert all("+" in pair["question"] for pair in pairs)  # DPO draws additions only
    settings = Settings.for_size("tiny", steps=0.5)
    train = split(settings.limit, settings.held_out, settings.seed).train
    slips = careless(train, settings.sft_slip_rate, settings.seed)
    sft = [json.loads(line) for line in open(os.path.join(run_dir, "data", "sft.jsonl"))]
    answers = [row["messages"][1]["content"] for row in sft]
    assert answers == [p.careless() if c else p.worked() for p, c in zip(train, slips)]
    assert 0 < sum(slips) < sum(p.careless() is not None for p in train)

    image = read_image(os.path.join(run_dir, "plot.png"))
    assert image.shape[0] > 400 and image.shape[1] > 600
    assert "held-out accuracy" in out and "ranks the right id" in out

    before = _snapshot(run_dir)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "complete" in out and "training" not in out
    assert _snapshot(run_dir) == before

    # The same through a `dew` subcommand registered with add_command.
    parser = argparse.ArgumentParser(prog="dew")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["quickstart", *argv])
    assert args.command == "quickstart" and run_command(args) == 0
    assert "complete" in capsys.readouterr().out
    assert dew_main(["quickstart", *argv]) == 0  # the `dew` console script
    assert "complete" in capsys.readouterr().out
    assert _snapshot(run_dir) == before

    # A directory whose last stage is missing trains only that stage; the others restore.
    os.remove(os.path.join(run_dir, "summary.json"))
    os.remove(os.path.join(run_dir, "grpo", "result.json"))
    shutil.rmtree(os.path.join(run_dir, "grpo", "checkpoints"))
    sft_checkpoints = sorted(os.listdir(os.path.join(run_dir, "sft", "checkpoints")))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[sft] finished earlier" in out and "[dpo] finished earlier" in out
    assert "[grpo] training" in out and "[sft] training" not in out
    assert sorted(os.listdir(os.path.join(run_dir, "sft", "checkpoints"))) == sft_checkpoints
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        again = json.load(f)
    assert again["stages"][:2] == stages[:2]
    assert again["stages"][2]["accuracy_before"] == stages[1]["accuracy_after"]


def test_other_settings_in_the_same_run_dir_are_refused(tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump({"size": "small"}, f)
    with pytest.raises(SystemExit, match="other settings"):
        main(["--size", "tiny", "--steps", "0.1", "--run-dir", run_dir, "--progress", "off"])


def test_parting_index_marks_where_the_rejected_answer_departs():
    assert parting_index([1, 2, 3], [1, 5, 3]) == 1
    assert parting_index([1, 2, 3], [4, 2, 3]) == 0
    assert parting_index([1, 2, 3], [1, 2]) is None  # a prefix: no id to prefer
    assert parting_index([1, 2], [1, 2]) is None


def test_settings_scale_steps_and_refuse_unknown_sizes():
    base = Settings.for_size("small")
    half = Settings.for_size("small", steps=0.5, seed=3)
    assert half.sft_steps == round(base.sft_steps * 0.5) and half.seed == 3
    assert Settings.for_size("tiny", steps=0.001).grpo_steps == 2
    with pytest.raises(ValueError, match="size"):
        Settings.for_size("huge")
    with pytest.raises(ValueError, match="steps"):
        Settings.for_size("tiny", steps=0)


def test_settings_refuse_a_slip_rate_outside_0_1_and_unknown_dpo_operators() -> None:
    base = Settings.for_size("tiny")
    assert base.sft_slip_rate == 0.7 and base.dpo_operators == "+"
    with pytest.raises(ValueError, match=r"sft_slip_rate: expected a share in \[0, 1\], got 1.5"):
        dataclasses.replace(base, sft_slip_rate=1.5)
    for bad in ("", "*", "+*"):
        with pytest.raises(ValueError, match="dpo_operators: expected"):
            dataclasses.replace(base, dpo_operators=bad)


def test_code_without_the_sandbox_distribution_says_what_to_install(monkeypatch) -> None:
    import dew.quickstart.plugins as plugins

    monkeypatch.setattr(plugins, "entry_points", lambda **_: ())
    with pytest.raises(SystemExit, match="install the dew-sandbox distribution"):
        plugins.load_code_reward()


def test_settings_record_the_code_stage() -> None:
    plain = Settings.for_size("tiny")
    code = Settings.for_size("tiny", code=True, steps=2.0)
    assert plain.code is False and code.code is True
    assert code.code_steps == 2 * plain.code_steps
    assert plain.as_dict() != code.as_dict()


def test_flow_without_the_flow_distribution_says_what_to_install(monkeypatch) -> None:
    import dew.quickstart.plugins as plugins

    monkeypatch.setattr(plugins, "entry_points", lambda **_: ())
    with pytest.raises(SystemExit, match="install the dew-flow distribution"):
        main(["--flow", "--run-dir", "unused"])


def test_grpo_warms_up_while_dpo_starts_at_its_full_rate() -> None:
    import jax.numpy as jnp

    settings = Settings.for_size("small")
    params = {"w": jnp.zeros(3)}
    grads = {"w": jnp.array([1.0, -2.0, 0.5])}

    def steps(stage: str, n: int) -> list[float]:
        optimizer = settings.optimizer(stage)
        state = optimizer.init(params)
        sizes = []
        for _ in range(n):
            updates, state = optimizer.update(grads, state, params)
            sizes.append(float(jnp.max(jnp.abs(updates["w"]))))
        return sizes

    grpo = steps("grpo", settings.grpo_warmup + 2)
    assert settings.grpo_warmup == 10
    assert grpo[0] == 0.0  # a fresh Adam's first step would move every weight by the full rate
    assert grpo[1] == pytest.approx(settings.grpo_lr / settings.grpo_warmup, rel=1e-3)
    assert grpo[-1] == pytest.approx(settings.grpo_lr, rel=1e-3)
    assert steps("dpo", 1)[0] == pytest.approx(settings.dpo_lr, rel=1e-3)


def test_lora_settings_adapt_every_stage_after_sft_at_a_larger_rate() -> None:
    full, lora = Settings.for_size("small"), Settings.for_size("small", lora=True)
    assert full.lora_rank == 0 and all(full.lora(s) is None for s in ("sft", "dpo", "grpo"))
    assert lora.lora_rank == 8 and lora.lora("sft") is None
    for stage in ("dpo", "grpo", "code"):
        config = lora.lora(stage)
        assert (config.rank, config.alpha) == (8, 16.0) and "down_proj" in config.targets
    assert full.as_dict() != lora.as_dict()  # a --lora run never resumes a full one
    import jax.numpy as jnp

    params, grads = {"w": jnp.zeros(2)}, {"w": jnp.ones(2)}
    for settings, rate in ((full, full.dpo_lr), (lora, full.dpo_lr * lora.lora_lr_scale)):
        optimizer = settings.optimizer("dpo")
        updates, _ = optimizer.update(grads, optimizer.init(params), params)
        assert float(jnp.abs(updates["w"][0])) == pytest.approx(rate, rel=1e-3)


def test_a_lora_run_hands_each_stage_the_merged_adapter(tmp_path) -> None:
    run_dir = str(tmp_path / "lora")
    argv = ["--size", "tiny", "--steps", "0.1", "--lora", "--run-dir", run_dir]
    assert main([*argv, "--progress", "off"]) == 0
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["settings"]["lora_rank"] == 8
    assert not os.path.exists(os.path.join(run_dir, "sft", "adapter"))
    for stage in ("dpo", "grpo"):
        for part in ("adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                     "merged/config.json"):  # fmt: skip
            assert os.path.isfile(os.path.join(run_dir, stage, part)), (stage, part)
    # each stage starts from the policy the one before handed on (the merged weights)
    sft, dpo, grpo = summary["stages"]
    assert dpo["accuracy_before"] == sft["accuracy_after"]
    assert grpo["accuracy_before"] == dpo["accuracy_after"]
