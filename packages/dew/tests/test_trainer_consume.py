"""``Trainer(consume_pretrained=True)``: the first state owns the pretrained arrays.

With the opt-in a run holds one copy of its starting weights (at 184M parameters the second
copy was 0.74 GB of peak memory): the state takes the arrays without copying them and
the objective lets go of them. Without it the state gets its own copy and the caller's
arrays stay usable after training. ``dew train`` takes the opt-in when no rollout could
read the starting weights again.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dew.models.lora import LoraConfig
from dew.objectives.base import release_pretrained
from dew.objectives.lm import LMObjective
from dew.objectives.lora import LoraObjective
from dew.recipes.train import Prepared, owns_start
from dew.testing import tiny_decoder
from dew.trainer import Trainer
from dew.trainer.state import place_owned

SEQ = 8


def start(vocab):
    """A tiny decoder over ``vocab`` ids (a vocabulary no other test uses, so its embedding's
    shape picks out this test's live arrays) and its variables."""
    model = tiny_decoder(vocab, SEQ + 1)
    return model, model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))


def trainer_of(objective, **kwargs):
    return Trainer(objective, optax.adamw(1e-3), key=jax.random.key(1),
                   devices=jax.devices()[:1], **kwargs)  # fmt: skip


def live_with_shape(shape):
    """How many live arrays have ``shape`` (garbage collected first)."""
    gc.collect()
    return sum(1 for x in jax.live_arrays() if x.shape == shape and not x.is_deleted())


def batch(vocab):
    rng = np.random.default_rng(0)
    return {"text": rng.integers(1, vocab, size=(4, SEQ + 1)).astype(np.int32)}


def pointers(tree):
    return [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]


def test_a_consumed_start_is_the_only_copy_and_the_objective_lets_go():
    model, variables = start(41)
    shape = variables["params"]["embed_tokens"]["embedding"].shape
    before = pointers(variables)
    refs = [weakref.ref(x) for x in jax.tree.leaves(variables)]
    objective = LMObjective(model, SEQ, pretrained=variables)
    del variables  # the caller hands them over
    trainer = trainer_of(objective, consume_pretrained=True)
    state = trainer.initial_state()
    gc.collect()
    assert objective.pretrained is None
    assert all(ref() is None for ref in refs), "something still holds the pretrained arrays"
    assert pointers(state.params) == before  # taken over, not copied
    assert live_with_shape(shape) == 3  # the weights, Adam's mu and nu: one copy of the weights
    state, metrics = trainer._step()(state, batch(41))
    assert np.isfinite(float(metrics["loss"]))
    with pytest.raises(ValueError, match=r"consume_pretrained=True.*fit\(state=\.\.\.\)"):
        trainer.initial_state()


def test_by_default_the_state_copies_and_the_callers_arrays_stay_usable():
    model, variables = start(43)
    shape = variables["params"]["embed_tokens"]["embedding"].shape
    objective = LMObjective(model, SEQ, pretrained=variables)
    trainer = trainer_of(objective)
    state = trainer.initial_state()
    assert live_with_shape(shape) == 4  # the caller's copy beside the state's three
    expected = jax.device_get(variables)
    for _ in range(2):
        state, metrics = trainer._step()(state, batch(43))
    jax.block_until_ready(metrics)
    assert objective.pretrained is variables
    assert not any(x.is_deleted() for x in jax.tree.leaves(variables))
    for got, want in zip(jax.tree.leaves(jax.device_get(variables)), jax.tree.leaves(expected),
                         strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want)
    again = trainer.initial_state()  # the objective still starts from them
    for got, want in zip(jax.tree.leaves(jax.device_get(again.params)),
                         jax.tree.leaves(expected), strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want)


def test_a_consumed_lora_start_releases_every_wrapped_reference_and_the_step_donates_it():
    model, variables = start(47)
    inner = LMObjective(model, SEQ, pretrained=variables)
    objective = LoraObjective(inner, LoraConfig(rank=2, alpha=4.0, targets=("q_proj",)))
    trainer = trainer_of(objective, consume_pretrained=True)
    state = trainer.initial_state()
    assert objective.pretrained is None and inner.pretrained is None
    assert objective.policy.pretrained is None  # the wrapper's copy of the inner objective
    state, metrics = trainer._step()(state, batch(47))
    assert np.isfinite(float(metrics["loss"]))
    # the caller kept its mapping against the opt-in: the first step donated those buffers
    assert all(x.is_deleted() for x in jax.tree.leaves(variables))


def test_release_pretrained_counts_what_it_drops():
    model, variables = start(53)
    inner = LMObjective(model, SEQ, pretrained=variables)
    objective = LoraObjective(inner, LoraConfig(rank=2, alpha=4.0, targets=("q_proj",)))
    assert release_pretrained(objective) == 3  # the wrapper, the inner objective, its copy
    assert release_pretrained(objective) == 0
    assert release_pretrained(LMObjective(model, SEQ)) == 0


def test_place_owned_copies_a_leaf_that_occurs_twice():
    x = jnp.arange(8.0)
    s = NamedSharding(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]), P())
    out = place_owned({"a": x, "b": x}, {"a": s, "b": s})
    assert out["a"].unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    assert out["b"].unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(out["b"]), np.arange(8.0))


def test_dew_train_consumes_only_without_a_rollout():
    def prepared(**kwargs):
        return Prepared(data=None, objective=None, rollout=None, model=None, vocab_size=1,
                        **kwargs)  # fmt: skip

    assert owns_start(prepared())
    assert not owns_start(Prepared(data=None, objective=None, rollout=object(), model=None,
                                   vocab_size=1))  # fmt: skip
    assert not owns_start(prepared(attach=lambda *args: None))


def test_dew_train_from_a_pretrained_directory_hands_the_weights_over(tmp_path, monkeypatch):
    from dew.cli import main
    from dew.models import Pretrained, build
    from dew.trainer import trainer as trainer_module

    model = build("qwen3", vocab_size=64, emb_features=16, num_layers=1, num_heads=2,
                  num_kv_heads=1, mlp_features=32, max_seq_len=32)  # fmt: skip
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    Pretrained.from_model(model, variables).save(tmp_path / "base", dtype="float32")
    np.arange(1, 60, dtype=np.uint16).tofile(tmp_path / "tokens.bin")
    released = []
    real = trainer_module.release_pretrained
    monkeypatch.setattr(trainer_module, "release_pretrained",
                        lambda objective: released.append(real(objective)))  # fmt: skip
    code = main(["train", "lm", "--tokens", str(tmp_path / "tokens.bin"), "--run-dir",
                 str(tmp_path / "run"), "--steps", "1", "--seq-len", "8", "--batch", "2",
                 "--pretrained", str(tmp_path / "base")])  # fmt: skip
    assert code == 0
    assert released == [1]  # the LMObjective's pretrained, dropped once its state owned it
