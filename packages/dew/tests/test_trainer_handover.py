"""A run started from pretrained weights holds one copy of them, not two.

``Trainer.initial_state`` hands the objective's ``pretrained`` params to the state without a
copy and the compiled step donates them; these tests fail if either comes back (the copy or
a step that does not donate), which at 184M parameters cost 0.74 GB of peak memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.objectives.lm import LMObjective
from dew.testing import tiny_decoder
from dew.trainer import Trainer

SEQ = 8
VOCAB = 32


def pointers(tree):
    return [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]


def batch():
    rng = np.random.default_rng(0)
    return {"text": rng.integers(1, VOCAB, size=(4, SEQ + 1)).astype(np.int32)}


@pytest.fixture
def start():
    model = tiny_decoder(VOCAB, SEQ + 1)
    variables = model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))
    objective = LMObjective(model, SEQ, pretrained=dict(variables))
    trainer = Trainer(
        objective, optax.adamw(1e-3), key=jax.random.key(1), devices=jax.devices()[:1]
    )
    return variables, trainer


def test_the_first_state_shares_the_pretrained_buffers(start):
    variables, trainer = start
    expected = jax.device_get(variables["params"])
    state = trainer.initial_state()
    assert pointers(state.params["params"]) == pointers(variables["params"])
    again = trainer.initial_state()  # a later state is a copy (the first one stays valid)
    assert pointers(again.params["params"]) != pointers(variables["params"])
    for a, b in zip(jax.tree.leaves(jax.device_get(again.params)), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


def test_the_step_donates_them_and_a_later_start_says_so(start):
    variables, trainer = start
    step = trainer._step()
    state = trainer.initial_state()
    assert "input_output_alias" in step.lower(state, batch()).compile().as_text()
    state, metrics = step(state, batch())
    jax.block_until_ready(metrics)
    assert all(x.is_deleted() for x in jax.tree.leaves(variables["params"]))
    with pytest.raises(ValueError, match=r"objective.pretrained: .*donated"):
        trainer.initial_state()
