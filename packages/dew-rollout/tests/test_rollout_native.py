"""NativeRolloutServer: draws equal Dew's Server, reloads land between rounds, versions,
dtype casting, both likelihoods, and every refusal by name."""

from __future__ import annotations

import threading
from concurrent.futures import wait
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_engine import score_chains, tiny_pretrained

from dew.inference import Server
from dew.rollout import Draw, NativeRolloutServer, RolloutServer, ServerClosed
from dew.sampling import Sampling

SAMPLING = Sampling(temperature=0.7)
PROMPTS = [[5, 17, 99, 3], [7, 1, 2, 3, 4, 5], [100, 101]]


@pytest.fixture(scope="module")
def other():
    return tiny_pretrained(seed=1)


def make_server(pretrained, **options):
    options = {"slots": 4, "capacity": 64, "sampling": SAMPLING, **options}
    return Server.from_task(pretrained, **options)


_REFERENCES: dict = {}


def reference(pretrained, prompt, budget, seed, **options):
    """What a plain `Server` answers; one server per weights and options, shared (a
    request's draws do not depend on what else is in the batch)."""
    key = (id(pretrained), tuple(sorted(options.items())))
    if key not in _REFERENCES:
        _REFERENCES[key] = (pretrained, make_server(pretrained, **options))
    server = _REFERENCES[key][1]
    request = server.submit(prompt, budget, seed=seed)
    return server.run()[request]


def test_draws_equal_the_server_and_carry_both_likelihoods(pretrained):
    with NativeRolloutServer(make_server(pretrained)) as server:
        assert isinstance(server, RolloutServer)
        futures = [server.submit(p, 6, seed=i) for i, p in enumerate(PROMPTS)]
        draws = [f.result(timeout=120) for f in futures]
    chains = [[*prompt, *draw.ids.tolist()] for prompt, draw in zip(PROMPTS, draws)]
    raw = score_chains(pretrained, pretrained.variables, chains)
    tempered = score_chains(pretrained, pretrained.variables, chains, temperature=0.7)
    for i, (prompt, draw) in enumerate(zip(PROMPTS, draws)):
        assert isinstance(draw, Draw) and draw.version == 0 and not draw.eos
        want = reference(pretrained, prompt, 6, i)
        np.testing.assert_array_equal(draw.ids, want.ids)
        np.testing.assert_array_equal(draw.prompt_ids, prompt)
        assert draw.ids.shape == (6,) and draw.ids.dtype == np.int32
        # raw: the policy itself; behavior: the tempered distribution it sampled from
        start = len(prompt) - 1
        np.testing.assert_allclose(draw.raw_log_probs, raw[i][start:], atol=2e-5)
        np.testing.assert_allclose(draw.behavior_log_probs, tempered[i][start:], atol=2e-5)
        assert not np.allclose(draw.raw_log_probs, draw.behavior_log_probs)


def test_eos_ends_a_draw(pretrained):
    first = reference(pretrained, PROMPTS[0], 6, 3)
    eos = int(first.ids[2])
    sampling = Sampling(temperature=0.7, eos_id=eos)
    with NativeRolloutServer(make_server(pretrained, sampling=sampling)) as server:
        draw = server.submit(PROMPTS[0], 6, seed=3).result(timeout=120)
    stop = int(np.flatnonzero(first.ids == eos)[0])
    assert draw.eos and draw.ids.tolist() == first.ids[: stop + 1].tolist()


def test_load_between_rounds_and_the_oldest_version(pretrained, other):
    core = make_server(pretrained, steps_per_call=1, slots=2)
    loaded = threading.Event()
    step = core.step

    def step_then_load() -> Any:
        # the push lands between two rounds of the server's own loop, right after the long
        # request's third token (polling from the test thread could miss that window when
        # the loop keeps the lock on a loaded machine)
        done = step()
        active = [r for r in core._active if r is not None]
        if not loaded.is_set() and active and len(active[0].ids) >= 3:
            server.load(other.variables, 5)
            loaded.set()
        return done

    core.step = step_then_load  # type: ignore[method-assign]
    with NativeRolloutServer(core) as server:
        long = server.submit(PROMPTS[1], 40, seed=11)
        assert loaded.wait(timeout=120), "the long request never reached its third token"
        assert server.version == 5
        after = server.submit(PROMPTS[1], 40, seed=11)
        old, new = long.result(timeout=120), after.result(timeout=120)
    # the long draw started on version 0: that is its version, though it ended on 5
    assert old.version == 0 and new.version == 5
    launch = reference(pretrained, PROMPTS[1], 40, 11)
    pushed = reference(other, PROMPTS[1], 40, 11)
    np.testing.assert_array_equal(new.ids, pushed.ids)
    # the first tokens came from the launch weights, the tail from the pushed ones
    np.testing.assert_array_equal(old.ids[:3], launch.ids[:3])
    np.testing.assert_allclose(old.raw_log_probs[:3], launch.raw_log_probs[:3], atol=1e-6)
    tail = slice(old.ids.shape[0] - 10, None)
    assert not np.allclose(old.raw_log_probs[tail], launch.raw_log_probs[tail], atol=1e-3)


def test_load_casts_float32_to_the_served_dtype(pretrained, other):
    core = make_server(pretrained, dtype="bfloat16")
    with NativeRolloutServer(core) as server:
        server.load(other.variables, 1)
        leaves = jax.tree.leaves(core.variables)
        assert all(
            leaf.dtype == jnp.bfloat16
            for leaf in leaves
            if jnp.issubdtype(leaf.dtype, jnp.floating)
        )
        draw = server.submit(PROMPTS[0], 5, seed=2).result(timeout=120)
    want = reference(other, PROMPTS[0], 5, 2, dtype="bfloat16")
    np.testing.assert_array_equal(draw.ids, want.ids)
    assert draw.version == 1


def test_refusals_are_named(pretrained, other):
    with NativeRolloutServer(make_server(pretrained)) as server:
        with pytest.raises(ValueError, match="prompt_ids: expected a non-empty 1-D"):
            server.submit([], 4)
        with pytest.raises(ValueError, match="prompt_ids: expected ids >= 0, got -3"):
            server.submit([1, -3], 4)
        with pytest.raises(TypeError, match="max_new_tokens: expected an int, got float"):
            server.submit([1, 2], 4.0)
        with pytest.raises(ValueError, match="max_new_tokens: expected >= 1, got 0"):
            server.submit([1, 2], 0)
        with pytest.raises(TypeError, match="version: expected an int, got str"):
            server.load(other.variables, "2")
        broken = {"params": {**other.variables["params"]}}
        broken["params"].pop("norm")
        with pytest.raises(ValueError, match="variables: "):
            server.load(broken, 2)
        assert server.version == 0
    with pytest.raises(TypeError, match="server: expected a dew.inference.Server, got dict"):
        NativeRolloutServer({})


def test_close_fails_pending_draws_and_later_submits(pretrained):
    server = NativeRolloutServer(make_server(pretrained, slots=1, steps_per_call=1))
    futures = [server.submit(PROMPTS[0], 60, seed=i) for i in range(3)]
    server.close()
    wait(futures, timeout=60)
    failed = [f for f in futures if f.exception() is not None]
    assert failed and all(isinstance(f.exception(), ServerClosed) for f in failed)
    with pytest.raises(ServerClosed, match="submit: the rollout server is closed"):
        server.submit(PROMPTS[0], 3)


LOAD_FROM_A_MESH = """
import jax
jax.config.update("jax_num_cpu_devices", 2)
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from rollout_tiny import MAX_LEN, build_tiny
from dew.inference import Server
from dew.rollout import NativeRolloutServer
tiny = build_tiny()
mesh = Mesh(np.asarray(jax.devices()), ("data",))
replicated = jax.device_put(tiny.variables, NamedSharding(mesh, PartitionSpec()))
with NativeRolloutServer(tiny.core("plain")) as server:
    server.submit([1, 2, 3], 4, seed=0).result(120)  # compiles for the served device
    server.load(replicated, 1)
    draw = server.submit([1, 2, 3], 4, seed=0).result(120)
print("version", draw.version, "ids", len(draw.ids))
"""


def test_load_takes_a_tree_replicated_over_a_mesh(tmp_path):
    """A trainer on several devices pushes mesh-replicated leaves; the server copies them
    onto its own device instead of failing its compiled programs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", LOAD_FROM_A_MESH], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "version 1 ids 4" in done.stdout
