"""Episodes collected by two real JAX processes (jax.distributed on 127.0.0.1, one CPU device
each) equal one process on the same two global devices; faults on one rank end every rank.

The worker is ``_episode_pool_worker.py``. Episodes of even tasks take one turn, odd ones
three, so the two ranks finish their slots in different rounds.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from dew.testing import run_processes

HERE = pathlib.Path(__file__).resolve().parent
WORKER = str(HERE / "_episode_pool_worker.py")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One output directory and one compilation cache for every process of this module."""
    root = tmp_path_factory.mktemp("pool")
    return root


def launch(out, mode, processes, devices, cache):
    run_processes(WORKER, out, mode, "--devices", devices, processes=processes,
                  env={"JAX_CACHE": str(cache)}, timeout=600)  # fmt: skip
    return [
        json.loads((out / f"{mode}-{processes}-{rank}.json").read_text())
        for rank in range(processes)
    ]


def test_two_processes_equal_one_process_on_the_same_devices(shared):
    cache = shared / "jax-cache"
    (single,) = launch(shared, "train", 1, 2, cache)
    pool = launch(shared, "train", 2, 1, cache)

    def key(e):
        return (e["id"]["step"], e["id"]["task"], e["id"]["sample"])

    expected = sorted(single["episodes"], key=key)
    got = sorted(pool[0]["episodes"] + pool[1]["episodes"], key=key)
    assert got == expected  # actions, raw and behavior likelihoods, rewards
    turns = {e["id"]["task"]: len(e["tokens"]) for e in got if e["status"] == "completed"}
    assert turns.get(0, 1) == 1 and turns.get(1, 3) == 3  # the ranks ran different turn counts
    for step, batch in enumerate(single["batches"]):
        for name, value in batch.items():
            joined = np.concatenate(
                [
                    np.asarray(pool[0]["batches"][step][name]),
                    np.asarray(pool[1]["batches"][step][name]),
                ]
            )
            np.testing.assert_array_equal(np.asarray(value), joined, err_msg=f"{step} {name}")
    with np.load(shared / "params-1.npz") as a, np.load(shared / "params-2.npz") as b:
        for name in a.files:
            np.testing.assert_array_equal(a[name], b[name])
    assert single["open"] == pool[0]["open"] == pool[1]["open"] == 0


def test_faults_on_one_rank_end_every_rank(shared):
    ranks = launch(shared, "faults", 2, 1, shared / "jax-cache")
    for report in ranks:
        assert report["mismatch"].startswith("CohortMismatch: cohort: rank")
        assert report["opened_after_mismatch"] == 0
        assert report["open"] == 0
    assert ranks[1]["failure"].startswith("EpisodeFailure: episode")
    assert ranks[1]["failure"].endswith("<- RuntimeError")
    assert "tool failure on rank 1" in ranks[1]["failure"]
    assert ranks[0]["failure"].startswith("EpisodeFailure: collection: aborted by RemoteFailure")
    assert ranks[0]["failure"].endswith("<- RemoteFailure")
