"""The Server's compiled decode program keeps the cache in place and runs several steps per
call: each cache buffer is donated and aliased to its output (no copy of the cache per call,
the per-row write is in place), and one dispatch decodes up to ``steps_per_call`` ids.
``tools/bench/profile_decode.py`` shows where a decode step's time goes."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

from dew.inference import Server
from dew.models import load_pretrained

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"


@pytest.fixture(scope="module")
def served():
    """A server after one request of 1 + 8 ids (two decode calls of 4 steps), the decode
    dispatches it made and the cache buffers those calls were given."""
    pretrained = load_pretrained(FIXTURES / "qwen3_tied")
    server = Server(pretrained.model, pretrained.variables, slots=2, capacity=32, steps_per_call=4)
    calls: list[tuple] = []
    original = server.programs.get

    def counted(key, build, args, donate_argnums=()):
        program = original(key, build, args, donate_argnums)
        if key[0] == "decode":
            calls.append(args[1])
        return program

    server.programs.get = counted  # type: ignore[method-assign]
    request = server.submit([5, 17, 99, 3], 9)
    done = server.run()
    assert done[request].ids.shape == (9,)
    return server, calls


def test_decode_runs_steps_per_call_steps_in_one_dispatch(served) -> None:
    _, calls = served
    assert len(calls) == 2  # 8 decode steps, 4 per call


def test_decode_donates_the_cache_and_writes_it_in_place(served) -> None:
    server, calls = served
    given = jax.tree.leaves(calls[0])
    assert given and all(leaf.is_deleted() for leaf in given)
    ((key, program),) = [(k, p) for k, p in server.programs._programs.items() if k[0] == "decode"]
    text = program.as_text()
    header = text.splitlines()[0]
    aliased = {int(i) for i in re.findall(r"\{(\d+)\}: \(\d+, \{\}", header)}
    layers = server.model.config.num_layers
    # outputs 0 .. 2L: the cache's keys, values and lengths, each aliased to its input
    assert set(range(2 * layers + 1)) <= aliased
    cache = jax.tree.leaves(server._cache)[0]
    shape = f"{cache.dtype}[{','.join(str(n) for n in cache.shape)}]".replace("float32", "f32")
    made = [line for line in text.splitlines() if f"= {shape}" in line]
    assert made  # the in-place writes
    assert not [line for line in made if " copy(" in line]
