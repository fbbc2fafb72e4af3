"""examples/train_rlvr.py with `--engine vllm` on the session's real vLLM CPU engine.

The example trains the quickstart's SFT stage (a few steps of the tiny preset) on the decoder
the engine serves (it reads the shape from the engine's checkpoint directory), publishes it
as version 0 through `SafetensorsReload`, runs GRPO updates one batch ahead with the draws
from the engine, pushes after each update and once more at the end. Checked: the version
advanced by one with every push, every admitted batch lay within `max_lag`, the engine then
serves the trained weights (its prompt log-probabilities equal Dew's `packed_log_probs` for
them) and the accuracies were printed. This file sorts after the engine and gateway tests
and before the scheduler test, which pushes its own weights first.
"""

from __future__ import annotations

import pathlib

import jax
import ml_dtypes
import numpy as np
from rollout_engine import prompt_log_probs, score_chains

from dew.testing import load_script

ROOT = pathlib.Path(__file__).resolve().parents[3]
TOLERANCE = 2e-4  # as in test_rollout_vllm_engine.py


def test_the_rlvr_example_on_real_vllm(vllm_engine, pretrained, tmp_path, capsys):
    example = load_script(ROOT / "examples" / "train_rlvr.py")
    steps, prompts, groups = 3, 2, 4
    args = example.arguments(
        ["--run-dir", str(tmp_path), "--size", "tiny", "--sft-scale", "0.25", "--steps",
         str(steps), "--prompts", str(prompts), "--groups", str(groups), "--held-out", "4",
         "--engine", "vllm", "--vllm-url", vllm_engine.engine.url,
         "--vllm-dir", str(vllm_engine.directory)]
    )  # fmt: skip
    summary, params = example.train(args, quiet=False)
    printed = capsys.readouterr().out
    keys = ("accuracy_before", "accuracy_after", "pushed", "versions", "lags", "served_version")
    print({key: summary[key] for key in keys})
    for kind in ("arithmetic", "python"):
        before, after = summary["accuracy_before"][kind], summary["accuracy_after"][kind]
        assert f"held-out {kind} accuracy {before:.3f} -> {after:.3f}" in printed
    # the SFT policy was version 0; each push (the scheduler's after an update, then the
    # example's of the final policy) moved the served version up by one; batch i + 1 was
    # drawn under the version served when batch i was handed over, within max_lag = 1 (a
    # step whose rewards are all equal makes no update, so no push follows it)
    assert summary["engine"] == "vllm"
    pushes = [p for p in summary["pushed"] if p is not None]
    assert pushes == list(range(1, len(pushes) + 1)) and summary["pushed"][0] is None
    assert summary["served_version"] == len(pushes) + 1
    updates, versions = summary["updates"], summary["versions"]
    assert versions == [0, *updates[:-1]]
    assert summary["lags"] == [u - v for u, v in zip(updates, versions)]
    assert max(summary["lags"]) <= 1
    assert summary["admitted_groups"] == [prompts] * steps
    scored = summary["scored"]
    assert set(scored) == {"arithmetic", "python"} and all(n > 0 for n in scored.values())
    # the engine now serves the trained policy: its prompt log-probabilities are Dew's
    trained = jax.tree.map(
        lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), params
    )
    chains = [[3, 9, 14, 5, 22, 7], [1, 30, 2, 30, 4], [11, 12, 13]]
    ours = score_chains(pretrained, trained, chains)
    worst = 0.0
    for chain, mine in zip(chains, ours):
        engine = prompt_log_probs(vllm_engine.engine.url, chain)
        np.testing.assert_allclose(engine, mine, atol=TOLERANCE)
        worst = max(worst, float(np.abs(engine - mine).max()))
    print(f"engine after the last push vs packed_log_probs: max abs difference {worst:.3g}")
