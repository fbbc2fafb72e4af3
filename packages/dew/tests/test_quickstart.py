"""dew quickstart: the task, the tokenizer, the PNG writer and a whole tiny run with resume."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import zlib
from fractions import Fraction

import numpy as np
import pytest

from dew.cli import main as dew_main
from dew.quickstart import main
from dew.quickstart.command import add_command, run_command
from dew.quickstart.config import Settings
from dew.quickstart.png import Canvas, encode_png
from dew.quickstart.stages import first_difference
from dew.quickstart.task import Problem, all_problems, split
from dew.quickstart.tokenizer import END, build_tokenizer, token_id
from dew.rewards import MathReward
from dew.rewards.math_answer import last_boxed


def read_png(data: bytes) -> np.ndarray:
    """Decode an 8-bit RGB PNG with filter type 0 (what encode_png writes), checking CRCs."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        chunks.append((kind, body))
        at += 12 + length
    assert [k for k, _ in chunks][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color, _, _, _ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color) == (8, 2)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    rows = np.frombuffer(raw, np.uint8).reshape(height, 1 + 3 * width)
    assert np.all(rows[:, 0] == 0)
    return rows[:, 1:].reshape(height, width, 3)


def test_split_is_disjoint_and_seeded():
    a, b = split(20, 30, seed=0), split(20, 30, seed=1)
    assert len(a.held_out) == 30 and len(a.train) + 30 == len(all_problems(20))
    assert not set(a.train) & set(a.held_out)
    assert a.held_out != b.held_out
    assert split(20, 30, seed=0) == a
    with pytest.raises(ValueError, match="held_out"):
        split(3, 100, seed=0)


def test_worked_answers_box_the_exact_result_and_slips_do_not():
    reward = MathReward()
    rng = np.random.default_rng(0)
    for problem in all_problems(30)[::7]:
        exact = problem.a + problem.b if problem.op == "+" else problem.a - problem.b
        assert Fraction(last_boxed(problem.worked())) == exact
        assert reward("", problem.worked(), str(exact), "") == 1.0
        assert reward("", problem.wrong(rng), str(exact), "") == 0.0
    assert all_problems(100)[0].worked() == "0+0=0 \\boxed{0}"


def test_tokenizer_reads_digits_one_by_one_and_round_trips():
    problems = all_problems(30)
    tok = build_tokenizer(p.worked() for p in problems)
    text = "<|user|>37+48<|end|><|assistant|>" + problems[100].worked() + END
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    digits = [tok.decode([i]) for i in tok.encode("1234")]
    assert digits == ["1", "2", "3", "4"]
    assert ids[-1] == token_id(tok, END)
    rendered = tok.render([{"role": "user", "content": "2+2"}], add_generation_prompt=True)
    assert rendered == "<|user|>2+2<|end|><|assistant|>"


def test_png_encoder_round_trips_pixels():
    canvas = Canvas(13, 7)
    canvas.line(0, 0, 12, 6, (255, 0, 0))
    canvas.text(1, 1, "A1", (0, 0, 255))
    back = read_png(encode_png(canvas.pixels))
    np.testing.assert_array_equal(back, canvas.pixels)
    assert tuple(back[0, 0]) == (255, 0, 0) and tuple(back[6, 12]) == (255, 0, 0)
    assert (back == (0, 0, 255)).all(axis=-1).any()


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
    grpo = [json.loads(line) for line in open(os.path.join(run_dir, "grpo", "metrics.jsonl"))]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in grpo)
    assert "rewards/accuracy" in stages[1]["final_metrics"]  # a DPO metric

    with open(os.path.join(run_dir, "plot.png"), "rb") as f:
        image = read_png(f.read())
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 3  # axes, text and coloured lines

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


def test_first_difference_marks_where_the_rejected_answer_departs():
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 1  # stops early: its last id
    assert first_difference([1, 2], [1, 2, 3]) == 2
    with pytest.raises(ValueError, match="equals"):
        first_difference([1, 2], [1, 2])


def test_settings_scale_steps_and_refuse_unknown_sizes():
    base = Settings.for_size("small")
    half = Settings.for_size("small", steps=0.5, seed=3)
    assert half.sft_steps == round(base.sft_steps * 0.5) and half.seed == 3
    assert Settings.for_size("tiny", steps=0.001).grpo_steps == 2
    with pytest.raises(ValueError, match="size"):
        Settings.for_size("huge")
    with pytest.raises(ValueError, match="steps"):
        Settings.for_size("tiny", steps=0)


def test_code_form_of_a_problem() -> None:
    problem = Problem(37, "+", 48)
    assert problem.code_question == "python 37+48"
    assert problem.program() == "```python\nprint(37+48)\n```"
    assert json.loads(problem.code_tests()) == [{"stdin": "", "stdout": "85"}]


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
