"""`engine_server` launching the real vLLM CPU engine (one launch for the module, two to
three minutes): draws, one push whose prompt log-probabilities equal Dew's, and a closed
stack that leaves no engine process and the engine's output in RUN_DIR/engine.log."""

from __future__ import annotations

import contextlib
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from rollout_engine import engine_cpus, prompt_log_probs, score_chains, tiny_pretrained, vllm_python

from dew.rollout import engine_server
from dew.rollout.launch import SERVED_NAME
from dew.sampling import Sampling

PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79, 2], [32, 38, 46, 26, 43, 38, 32]]
TOLERANCE = 2e-4  # float32 kernels in another order (as test_rollout_vllm_engine.py)


def bf16(variables):
    return jax.tree.map(
        lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), variables
    )


def group_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[2])


def live_members(group: int) -> list[int]:
    """Pids of the processes of `group` that are not zombies, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def engine_pids(folder: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and str(folder).encode() in command:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    python, reason = vllm_python()
    if python is None:
        pytest.skip(reason)
    run_dir = tmp_path_factory.mktemp("engine-run")
    pretrained = tiny_pretrained()
    stack = contextlib.ExitStack()
    launch = {"python": str(python.parent.parent), "cpus": engine_cpus() or None,
              "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}  # fmt: skip
    try:
        server = engine_server(
            "vllm", url=None, directory=None, launch=launch, publish="reload",
            model=pretrained.model, params=pretrained.variables, sampling=Sampling(),
            concurrency=4, run_dir=run_dir, stack=stack,
        )  # fmt: skip
    except BaseException:
        stack.close()
        raise
    with stack:
        yield server, pretrained, run_dir, stack


def test_launch_draw_push_and_stop(launched):
    server, pretrained, run_dir, stack = launched
    url = str(server.completion.client.base_url).rstrip("/")
    draws = [server.submit(p, 6, seed=i).result(timeout=300) for i, p in enumerate(PROMPTS)]
    chains = [[*p, *d.ids.tolist()] for p, d in zip(PROMPTS, draws)]
    for prompt, draw, row in zip(
        PROMPTS, draws, score_chains(pretrained, bf16(pretrained.variables), chains)
    ):
        assert draw.version == 0
        np.testing.assert_allclose(draw.behavior_log_probs, row[len(prompt) - 1 :], atol=TOLERANCE)

    other = tiny_pretrained(seed=5)
    server.load(other.variables, 1)
    assert server.version == 1
    ours = score_chains(other, bf16(other.variables), PROMPTS)
    before = score_chains(pretrained, bf16(pretrained.variables), PROMPTS)
    worst = 0.0
    for prompt, mine, old in zip(PROMPTS, ours, before):
        engine = prompt_log_probs(url, prompt, name=SERVED_NAME)
        np.testing.assert_allclose(engine, mine, atol=TOLERANCE)
        assert np.abs(engine - old).max() > 0.1  # the push changed what is served
        worst = max(worst, float(np.abs(engine - mine).max()))
    print(f"prompt log-probs after the push vs Dew: max abs difference {worst:.3g}")

    folder = run_dir / "engine" / "policy"
    groups = {group_of(pid) for pid in engine_pids(folder)}
    assert len(groups) == 1
    (group,) = groups
    assert len(live_members(group)) >= 2  # the watchdog and the engine (and its workers)
    stack.close()
    assert live_members(group) == [], "engine processes survived the closed stack"
    log = (run_dir / "engine.log").read_text().splitlines()
    assert log[0].startswith("=== dew: vllm engine launched") and str(folder) in log[0]
    assert len(log) > 1 and any("vllm" in line.lower() for line in log[1:])
