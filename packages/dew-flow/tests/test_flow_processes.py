"""Two real JAX processes (jax.distributed on 127.0.0.1) run one Flow-GRPO update.

Each process must keep exactly the samples of its own source rows, the reward must run once,
on process 0, over every sample, and the update must equal that of one process holding the
same two devices' worth of data.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dew.testing import ProcessGroup, run_processes

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_flow_worker.py")


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_two_processes_own_their_rows_and_match_one(tmp_path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    with ProcessGroup(WORKER, two, "--devices", 1, processes=2) as pair:
        (single,) = run_processes(WORKER, one, "--devices", 2, timeout=600)
        assert "done" in single.stdout
        for rank in pair.wait(timeout=600):
            assert "done" in rank.stdout

    # ownership: process i keeps the two groups of its source rows, contiguously
    rows = [_load(two / f"rows_{i}.npz") for i in range(2)]
    np.testing.assert_array_equal(rows[0]["labels"], [0, 0, 1, 1])
    np.testing.assert_array_equal(rows[1]["labels"], [2, 2, 3, 3])
    # the reward ran once, on process 0, over all eight samples
    assert not (two / "reward_1.json").exists()
    seen = json.loads((two / "reward_0.json").read_text())
    assert seen == {"samples": 8, "labels": [0, 0, 1, 1, 2, 2, 3, 3]}
    # the same scores and the same update as one process
    alone = _load(one / "rows_0.npz")
    both = np.concatenate([rows[0]["rewards"], rows[1]["rewards"]])
    assert both.dtype == np.float64
    np.testing.assert_allclose(both, alone["rewards"], rtol=1e-5, atol=1e-6)
    assert int(alone["updates"]) == 1 and all(int(r["updates"]) == 1 for r in rows)
    names = [k for k in alone if k.startswith("param_")]
    assert names
    moved = 0
    for name in names:
        np.testing.assert_allclose(rows[0][name], alone[name], rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(rows[0][name], rows[1][name])
        moved += int(not np.allclose(alone[name], alone[name.replace("param_", "initial_")]))
    assert moved >= 2, moved  # at init only the zero-initialised output layer gets gradients
