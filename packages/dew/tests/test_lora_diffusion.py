"""LoRA on the diffusion language-model objectives: ``LoraObjective`` wraps
``MaskedDiffusionObjective`` (bidirectional, ``causal=False``) and ``BlockDiffusionObjective``
(BD3-LM's two-copy pass, ``two_copy=True``). A few Trainer steps lower the loss with only
the adapter changing; the adapter's logits under each diffusion call equal the merged
weights'; ``dew train lm --objective ... --lora-rank`` writes ``RUN_DIR/adapter``."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.cli import main
from dew.data import Dataset
from dew.models.lora import LoraConfig, LoraDecoder, load_peft_adapter
from dew.models.pretrained import load_pretrained
from dew.objectives.block_diffusion import BlockDiffusionObjective
from dew.objectives.lora import LoraObjective
from dew.objectives.masked_diffusion import MaskedDiffusionObjective
from dew.testing import tiny_decoder

SEQ = 8
BLOCK = 4
VOCAB = 16  # ids 0..14 real, 15 the mask id
LORA = LoraConfig(rank=2, alpha=4, targets=("q_proj", "v_proj", "down_proj"))
KINDS = ("masked", "block")


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, 2 * SEQ, init_std=0.5)


@pytest.fixture(scope="module")
def base(model):
    return jax.device_get(model.init(jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32)))


def diffusion(kind, model, base):
    if kind == "masked":
        return MaskedDiffusionObjective(model, SEQ, mask_id=VOCAB - 1, real_tokens=VOCAB - 1,
                                        pretrained=base)  # fmt: skip
    return BlockDiffusionObjective(model, SEQ, BLOCK, mask_id=VOCAB - 1, real_tokens=VOCAB - 1,
                                   pretrained=base)  # fmt: skip


def batch():
    rng = np.random.default_rng(0)
    return {"text": rng.integers(0, VOCAB - 1, size=(4, SEQ + 1)).astype(np.int32)}


def repeat(rows):
    def train(partition, start=0):
        for _ in itertools.count(start):
            yield dict(rows)

    return Dataset(train=train, val=None, records=None, batch=4)


@pytest.fixture(scope="module", params=KINDS)
def trained(request, model, base):
    """``(kind, objective, loss before, loss after, state)`` after 8 adam steps."""
    objective = LoraObjective(diffusion(request.param, model, base), LORA)
    rows, key = batch(), jax.random.key(7)  # the same noising before and after
    start = objective.init(jax.random.key(3))
    before = float(objective.loss(start, rows, key)[0])
    state = Trainer(objective, optax.adam(3e-2), key=jax.random.key(1)).fit(repeat(rows), 8)
    after = float(objective.loss(state.params, rows, key)[0])
    return request.param, objective, before, after, state


def test_a_few_steps_lower_the_loss_with_only_the_adapter_moving(trained, base):
    kind, objective, before, after, state = trained
    assert isinstance(objective.model, LoraDecoder)
    assert after < 0.9 * before, (kind, before, after)
    assert set(state.params) == {"params", "base"}
    kept, start = jax.tree.leaves(jax.device_get(state.params["base"])), jax.tree.leaves(base)
    assert len(kept) == len(start) and all(np.array_equal(a, b) for a, b in zip(kept, start))
    # adam's two moments for the adapter and its step count: nothing for the base
    assert optax.tree.size(state.opt_state) == 2 * optax.tree.size(state.params["params"]) + 1
    b = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.params["params"])
         if path[-1].key == "b"]  # fmt: skip
    assert b and all(np.abs(np.asarray(x)).max() > 0 for x in b)  # every b starts at zero


def diffusion_call(kind):
    """The ids and keywords of the objective's own forward pass."""
    ids = jnp.asarray(batch()["text"][:, :SEQ]).at[:, ::3].set(VOCAB - 1)  # some masked
    if kind == "masked":
        return ids, {"causal": False}
    pair = jnp.concatenate([ids, jnp.asarray(batch()["text"][:, :SEQ])], axis=1)
    return pair, {"causal": False, "block_size": BLOCK, "two_copy": True}


def test_the_adapter_logits_of_the_diffusion_call_equal_the_merged_weights(trained, model):
    kind, objective, _, _, state = trained
    ids, keywords = diffusion_call(kind)
    on = np.asarray(objective.model.apply(state.params, ids, **keywords))
    assert on.shape == (4, SEQ, VOCAB)  # two-copy: the noised copy's logits only
    merged = np.asarray(model.apply(objective.merged(state.params), ids, **keywords))
    np.testing.assert_allclose(on, merged, atol=1e-5, rtol=0)
    off = np.asarray(model.apply({"params": state.params["base"]}, ids, **keywords))
    assert np.abs(on - off).max() > 1e-3  # the adapter acts on this very call
    causal = np.asarray(model.apply(objective.merged(state.params), ids[:, :SEQ]))
    assert np.abs(on - causal).max() > 1e-3  # and the call is not the causal one


@pytest.mark.parametrize(
    "objective", [["masked_diffusion"], ["block_diffusion", "--block-size", "4"]]
)  # fmt: skip
def test_dew_train_lm_with_a_diffusion_objective_writes_the_adapter(tmp_path, objective):
    tokens, run_dir, out = tmp_path / "tokens.bin", tmp_path / "run", tmp_path / "out"
    np.tile(np.array([0, 1, 2, 3], np.uint16), 64).tofile(tokens)
    argv = ["train", "lm", "--tokens", str(tokens), "--run-dir", str(run_dir), "--steps", "2",
            "--seq-len", "8", "--emb-features", "16", "--layers", "1", "--heads", "2",
            "--mlp-features", "32", "--batch", "4", "--no-progress", "--lr", "1e-2",
            "--objective", *objective, "--lora-rank", "2", "--lora-alpha", "4",
            "--export", str(out), "--export-dtype", "float32"]  # fmt: skip
    assert main(argv) == 0
    config = load_pretrained(str(out)).config
    adapters, lora = load_peft_adapter(run_dir / "adapter", config)
    assert lora.rank == 2 and config.vocab_size == 5  # ids 0..3 and the mask id
    b = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(adapters)
         if path[-1].key == "b"]  # fmt: skip
    assert b and any(np.abs(np.asarray(x)).max() > 0 for x in b)
