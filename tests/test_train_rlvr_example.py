"""examples/train_rlvr.py runs end to end, shortened: quickstart SFT (a few steps of the tiny
preset), then GRPO one batch ahead on a NativeRolloutServer, arithmetic scored by MathReward
and programs by CodeReward on a ProcessRunner fleet, held-out accuracy before and after."""

from __future__ import annotations

import pathlib

from dew.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_rlvr_example_runs_one_batch_ahead(tmp_path):
    example = load_script(ROOT / "examples" / "train_rlvr.py")
    steps, prompts, groups = 3, 2, 4
    summary = example.main(
        ["--run-dir", str(tmp_path), "--size", "tiny", "--sft-scale", "0.25", "--steps",
         str(steps), "--prompts", str(prompts), "--groups", str(groups), "--held-out", "4"],
        quiet=True,
    )  # fmt: skip
    # batch i + 1 was drawn from the weights served when batch i was handed over (a step whose
    # rewards are all equal makes no update, so that is not always one update behind)
    updates, versions = summary["updates"], summary["versions"]
    assert versions == [0, *updates[:-1]]
    assert summary["lags"] == [u - v for u, v in zip(updates, versions)]
    assert max(summary["lags"]) <= 1
    assert summary["admitted_groups"] == [prompts] * steps
    # every trained rollout was verified by the reward of its kind, arithmetic and code mixed
    # (the batch submitted ahead of the last step may be scored too before it is cancelled)
    scored = summary["scored"]
    assert steps * prompts * groups <= sum(scored.values()) <= (steps + 1) * prompts * groups
    assert set(scored) == {"arithmetic", "python"} and all(n > 0 for n in scored.values())
    for accuracy in (summary["accuracy_before"], summary["accuracy_after"]):
        assert set(accuracy) == {"arithmetic", "python"}
        assert all(0.0 <= value <= 1.0 for value in accuracy.values())
    assert summary["held_out"] == 4 and summary["waited"] >= 0.0
