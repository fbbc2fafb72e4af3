"""SIGTERM and SIGINT: a real ``dew train`` process stops at a step boundary, saves a
checkpoint, says so in one line, and the rerun resumes from that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dew.data import write_tokens

TINY = ["--emb-features", "16", "--layers", "1", "--heads", "2", "--mlp-features", "32",
        "--batch", "4", "--log-every", "1", "--seq-len", "8", "--checkpoint-every", "100000"]  # fmt: skip


def logged_steps(path) -> list[int]:
    if not os.path.exists(path):
        return []
    steps = []
    for line in open(path):
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return steps


def test_sigint_stops_a_fit_in_this_process_at_a_step_boundary(tmp_path):
    """SIGINT (Ctrl-C) goes through the same handler: TrainingInterrupted, checkpoint saved."""
    import itertools
    import threading

    import jax
    import optax

    from dew import models
    from dew.data import Dataset
    from dew.objectives.lm import LMObjective
    from dew.trainer import Trainer, TrainingInterrupted

    model = models.build("causal_transformer", vocab_size=16, emb_features=8, num_layers=1,
                         num_heads=2, mlp_features=16, max_seq_len=5)  # fmt: skip

    def train(partition, start=0):
        for i in itertools.count(start):
            if i == 3:  # the signal arrives while step 4's batch is being read
                threading.Timer(0, os.kill, (os.getpid(), signal.SIGINT)).start()
                time.sleep(0.5)
            text = np.random.default_rng(i).integers(0, 16, (4, 5)).astype(np.int32)
            yield {"text": text, "text_segment_ids": np.ones_like(text),
                   "text_positions": np.tile(np.arange(5, dtype=np.int32), (4, 1))}  # fmt: skip

    trainer = Trainer(LMObjective(model, 4), optax.adam(1e-2), key=jax.random.key(0),
                      progress=False)  # fmt: skip
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stopped:
        trainer.fit(Dataset(train=train, val=None, records=None, batch=4), steps=50,
                    run_dir=tmp_path)  # fmt: skip
    assert stopped.value.step == 4 and stopped.value.signal_name == "SIGINT"
    assert str(stopped.value) == (
        f"SIGINT: stopped after step 4 (checkpoint saved in {tmp_path}; run again to resume)"
    )
    assert (tmp_path / "checkpoints" / "step_00000004").is_dir()
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is put back


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143)])
def test_signal_saves_at_the_step_boundary_and_the_rerun_resumes(tmp_path, sig, code):
    tokens = write_tokens(tmp_path / "t.bin", np.random.default_rng(0).integers(0, 50, 5000))
    run_dir = tmp_path / "run"
    base = [sys.executable, "-m", "dew.cli", "train", "lm", "--tokens", tokens, "--run-dir",
            str(run_dir), *TINY]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([*base, "--steps", "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 240
    while len(logged_steps(run_dir / "metrics.jsonl")) < 3:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never logged three steps"
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    last = [line for line in err.splitlines() if line.startswith("dew: SIG")]
    assert len(last) == 1 and "Traceback" not in err, err
    stopped = int(last[0].split("stopped after step ")[1].split()[0])
    assert last[0] == (
        f"dew: {sig.name}: stopped after step {stopped} (checkpoint saved in {run_dir}; run "
        "again to resume)"
    )
    assert (run_dir / "checkpoints" / f"step_{stopped:08d}").is_dir()
    again = subprocess.run([*base, "--steps", str(stopped + 2)], capture_output=True,
                           text=True, env=env, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"dew: resuming from step {stopped} ({run_dir})" in again.stderr.splitlines()
    assert f"trained to step {stopped + 2} ({stopped + 2} updates)" in again.stdout
    assert logged_steps(run_dir / "metrics.jsonl") == list(range(1, stopped + 3))


@pytest.mark.parametrize(
    ("sig", "delay"),
    [(signal.SIGINT, 0.3), (signal.SIGINT, 1.0), (signal.SIGINT, 2.5), (signal.SIGTERM, 4.0)],
)
def test_a_signal_at_any_moment_gives_one_line_and_its_status(tmp_path, sig, delay):
    """A signal during the imports, the data reading or the first compilation is recorded,
    not raised where it lands (a half-imported jax, a library that swallows it, native
    compile code): the run stops after its first step with a checkpoint, one line, and
    130 (SIGINT) or 143 (SIGTERM). A signal during the steps stops at the next boundary."""
    tokens = write_tokens(tmp_path / "t.bin", np.random.default_rng(1).integers(0, 50, 5000))
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "dew.cli", "train", "lm", "--tokens", tokens, "--run-dir",
            str(run_dir), "--no-progress", "--steps", "100000", *TINY]  # fmt: skip
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    time.sleep(delay)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + int(sig), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"dew: {sig.name}: stopped after step "), lines
    stopped = int(lines[0].split("stopped after step ")[1].split()[0])
    assert (run_dir / "checkpoints" / f"step_{stopped:08d}").is_dir()
    assert out == ""
