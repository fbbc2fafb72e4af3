"""Publication on a two-process JAX trainer (jax.distributed on 127.0.0.1): the sharded
tree is gathered, only process 0 writes and pushes, and both processes agree on success
and on failure."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from rollout_engine import tiny_pretrained
from rollout_fakes import FakeVLLM

from dew.models import load_pretrained
from dew.testing import run_processes

HERE = Path(__file__).resolve().parent


def test_two_processes_publish_once_and_agree(tmp_path):
    engine = FakeVLLM()
    arrivals: list[int] = []

    def arm(body, query):
        # the second process to arrive arms the fault: both finished push 1 by then
        arrivals.append(1)
        if len(arrivals) == 2:
            engine.fail("/reset_prefix_cache", "success_false")
        return 200, {}

    engine.routes["/arm"] = arm
    try:
        workers = run_processes(HERE / "_publication_worker.py", engine.url, tmp_path / "policy",
                                processes=2, pythonpath=[HERE], timeout=240)  # fmt: skip
    finally:
        engine.close()
    lines = [
        [json.loads(line) for line in w.stdout.splitlines() if line.startswith("{")]
        for w in workers
    ]
    for process, attempts in enumerate(lines):
        first, second = attempts
        assert first == {"ok": True, "error": "", "process": process, "version": 1}
        assert second["ok"] is False and second["version"] == 1
        assert "push of version 2 failed" in second["error"]
        detail = "success=False" if process == 0 else "the push failed on process 0"
        assert detail in second["error"]
    # one push sequence per attempt: only process 0 talked to the replica
    sequence = [
        "/pause",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/update_weight_version",
        "/resume",
    ]
    paths = [p for p in engine.paths() if p != "/arm"]
    assert paths == sequence + sequence[:3]
    # process 0 wrote the whole tree, both halves of the sharded embedding included
    written = load_pretrained(tmp_path / "policy")
    want = tiny_pretrained(seed=9).variables
    for got, leaf in zip(jax.tree.leaves(written.variables), jax.tree.leaves(want)):
        rounded = np.asarray(leaf).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(got, rounded)
