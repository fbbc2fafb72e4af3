"""Block diffusion (BD3-LM): the two-copy attention, block times, the loss and its AR limit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives import BlockDiffusionObjective, LMObjective
from dew.objectives.block_diffusion import block_times_from_uniform, token_times
from dew.objectives.diffusion import MASK_LOGIT_OFFSET
from dew.objectives.scoring import token_nll
from dew.testing import tiny_decoder

V, L = 12, 8  # ids 0..10 are real, 11 is the mask
MASK = V - 1


@pytest.fixture(scope="module")
def model():  # noqa: ANN201
    return tiny_decoder(V, L, num_layers=2)


@pytest.fixture(scope="module")
def variables(model):  # noqa: ANN001, ANN201
    return model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))


@pytest.fixture(scope="module")
def two_copy(model):  # noqa: ANN001, ANN201
    """Jitted noised-copy logits ``[B, L, V]`` from ``[B, 2L]`` ids at block size 4."""
    return jax.jit(lambda v, ids: model.apply(v, ids, causal=False, block_size=4, two_copy=True))


def test_a_noised_block_reads_itself_and_earlier_clean_blocks_only(variables, two_copy) -> None:  # noqa: ANN001
    ids = jax.random.randint(jax.random.key(1), (1, 2 * L), 0, MASK)
    base = np.asarray(two_copy(variables, ids))
    assert base.shape == (1, L, V)
    # A later clean block and the other noised block leave noised block 0 as it was.
    for index in (L + 4, L + 7, 5):
        moved = np.asarray(two_copy(variables, ids.at[0, index].set(MASK)))
        np.testing.assert_array_equal(moved[0, :4], base[0, :4])
    # Block 1 reads clean block 0, not the clean copy of itself.
    moved = np.asarray(two_copy(variables, ids.at[0, L + 1].set(MASK)))
    assert np.abs(moved[0, 4:] - base[0, 4:]).max() > 1e-4
    np.testing.assert_array_equal(moved[0, :4], base[0, :4])
    moved = np.asarray(two_copy(variables, ids.at[0, L + 5].set(MASK)))
    np.testing.assert_array_equal(moved, base)


def test_two_copy_needs_a_block_size_and_an_even_row(model, variables) -> None:  # noqa: ANN001
    ids = jnp.zeros((1, 2 * L), jnp.int32)
    with pytest.raises(ValueError, match="two_copy: .* needs a block_size"):
        model.apply(variables, ids, causal=False, two_copy=True)
    with pytest.raises(ValueError, match="input_ids: two_copy needs an even length"):
        model.apply(variables, ids[:, :5], causal=False, block_size=1, two_copy=True)


def test_block_times_are_stratified_clipped_and_shared_by_a_block() -> None:
    u = jax.random.uniform(jax.random.key(2), (2, 4))
    t = np.asarray(block_times_from_uniform(u, 0.3, 0.8))
    assert t.min() >= 0.3 and t.max() < 0.8
    assert sorted(np.floor((t.ravel() - 0.3) / 0.5 * 8).astype(int)) == list(range(8))
    assert (np.asarray(block_times_from_uniform(u, 1.0, 1.0)) == 1.0).all()
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 3, 4]])
    per_token = np.asarray(token_times(jnp.asarray(t[:, :4]), pos, 2))
    np.testing.assert_array_equal(per_token[0], np.repeat(t[0, :4], 2))
    # Packed: documents start blocks at their own first token (row 1: 0 1 | 2 | 0 1 | 2 3 | 4).
    np.testing.assert_array_equal(per_token[1], t[1, [0, 0, 1, 1, 1, 2, 2, 3]])


def test_block_size_must_divide_the_length(model) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="block_size: expected a positive int dividing seq_len=8"):
        BlockDiffusionObjective(model, L, 3, MASK, MASK)
    with pytest.raises(ValueError, match="mask_rate_min: expected <= mask_rate_max"):
        BlockDiffusionObjective(model, L, 2, MASK, MASK, mask_rate_min=0.9, mask_rate_max=0.5)


class _LMWithoutMask(LMObjective):
    """LMObjective with BD3-LM's AR convention: the mask id is never predicted."""

    token_nll = staticmethod(
        lambda logits, targets: token_nll(logits.at[..., MASK].add(MASK_LOGIT_OFFSET), targets)
    )


def _ar_rows(text: np.ndarray) -> dict[str, jnp.ndarray]:
    """One LM row per (row, i): ``x_<i``, the mask id at position i, then the target ``x_i``."""
    rows, segs, roles = [], [], []
    for x in text[:, :L]:
        for i in range(L):
            row = np.zeros(L + 1, np.int32)
            row[:i], row[i], row[i + 1] = x[:i], MASK, x[i]
            rows.append(row)
            segs.append((np.arange(L + 1) < i + 2).astype(np.int32))
            roles.append((np.arange(L + 1) == i + 1).astype(np.int32))
    batch = {"text": rows, "text_segment_ids": segs, "text_roles": roles}
    return {k: jnp.asarray(np.stack(v)) for k, v in batch.items()}


def test_block_size_one_fully_masked_is_the_next_token_nll(model, variables) -> None:  # noqa: ANN001
    text = np.asarray(jax.random.randint(jax.random.key(3), (2, L + 1), 0, MASK))
    bd3 = BlockDiffusionObjective(model, L, 1, MASK, MASK, mask_rate_min=1.0, mask_rate_max=1.0)
    loss = jax.jit(bd3.loss)
    total, weight, metrics = loss(variables, {"text": jnp.asarray(text)}, jax.random.key(4))
    again, _, _ = loss(variables, {"text": jnp.asarray(text)}, jax.random.key(5))
    assert float(metrics["masked_sum"]) == 2 * L and float(weight) == 2 * L
    assert float(again) == pytest.approx(float(total), rel=1e-6)  # nothing random is left
    lm = _LMWithoutMask(model, L, loss_role=1)
    lm_total, lm_weight, _ = jax.jit(lm.loss)(variables, _ar_rows(text), jax.random.key(0))
    assert float(lm_weight) == 2 * L
    assert float(total) == pytest.approx(float(lm_total), rel=2e-5)


def test_each_noised_block_matches_block_causal_decoding(model, variables, two_copy) -> None:  # noqa: ANN001
    """Block b of the two-copy pass equals a block-causal pass over clean blocks < b and
    the noised block b: what a sampler that fills blocks left to right computes."""
    keys = jax.random.split(jax.random.key(6), 2)
    clean = jax.random.randint(keys[0], (1, L), 0, MASK)
    noised = jnp.where(jax.random.bernoulli(keys[1], 0.5, (1, L)), MASK, clean)
    both = np.asarray(two_copy(variables, jnp.concatenate([noised, clean], axis=1)))
    for block in range(L // 4):
        end = 4 * (block + 1)
        row = jnp.concatenate([clean[:, : end - 4], noised[:, end - 4 : end]], axis=1)
        alone = np.asarray(model.apply(variables, row, causal=False, block_size=4))
        np.testing.assert_allclose(both[0, end - 4 : end], alone[0, end - 4 :], atol=2e-5)


def test_packed_documents_cost_what_they_cost_alone(model, variables) -> None:  # noqa: ANN001
    """Fully masked blocks (clip [1, 1]) leave nothing random: a row packing documents of 5
    and 3 tokens costs the sum of each document alone, blocks restarting at each one."""
    bd3 = BlockDiffusionObjective(model, L, 2, MASK, MASK, mask_rate_min=1.0, mask_rate_max=1.0)
    loss = jax.jit(bd3.loss)
    ids = jax.random.randint(jax.random.key(7), (1, L + 1), 0, MASK)
    packed = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2, 0]])
    first = jnp.array([[1, 1, 1, 1, 1, 0, 0, 0, 0]])
    second = jnp.array([[1, 1, 1, 0, 0, 0, 0, 0, 0]])
    shifted = jnp.roll(ids, -5, axis=1)
    key = jax.random.key(8)
    both, weight, _ = loss(variables, {"text": ids, "text_segment_ids": packed}, key)
    alone = [
        loss(variables, {"text": ids, "text_segment_ids": first}, key),
        loss(variables, {"text": shifted, "text_segment_ids": second}, key),
    ]
    assert float(weight) == 8 and [float(w) for _, w, _ in alone] == [5, 3]
    assert float(both) == pytest.approx(sum(float(t) for t, _, _ in alone), rel=2e-5)
