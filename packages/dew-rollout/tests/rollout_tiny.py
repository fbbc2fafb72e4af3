"""The tiny decoder the source and scheduler tests share, and the served cores over it.

One ``dew.testing.tiny_decoder`` (32 ids, 64 positions) and three ``dew.inference.Server``
cores, each compiled once per test session and reset to the launch weights (version 0)
before a test wraps it in a ``NativeRolloutServer``:

- ``eos``: every id is an EOS id, so every draw stops after one id (COMPLETED);
- ``plain``: no EOS and one slot, so every draw runs to its budget (TRUNCATED) and a long
  draw holds the only slot while later requests wait;
- ``mixed``: ids 0, 4, 8, ... end a draw, so draws end both ways (training runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from dew.inference import Server
from dew.objectives.rl.grpo import GRPOObjective
from dew.sampling import Sampling
from dew.testing import tiny_decoder

VOCAB = 32
MAX_LEN = 64
WIDTH = 24
MIXED_EOS = tuple(range(0, VOCAB, 4))


@dataclass
class Tiny:
    model: Any
    variables: Any
    cores: dict[str, Server]

    def core(self, name: str) -> Server:
        """The named core, serving the launch weights as version 0 with nothing pending."""
        core = self.cores[name]
        assert not core.pending, f"core {name!r}: a previous test left requests pending"
        core.reload(self.variables, 0)
        return core


def build_tiny() -> Tiny:
    model = tiny_decoder(VOCAB, MAX_LEN, init_std=0.5)
    variables = GRPOObjective(model, seq_len=WIDTH - 1).init(jax.random.key(0))
    variables = jax.tree.map(jax.numpy.asarray, variables)
    samplings = {
        "eos": (Sampling(temperature=1.0, eos_id=tuple(range(VOCAB))), 8),
        "plain": (Sampling(temperature=1.0), 1),
        "mixed": (Sampling(temperature=1.0, eos_id=MIXED_EOS), 8),
    }
    cores = {
        name: Server(
            model,
            variables,
            slots=slots,
            capacity=MAX_LEN,
            sampling=sampling,
            steps_per_call=1,
            min_window=MAX_LEN,
        )  # fmt: skip
        for name, (sampling, slots) in samplings.items()
    }
    return Tiny(model, variables, cores)
