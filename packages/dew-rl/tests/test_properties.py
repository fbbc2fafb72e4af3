"""Hypothesis properties of dew.rl: masking, padding, GSPO gradients, RLOO, segments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dew.rl as rl

B, T = 3, 5
finite = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False, width=64)
values = hnp.arrays(np.float64, (B, T), elements=finite)
masks = hnp.arrays(np.bool_, (B, T))
poisons = st.sampled_from([np.nan, np.inf, -np.inf])


def poison(x: np.ndarray, mask: np.ndarray, bad: float) -> np.ndarray:
    return np.where(mask, x, bad)


def assert_same(a, b) -> None:
    """Equal pytrees of arrays, nan where the other has nan."""
    for left, right in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(left), np.asarray(right))


# Each property compiles its function once (shapes are fixed) and reuses it.
REDUCTIONS = {
    "token_mean": jax.jit(jax.value_and_grad(rl.token_mean)),
    "masked_mean": jax.jit(jax.value_and_grad(rl.masked_mean)),
    "sequence_mean": jax.jit(jax.value_and_grad(rl.sequence_mean)),
    "sequence_sum_mean": jax.jit(jax.value_and_grad(rl.sequence_sum_mean)),
    "sequence_sum_norm": jax.jit(jax.value_and_grad(rl.sequence_sum_norm)),
}


@given(x=values, mask=masks, bad=poisons)
def test_poison_in_padding_never_reaches_reductions(x, mask, bad) -> None:
    for name, fn in REDUCTIONS.items():
        clean = fn(jnp.asarray(np.where(mask, x, 0.0)), jnp.asarray(mask))
        dirty = fn(jnp.asarray(poison(x, mask, bad)), jnp.asarray(mask))
        assert_same(dirty, clean)
        assert np.isfinite(np.asarray(dirty[1])).all(), name


@jax.jit
def _policy_losses(lp, old, adv, mask):
    ppo = rl.clipped_surrogate(rl.token_log_ratio(lp, old), adv, mask)
    gspo = rl.clipped_surrogate(rl.sequence_log_ratio(lp, old, mask), adv, mask, dual_clip=None)
    terms, cispo_metrics = rl.cispo_terms(lp, old, adv, mask)
    cispo = rl.token_mean(terms, mask)
    return ppo[0] + gspo[0] + cispo, (ppo[1], gspo[1], cispo_metrics)


_policy_grads = jax.jit(jax.value_and_grad(_policy_losses, argnums=(0, 1, 2), has_aux=True))


@given(lp=values, old=values, adv=values, mask=masks, bad=poisons)
def test_poison_in_padding_never_reaches_policy_losses(lp, old, adv, mask, bad) -> None:
    mask = mask.copy()
    mask[0, 0] = True  # keep one token so the losses are defined
    clean = _policy_grads(*(jnp.asarray(np.where(mask, a, 0.0)) for a in (lp, old, adv)), mask)
    dirty = _policy_grads(*(jnp.asarray(poison(a, mask, bad)) for a in (lp, old, adv)), mask)
    assert_same(dirty, clean)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(dirty))


@jax.jit
def _per_token(x, y, mask):
    advantages, returns = rl.gae(x, y, mask, 0.99, 0.95)
    return {
        "gae_adv": jnp.where(mask, advantages, 0.0),
        "gae_ret": jnp.where(mask, returns, 0.0),
        "whiten": jnp.where(mask, rl.masked_whiten(x, mask), 0.0),
        "segment_mean": jnp.where(mask, rl.segment_mean(x, mask, jnp.ones((B, T), jnp.int32)), 0),
        "tis": rl.behavior_importance_weights(x, y, mask, 2.0),
        "icepop": rl.icepop_weights(x, y, mask, 0.5, 2.0),
        "token_rs": rl.token_rejection_mask(x, y, mask, 0.5, 2.0),
        "seq_rs": rl.sequence_rejection_mask(x, y, mask, 0.2, 5.0),
        "seq_rs_mean": rl.sequence_rejection_mask(x, y, mask, 0.5, 2.0, mean=True),
        "dpo": jax.grad(rl.preference_logsigmoid, argnums=(0, 1))(x, y, y, x, mask, mask, 0.5),
    }


@given(x=values, y=values, mask=masks, bad=poisons)
def test_poison_in_padding_never_reaches_per_token_results(x, y, mask, bad) -> None:
    mask = mask.copy()
    mask[0, :2] = True  # two kept steps so whitening is defined
    clean = _per_token(
        jnp.asarray(np.where(mask, x, 0.0)), jnp.asarray(np.where(mask, y, 0.0)), mask
    )
    dirty = _per_token(jnp.asarray(poison(x, mask, bad)), jnp.asarray(poison(y, mask, bad)), mask)
    assert_same(dirty, clean)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(dirty))


_gae = jax.jit(rl.gae, static_argnames=("gamma", "lam"))


@given(
    rewards=values,
    vals=values,
    mask=masks,
    tail=hnp.arrays(np.float64, (2, B, 3), elements=st.floats(allow_nan=True, width=64)),
)
def test_padded_tail_leaves_gae_of_real_steps_unchanged(rewards, vals, mask, tail) -> None:
    mask = mask.copy()
    mask[:, 0] = True
    base = _gae(jnp.asarray(rewards), jnp.asarray(vals), jnp.asarray(mask), gamma=0.97, lam=0.9)
    padded = _gae(
        jnp.asarray(np.concatenate([rewards, tail[0]], axis=1)),
        jnp.asarray(np.concatenate([vals, tail[1]], axis=1)),
        jnp.asarray(np.concatenate([mask, np.zeros((B, 3), bool)], axis=1)),
        gamma=0.97,
        lam=0.9,
    )
    for short, long in zip(base, padded, strict=True):
        short, long = np.asarray(short), np.asarray(long)[:, :T]
        np.testing.assert_allclose(long[mask], short[mask], rtol=1e-12, atol=1e-12)


small = hnp.arrays(np.float64, (B, T), elements=st.floats(-2.0, 2.0, width=64))
_slr_jacobian = jax.jit(jax.jacrev(rl.sequence_log_ratio))


@given(lp=small, old=small, mask=masks)
def test_sequence_log_ratio_one_value_per_sequence_own_gradient(lp, old, mask) -> None:
    out = np.asarray(rl.sequence_log_ratio(jnp.asarray(lp), jnp.asarray(old), jnp.asarray(mask)))
    for b in range(B):
        kept = mask[b]
        expected = (lp[b] - old[b])[kept].mean() if kept.any() else 0.0
        np.testing.assert_allclose(out[b], expected, rtol=1e-12, atol=1e-12)
    jac = np.asarray(_slr_jacobian(jnp.asarray(lp), jnp.asarray(old), jnp.asarray(mask)))
    own = np.einsum("bt,bc,ts->btcs", mask.astype(float), np.eye(B), np.eye(T))
    np.testing.assert_array_equal(jac, own)


@given(
    group=st.sampled_from([2, 3, 4]),
    prompts=st.integers(1, 3),
    data=st.data(),
)
@settings(max_examples=25)
def test_rloo_is_scaled_centred_reward(group, prompts, data) -> None:
    rewards = data.draw(hnp.arrays(np.float64, (group * prompts,), elements=finite))
    got = np.asarray(rl.rloo_advantage(jnp.asarray(rewards), group))
    grouped = rewards.reshape(prompts, group)
    centred = grouped - grouped.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(got, (group / (group - 1) * centred).reshape(-1), atol=1e-12)


WIDTH = 9  # room for three chains of three
chains_per_row = st.lists(st.integers(1, 3), min_size=1, max_size=3)


@st.composite
def packed_batches(draw):
    """Two packed rows of width 9 and the same chains laid out one per row."""
    rows = draw(st.lists(chains_per_row, min_size=2, max_size=2))
    global_ids = draw(st.booleans())
    segments = np.zeros((2, WIDTH), np.int32)
    placements = []
    next_id = 7
    for r, lengths in enumerate(rows):
        start = 0
        for k, length in enumerate(lengths):
            chain_id = next_id if global_ids else k + 1
            next_id += 5
            segments[r, start : start + length] = chain_id
            placements.append((r, start, length))
            start += length
    lp = draw(hnp.arrays(np.float64, (2, WIDTH), elements=st.floats(-2.0, 2.0, width=64)))
    old = draw(hnp.arrays(np.float64, (2, WIDTH), elements=st.floats(-2.0, 2.0, width=64)))
    mask = draw(hnp.arrays(np.bool_, (2, WIDTH)))
    return lp, old, mask, segments, placements


def unpack(x: np.ndarray, placements, fill) -> np.ndarray:
    out = np.full((len(placements), WIDTH), fill, dtype=x.dtype)
    for i, (r, start, length) in enumerate(placements):
        out[i, :length] = x[r, start : start + length]
    return out


@given(batch=packed_batches())
def test_segments_equal_chains_computed_row_by_row(batch) -> None:
    lp, old, mask, segments, placements = batch
    packed_mask = mask & (segments != 0)
    u_lp, u_old = unpack(lp, placements, 0.0), unpack(old, placements, 0.0)
    u_mask = unpack(packed_mask, placements, False)
    seg = jnp.asarray(segments)
    P = [jnp.asarray(a) for a in (lp, old, mask)]
    U = [jnp.asarray(a) for a in (u_lp, u_old, u_mask)]
    if packed_mask.any():
        for fn in (rl.sequence_mean, rl.sequence_sum_mean):
            np.testing.assert_allclose(
                float(fn(P[0], P[2], segments=seg)), float(fn(U[0], U[2])), rtol=1e-12
            )
        np.testing.assert_allclose(
            float(rl.sequence_sum_norm(P[0], P[2], norm=3.0, segments=seg)),
            float(rl.sequence_sum_norm(U[0], U[2], norm=3.0)),
            rtol=1e-12,
        )
    per_token = {
        "segment_mean": (
            rl.segment_mean(P[0], P[2], seg),
            rl.segment_mean(U[0], U[2], jnp.ones((len(placements), WIDTH), jnp.int32)),
        ),
        "sequence_log_ratio": (
            rl.sequence_log_ratio(P[0], P[1], P[2], seg),
            rl.sequence_log_ratio(U[0], U[1], U[2]),
        ),
        "seq_rs_sum": (
            rl.sequence_rejection_mask(P[1], P[0], P[2], 0.3, 3.0, segments=seg),
            rl.sequence_rejection_mask(U[1], U[0], U[2], 0.3, 3.0),
        ),
        "seq_rs_mean": (
            rl.sequence_rejection_mask(P[1], P[0], P[2], 0.5, 2.0, mean=True, segments=seg),
            rl.sequence_rejection_mask(U[1], U[0], U[2], 0.5, 2.0, mean=True),
        ),
    }
    for name, (packed, rows) in per_token.items():
        packed, rows = np.asarray(packed), np.asarray(rows)
        for i, (r, start, length) in enumerate(placements):
            np.testing.assert_allclose(
                packed[r, start : start + length], rows[i, :length], rtol=1e-12, err_msg=name
            )
        if name.startswith("seq_rs"):
            assert not packed[segments == 0].any(), name
