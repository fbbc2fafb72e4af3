"""RolloutScheduler across real processes: a run killed with SIGKILL while a batch is in flight
resumes to bit-identical parameters (NativeRolloutServer, one batch ahead), and on a
two-process trainer an admission failure on one process raises on both."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np

from dew.testing import ProcessGroup, run_processes

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_scheduler_worker.py"


def run(*args, timeout: float = 300) -> str:
    (proc,) = run_processes(WORKER, *args, pythonpath=[HERE], timeout=timeout)
    return proc.stdout


def leaves(path) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def records(out: str) -> list[dict]:
    return [json.loads(line)["record"] for line in out.splitlines() if line.startswith("{")]


def test_sigkill_mid_flight_then_resume_is_bit_identical(tmp_path):
    steps = 4
    full = records(run(tmp_path / "full.npz", steps, "--run-dir", tmp_path / "full"))
    assert [r["lag"] for r in full] == [0] + [1] * (steps - 1)
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    with ProcessGroup(WORKER, tmp_path / "killed.npz", steps, "--run-dir", run_dir,
                      "--sleep", 0.5, pythonpath=[HERE]) as group:  # fmt: skip
        proc = group.procs[0]
        deadline = time.time() + 240
        while time.time() < deadline:
            names = os.listdir(ckpts) if ckpts.exists() else []
            done = [n for n in names if n.startswith("step_")]
            if len(done) >= steps // 2 or proc.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(random.Random().uniform(0.0, 0.2))  # the last batch alone sleeps 0.5 s
        assert proc.poll() is None, "the run finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        group.wait(60, expect=-signal.SIGKILL)
    saved = sorted(n for n in os.listdir(ckpts) if n.startswith("step_"))
    assert saved and saved[-1] < f"step_{steps:08d}"
    resumed = records(run(tmp_path / "killed.npz", steps, "--run-dir", run_dir))
    # the resumed run re-read and redrew the batch that was in flight, under its old version
    assert resumed and resumed[0]["lag"] == 1 and resumed[0]["version"] == resumed[0]["updates"] - 1
    a, b = leaves(tmp_path / "full.npz"), leaves(tmp_path / "killed.npz")
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    init = leaves_of_init()
    assert max(float(np.abs(x - y).max()) for x, y in zip(init, a)) > 1e-4


def leaves_of_init() -> list[np.ndarray]:
    import jax
    from rollout_tiny import MAX_LEN, VOCAB, WIDTH

    from dew.objectives.rl.grpo import GRPOObjective
    from dew.testing import tiny_decoder

    model = tiny_decoder(VOCAB, MAX_LEN, init_std=0.5)
    variables = GRPOObjective(model, seq_len=WIDTH - 1).init(jax.random.key(0))
    return [np.asarray(x) for x in jax.tree.leaves(variables)]


def test_an_admission_failure_on_one_process_raises_on_both(tmp_path):
    ranks = run_processes(WORKER, tmp_path / "out.npz", 4, "--fail-step", 3, processes=2,
                          pythonpath=[HERE], timeout=300, expect=3)  # fmt: skip
    first, second = (rank.stdout for rank in ranks)
    # both trained two steps together (packing its own rows, pushing and rescoring as one)
    assert [r["step"] for r in records(first)] == [1, 2]
    assert [r["step"] for r in records(second)] == [1, 2]
    assert all(r["admitted_groups"] == 2 for r in records(first) + records(second))
    assert "error RuntimeError: source broke on task 1200" in second
    assert "error RemoteFailure: rank(s) [1] failed; rank 0 stopped too" in first
