"""Crash recovery with a real training process (``_episode_train.py``, two CPU devices).

The run is SIGKILLed twice while a subprocess tool call is pending: during step 2 (the middle
of a two-step accumulation window) and during step 3 (right after an update). Each restart
resumes from the last checkpoint and the episode journal. The finished run must have the
same sampled actions, likelihoods and parameters as an uninterrupted one, and the tool's
audit log must show every completed tool call exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

from dew.testing import alive

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = str(HERE / "_episode_train.py")
STEPS = 3


def launch(run_dir, env):
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(run_dir), str(STEPS)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc, timeout=600):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out


def kill_when_paused(proc, pause_file, timeout=600):
    end = time.monotonic() + timeout
    while not os.path.exists(pause_file):
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before pausing:\n{proc.stdout.read()}")
        assert time.monotonic() < end, "the tool call never paused"
        time.sleep(0.05)
    worker = int(pathlib.Path(pause_file).read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    end = time.monotonic() + 10
    while alive(worker) and time.monotonic() < end:
        time.sleep(0.05)
    assert not alive(worker), "the pending tool worker survived the killed trainer"


def episodes(run_dir):
    """The last record of each episode (a resumed step records its episodes again)."""
    out = {}
    for line in (run_dir / "episodes.jsonl").read_text().splitlines():
        entry = json.loads(line)
        ident = entry["id"]
        out[(ident["step"], ident["task"], ident["sample"])] = entry
    return out


def test_sigkill_during_pending_tool_calls_resumes_identically(tmp_path):
    cache = {"JAX_CACHE": str(tmp_path / "jax-cache")}
    reference = tmp_path / "reference"
    crashed = tmp_path / "crashed"
    reference.mkdir()
    crashed.mkdir()
    finish(launch(reference, {**cache, "WORKER_AUDIT": str(reference / "audit.jsonl")}))

    audit = {"WORKER_AUDIT": str(crashed / "audit.jsonl"), **cache}
    for step in (2, 3):
        pause = str(tmp_path / f"pause-{step}")
        proc = launch(
            crashed, {**audit, "WORKER_PAUSE_FILE": pause, "WORKER_PAUSE_STEP": str(step)}
        )
        kill_when_paused(proc, pause)
        checkpoints = sorted(os.listdir(crashed / "checkpoints"))
        assert checkpoints[-1] == f"step_{step - 1:08d}"  # the previous checkpoint is intact
    finish(launch(crashed, audit))

    expected, got = episodes(reference), episodes(crashed)
    assert got.keys() == expected.keys() and len(got) == STEPS * 4 * 2
    for key in expected:
        assert got[key] == expected[key], key  # identical actions, likelihoods and rewards
    with np.load(reference / "params.npz") as a, np.load(crashed / "params.npz") as b:
        assert len(a.files) == len(b.files)
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name])

    calls = [json.loads(line) for line in (crashed / "audit.jsonl").read_text().splitlines()]
    counted = collections.Counter(json.dumps(c, sort_keys=True) for c in calls)
    assert max(counted.values()) == 1  # every completed tool call ran once
    reference_calls = (reference / "audit.jsonl").read_text().splitlines()
    assert sorted(counted) == sorted(reference_calls)
