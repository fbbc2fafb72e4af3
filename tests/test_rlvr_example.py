"""examples/rlvr learns: ``make_data.py`` writes the careless tutor's data, ``dew chain``
runs the config as written (SFT, then GRPO drawn one batch ahead on the native engine with
``reward: math``), and ``dew eval`` scores greedy answers to held-out problems before GRPO
(the SFT stage) and after it.

The claim: the held-out accuracy rises by more than twice the standard error of the
difference, ``2 * sqrt(se_before**2 + se_after**2)``. By design the SFT policy writes the
tutor's wrong answer (one too many) most of the time, so greedy decoding mostly fails,
while GRPO's exact-answer reward removes that slip from every problem at once; on this
machine the rise was about eight such standard errors on two data seeds."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rlvr"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu"}


def _run(*argv: str) -> str:
    proc = subprocess.run([sys.executable, *argv], env=ENV, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _eval(base: Path, stage: str) -> dict:
    out = base / f"eval-{stage}.json"
    _run("-m", "dew.cli", "eval", str(base / "runs" / stage), "--prompts",
         str(base / "data" / "test.jsonl"), "--reward", "math", "--max-new-tokens", "8",
         "--out", str(out))  # fmt: skip
    return json.loads(out.read_text())


def test_the_rlvr_chain_raises_held_out_accuracy_beyond_its_standard_error(tmp_path):
    _run(str(EXAMPLE / "make_data.py"), str(tmp_path / "data"))
    shutil.copy(EXAMPLE / "chain.yaml", tmp_path / "chain.yaml")
    out = _run("-m", "dew.cli", "chain", str(tmp_path / "chain.yaml"))
    assert "grpo (grpo): step 30, 30 updates" in out, out
    drawn = [json.loads(line) for line in open(tmp_path / "runs" / "grpo" / "rollout.jsonl")]
    lags = [r["lag"] for r in drawn]
    assert len(lags) == 30 and lags[0] == 0 and max(lags) == 1  # drawn one batch ahead
    before, after = _eval(tmp_path, "sft"), _eval(tmp_path, "grpo")
    assert before["n"] == after["n"] == 64
    margin = 2 * math.sqrt(before["standard_error"] ** 2 + after["standard_error"] ** 2)
    assert after["mean"] - before["mean"] > margin, (before["mean"], after["mean"], margin)
