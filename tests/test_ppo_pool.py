"""PPO on two real JAX processes (jax.distributed on 127.0.0.1, one CPU device each) equals
one process on the same two global devices: the same critic values, GAE targets whitened
over every process's actions, and the same parameters after two updates.

The worker is ``_ppo_pool_worker.py``; even tasks take one turn, odd ones two, so the two
ranks hold different numbers of actions and a rank-local whitening would differ.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from dew.testing import run_processes

HERE = pathlib.Path(__file__).resolve().parent
WORKER = str(HERE / "_ppo_pool_worker.py")


def launch(out, processes, devices):
    run_processes(WORKER, out, "--devices", devices, processes=processes,
                  env={"JAX_CACHE": str(out / "jax-cache")}, timeout=600)  # fmt: skip
    return [
        json.loads((out / f"ppo-{processes}-{rank}.json").read_text()) for rank in range(processes)
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process on two devices, then two processes on one device each."""
    out = tmp_path_factory.mktemp("ppo-pool")
    return out, launch(out, 1, 2), launch(out, 2, 1)


def test_two_processes_equal_one_process_on_the_same_devices(runs):
    out, (single,), pool = runs
    assert single["updates"] == pool[0]["updates"] == pool[1]["updates"] == 2
    for step, batch in enumerate(single["batches"]):
        for name, value in batch.items():
            joined = np.concatenate(
                [
                    np.asarray(pool[0]["batches"][step][name]),
                    np.asarray(pool[1]["batches"][step][name]),
                ]
            )
            np.testing.assert_array_equal(np.asarray(value), joined, err_msg=f"{step} {name}")
    with np.load(out / "params-1.npz") as a, np.load(out / "params-2.npz") as b:
        assert a.files == b.files and len(a.files) > 0
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_advantages_are_whitened_over_every_process(runs):
    _, _, pool = runs
    for step in range(2):
        parts = [pool[rank]["batches"][step] for rank in range(2)]
        keep = [(np.asarray(p["response_mask"]) > 0) & (np.asarray(p["session_index"]) >= 0)
                for p in parts]  # fmt: skip
        mine = [np.asarray(p["advantages"])[k] for p, k in zip(parts, keep)]
        assert mine[0].size != mine[1].size  # the ranks hold different action counts
        every = np.concatenate(mine).astype(np.float64)
        assert abs(every.mean()) < 1e-5 and abs(every.std(ddof=1) - 1) < 1e-4
        # each rank alone is not whitened: its own mean is off zero
        assert max(abs(m.mean()) for m in mine) > 1e-3
        # episodes are numbered over the cohort: rank 1's follow rank 0's
        sessions = [np.asarray(p["session_index"])[k] for p, k in zip(parts, keep)]
        assert sessions[0].max() < sessions[1].min()
