"""Packed GRPO equals GRPO over the same chains unpacked, and over unmerged calls.

A tiny real ``dew.models`` decoder scores the ids, so attention isolation between packed
chains, per-chain positions and the merge rule are all on the path that is compared.

1. Packing: the batch ``pack`` writes (several chains per row) against the same chains one
   per row. Every option must give the same loss and the same parameter gradients,
   GSPO and the sequence masks included (their unit is the chain, which both layouts share).
2. Merging: sessions whose calls merge into one chain against one row per call (each call's
   own prompt followed by its sampled ids). Options that act per token or per session
   (PPO, CISPO, TIS, IcePop, the bypass band, either aggregation, the KL) must agree; GSPO and
   the sequence masks pool per chain, so merging changes what they pool, and they are left out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rl.sessions import Call, Session, Status, group_advantages, pack
from dew.testing import tiny_decoder

VOCAB = 29
WIDTH = 24


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, WIDTH, init_std=0.3)


@pytest.fixture(scope="module")
def params(model):
    old = model.init(jax.random.key(0), jnp.zeros((1, WIDTH), jnp.int32))
    noise = jax.tree.map(
        lambda x: 0.05 * jax.random.normal(jax.random.key(1), x.shape, x.dtype), old
    )
    current = jax.tree.map(jnp.add, old, noise)
    reference = jax.tree.map(lambda x, n: x - 0.5 * n, old, noise)
    return old, current, reference


def make_sessions(rng: np.random.Generator) -> list[Session]:
    sessions = []
    for index in range(9):
        calls = []
        chain: list[int] = []
        for k in range(int(rng.integers(1, 4))):
            if k and rng.random() < 0.7:
                prompt = chain + rng.integers(1, VOCAB, int(rng.integers(0, 3))).tolist()
            else:
                prompt = rng.integers(1, VOCAB, int(rng.integers(1, 4))).tolist()
            sampled = rng.integers(1, VOCAB, int(rng.integers(1, 4))).tolist()
            if len(prompt) + len(sampled) > WIDTH // 2:
                break
            calls.append(
                Call(
                    prompt_ids=prompt,
                    sampled_ids=sampled,
                    behavior_log_probs=np.zeros(len(sampled)),  # filled from the model below
                )
            )
            chain = prompt + sampled
        sessions.append(
            Session(
                task=index // 3,
                sample=index,
                calls=calls,
                status=Status.COMPLETED,
                reward=float(rng.integers(0, 3)),
            )
        )
    return sessions


def per_call_rows(sessions: list[Session], advantages: np.ndarray) -> dict[str, np.ndarray]:
    """One row per call: its prompt then its sampled ids (no merging, no packing)."""
    rows = [(i, k, c) for i, s in enumerate(sessions) for k, c in enumerate(s.calls)]
    shape = (len(rows), WIDTH)
    batch = {
        "input_ids": np.zeros(shape, np.int32),
        "text_segment_ids": np.zeros(shape, np.int32),
        "text_positions": np.zeros(shape, np.int32),
        "response_mask": np.zeros(shape, np.int32),
        "advantages": np.zeros(shape, np.float32),
        "session_index": np.full(shape, -1, np.int32),
        "call_index": np.full(shape, -1, np.int32),
    }
    for r, (i, k, c) in enumerate(rows):
        n, p = c.prompt_ids.size + c.sampled_ids.size, c.prompt_ids.size
        batch["input_ids"][r, :n] = np.concatenate([c.prompt_ids, c.sampled_ids])
        batch["text_segment_ids"][r, :n] = 1
        batch["text_positions"][r, :n] = np.arange(n)
        batch["response_mask"][r, p:n] = 1
        batch["advantages"][r, :n] = advantages[i]
        batch["session_index"][r, p:n] = i
        batch["call_index"][r, p:n] = k
    return batch


def one_chain_per_row(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same chains as a packed batch, each moved to a row of its own."""
    chains = [
        (r, np.flatnonzero(batch["text_segment_ids"][r] == s))
        for r in range(batch["input_ids"].shape[0])
        for s in np.unique(batch["text_segment_ids"][r])
        if s > 0
    ]
    out = {}
    for name, column in batch.items():
        fill = -1 if name in ("session_index", "call_index", "versions") else 0
        rows = np.full((len(chains),) + column.shape[1:], fill, column.dtype)
        for new, (r, cols) in enumerate(chains):
            rows[new, : cols.size] = column[r, cols]
        out[name] = rows
    out["text_segment_ids"] = np.where(out["text_segment_ids"] > 0, 1, 0).astype(np.int32)
    return out


def sampled_order(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Flat indices of sampled cells ordered by (session, call, position in row order)."""
    cells = np.flatnonzero(batch["response_mask"].reshape(-1) > 0)
    keys = np.stack(
        [batch["session_index"].reshape(-1)[cells], batch["call_index"].reshape(-1)[cells], cells]
    )
    return cells[np.lexsort(keys[::-1])]


@pytest.fixture(scope="module")
def batches(model, params):
    old, _, _ = params
    rng = np.random.default_rng(7)
    sessions = make_sessions(rng)
    rewards = [s.reward for s in sessions]
    advantages = group_advantages(rewards, [(s.task, s.group) for s in sessions], "group")
    packed = pack(sessions, WIDTH)
    assert packed["input_ids"].shape[0] < sum(len(s.calls) for s in sessions), "rows are shared"
    calls = per_call_rows(sessions, advantages)
    # old (proximal) likelihoods: the old policy's own scoring, in each layout
    objective = GRPOObjective(model, seq_len=WIDTH - 1)
    for batch in (packed, calls):
        batch["old_log_probs"] = np.asarray(objective.packed_log_probs(old, batch))
    a, b = sampled_order(packed), sampled_order(calls)
    np.testing.assert_allclose(
        packed["old_log_probs"].reshape(-1)[a], calls["old_log_probs"].reshape(-1)[b], atol=2e-6
    )
    # engine likelihoods: old plus noise and a few far-off tokens, identical in both layouts
    noise = rng.normal(0.0, 0.3, a.size) - (rng.random(a.size) < 0.1) * 1.5
    for batch, order in ((packed, a), (calls, b)):
        flat = np.zeros(batch["input_ids"].size, np.float32)
        flat[order] = packed["old_log_probs"].reshape(-1)[a] + noise
        batch["behavior_log_probs"] = flat.reshape(batch["input_ids"].shape)
    return packed, one_chain_per_row(packed), calls


def loss_and_grads(objective, params, batch, bypass=False):
    _, current, reference = params
    batch = {k: jnp.asarray(v) for k, v in batch.items() if not (bypass and k == "old_log_probs")}

    def fn(p):
        loss_sum, weight, _ = objective.loss(p, batch, jax.random.key(0), reference)
        return loss_sum / weight

    return jax.jit(jax.value_and_grad(fn))(current)


def assert_same(first, second):
    (l1, g1), (l2, g2) = first, second
    assert float(l1) == pytest.approx(float(l2), rel=1e-5, abs=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(g1)), "a real gradient"


PACKING_CASES = {
    "ppo_kl": ({"beta": 0.1}, False),
    "ppo_session_mean_dual_clip": ({"aggregation": "session-mean", "dual_clip": 2.0}, False),
    "gspo_session_mean": ({"policy_loss": "gspo", "aggregation": "session-mean"}, False),
    "cispo_tis_sequence_masks": (
        {
            "policy_loss": "cispo",
            "behavior_importance": 2.0,
            "sequence_mask": (0.2, 5.0),
            "geometric_mask": (0.7, 1.4),
        },
        False,
    ),
    "bypass_band_sequence_mask": (
        {"behavior_importance": (0.5, 2.0), "sequence_mask": (0.2, 5.0), "beta": 0.1},
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(PACKING_CASES))
def test_packed_rows_equal_one_chain_per_row(name, model, params, batches):
    options, bypass = PACKING_CASES[name]
    objective = GRPOObjective(model, seq_len=WIDTH - 1, **options)
    packed, chains, _ = batches
    assert chains["input_ids"].shape[0] > packed["input_ids"].shape[0]
    assert_same(
        loss_and_grads(objective, params, packed, bypass),
        loss_and_grads(objective, params, chains, bypass),
    )


MERGE_CASES = {
    "ppo_kl": ({"beta": 0.1}, False),
    "ppo_session_mean_icepop": (
        {"aggregation": "session-mean", "behavior_importance": (0.5, 2.0)},
        False,
    ),
    "cispo_tis": ({"policy_loss": "cispo", "behavior_importance": 1.5}, False),
    "bypass_band_session_mean": (
        {"behavior_importance": (0.5, 2.0), "aggregation": "session-mean", "beta": 0.1},
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(MERGE_CASES))
def test_merged_chains_equal_one_call_per_row(name, model, params, batches):
    options, bypass = MERGE_CASES[name]
    objective = GRPOObjective(model, seq_len=WIDTH - 1, **options)
    packed, _, calls = batches
    assert_same(
        loss_and_grads(objective, params, packed, bypass),
        loss_and_grads(objective, params, calls, bypass),
    )
