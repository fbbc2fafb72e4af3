"""GRPOObjective: scoring packed chains, options, metrics and refusals."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl.grpo import GRPOObjective, policy_loss_from_log_probs
from dew.objectives.rl.sessions import Call, Session, pack
from dew.testing import tiny_decoder

VOCAB = 13
W = 12


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, W, init_std=0.5)


@pytest.fixture(scope="module")
def variables(model):
    return model.init(jax.random.key(0), jnp.zeros((1, W), jnp.int32))


def session(prompt, sampled, reward, task=0, raw=True):
    return Session(
        task=task,
        calls=[
            Call(
                prompt_ids=prompt,
                sampled_ids=sampled,
                behavior_log_probs=[-1.0] * len(sampled),
                raw_log_probs=[-1.1] * len(sampled) if raw else None,
            )
        ],
        reward=reward,
    )


@pytest.fixture(scope="module")
def batch():
    sessions = [
        session([1, 2], [3, 4, 5], 1.0),
        session([6], [7, 8], 0.0),
        session([9, 10, 11], [12], 0.5),
        session([2, 3], [4], 0.0),
    ]
    return pack(sessions, W)


def test_packed_log_probs_score_each_chain_alone(model, variables, batch):
    objective = GRPOObjective(model, seq_len=W - 1)
    packed = np.asarray(objective.packed_log_probs(variables, batch))
    assert packed.shape == batch["input_ids"].shape
    for r in range(batch["input_ids"].shape[0]):
        seg = batch["text_segment_ids"][r]
        for s in np.unique(seg[seg > 0]):
            cols = np.flatnonzero(seg == s)
            ids = batch["input_ids"][r, cols]
            logits = model.apply(variables, jnp.asarray(ids[None]))[0]
            expected = jax.nn.log_softmax(logits, axis=-1)[np.arange(ids.size - 1), ids[1:]]
            np.testing.assert_allclose(packed[r, cols[1:]], expected, atol=1e-5)
            assert packed[r, cols[0]] == 0.0  # a chain's first id has no prediction
    assert (packed[batch["text_segment_ids"] == 0] == 0).all()


def test_temperature_and_support_scoring(model, variables):
    batch = pack([session([1, 2], [3, 4], 1.0), session([5], [6], 0.0)], W)
    batch = dict(batch)
    # support: column of each sampled id, kept ids {sampled, two others}
    assert batch["input_ids"].shape[0] == 1  # both chains share the row
    cols = np.flatnonzero(batch["session_index"][0] == 0)
    ids = batch["input_ids"][0, cols]
    support_ids = np.full((1, 16), -1, np.int32)
    support_cols = np.full((1, 16), -1, np.int32)
    kept = {
        c: sorted({int(i), (int(i) + 1) % VOCAB, (int(i) + 5) % VOCAB}) for c, i in zip(cols, ids)
    }
    at = 0
    for c, group in kept.items():
        support_ids[0, at : at + len(group)] = group
        support_cols[0, at : at + len(group)] = c
        at += len(group)
    batch["support_ids"], batch["support_columns"] = support_ids, support_cols
    objective = GRPOObjective(model, seq_len=W - 1, sampling_temperature=0.5)
    scored = np.asarray(objective.packed_log_probs(variables, batch))
    logits = np.asarray(
        model.apply(
            variables,
            jnp.asarray(batch["input_ids"][:, :-1]),
            segment_ids=jnp.asarray(batch["text_segment_ids"][:, :-1]),
            positions=jnp.asarray(batch["text_positions"][:, :-1]),
        )
    )
    for c, group in kept.items():
        z = logits[0, c - 1] / 0.5
        expected = z[batch["input_ids"][0, c]] - np.log(np.exp(z[group]).sum())
        assert scored[0, c] == pytest.approx(expected, abs=1e-5)
    # a column without support falls back to the tempered full softmax
    (c,) = np.flatnonzero(batch["session_index"][0] == 1)
    z = logits[0, c - 1] / 0.5
    full = z[batch["input_ids"][0, c]] - np.log(np.exp(z).sum())
    assert scored[0, c] == pytest.approx(full, abs=1e-5)


def test_init_uses_pretrained_and_ema_rules(model, variables):
    assert GRPOObjective(model, seq_len=W - 1).ema_decay is None
    frozen = GRPOObjective(model, seq_len=W - 1, beta=0.1, pretrained=variables)
    assert frozen.ema_decay == 1.0
    assert frozen.init(jax.random.key(9))["params"] is variables["params"]
    fresh = GRPOObjective(model, seq_len=W - 1).init(jax.random.key(1))
    assert jax.tree.structure(fresh) == jax.tree.structure(variables)
    GRPOObjective(model, seq_len=W - 1, beta=0.1, ema_decay=1.0)
    with pytest.raises(ValueError, match="ema_decay"):
        GRPOObjective(model, seq_len=W - 1, beta=0.1, ema_decay=0.99)
    with pytest.raises(ValueError, match="ema_decay"):
        GRPOObjective(model, seq_len=W - 1, ema_decay=0.99)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"beta": -0.1}, "beta"),
        ({"beta": math.nan}, "beta"),
        ({"epsilon_low": -1}, "epsilon_low"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"policy_loss": "ppo2"}, "policy_loss"),
        ({"aggregation": "seq-mean"}, "aggregation"),
        ({"behavior_importance": -2.0}, "behavior_importance"),
        ({"behavior_importance": (2.0, 1.0)}, "behavior_importance"),
        ({"behavior_importance": True}, "behavior_importance"),
        ({"sequence_mask": (0.0, 2.0)}, "sequence_mask"),
        ({"geometric_mask": "wide"}, "geometric_mask"),
        ({"sampling_temperature": 0.0}, "sampling_temperature"),
        ({"entropy_coeff": math.nan}, "^entropy_coeff: expected a finite number"),
        ({"entropy_coeff": "0.1"}, "^entropy_coeff: expected a finite number"),
        ({"kl_estimator": "k3+"}, "^kl_estimator: expected one of kl, k1, abs, mse, k2, low_var"),
        ({"pretrained": {"weights": 1}}, "pretrained"),
    ],
)
def test_bad_options_raise(model, kwargs, match):
    options = {"seq_len": W - 1, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        GRPOObjective(model, **options)


def test_bad_batches_raise(model, variables, batch):
    objective = GRPOObjective(model, seq_len=W - 2)
    with pytest.raises(ValueError, match="input_ids"):
        objective.packed_log_probs(variables, batch)
    lp = jnp.zeros(batch["input_ids"].shape)
    bypass = {k: v for k, v in batch.items() if k != "old_log_probs"}
    with pytest.raises(ValueError, match="TIS cap"):
        policy_loss_from_log_probs(lp, bypass, behavior_importance=2.0)
    no_behavior = {k: v for k, v in bypass.items() if k != "behavior_log_probs"}
    with pytest.raises(KeyError, match="behavior_log_probs"):
        policy_loss_from_log_probs(lp, no_behavior)
    decoupled = {k: v for k, v in batch.items() if k != "behavior_log_probs"}
    with pytest.raises(KeyError, match="behavior_log_probs"):
        policy_loss_from_log_probs(lp, decoupled, sequence_mask=(0.5, 2.0))
    policy_loss_from_log_probs(lp, decoupled)  # no correction: behavior not needed
    misaligned = dict(batch, advantages=batch["advantages"][:, :-1])
    with pytest.raises(ValueError, match="advantages"):
        policy_loss_from_log_probs(lp, misaligned)
    with pytest.raises(ValueError, match="ref_log_probs"):
        policy_loss_from_log_probs(lp, batch, beta=0.1)
    with pytest.raises(ValueError, match="reference"):
        GRPOObjective(model, seq_len=W - 1, beta=0.1).loss(variables, batch, jax.random.key(0))


def test_on_policy_loss_is_minus_mean_advantage_and_metrics(model, variables, batch):
    objective = GRPOObjective(model, seq_len=W - 1, beta=0.2)
    lp = objective.packed_log_probs(variables, batch)
    on_policy = dict(batch, old_log_probs=np.asarray(lp), behavior_log_probs=np.asarray(lp))
    loss_sum, weight, metrics = objective.loss(variables, on_policy, jax.random.key(0), variables)
    mask = batch["response_mask"] > 0
    assert float(weight) == mask.sum()
    assert float(loss_sum) / float(weight) == pytest.approx(
        -batch["advantages"][mask].mean(), abs=1e-6
    )
    assert float(metrics["kl/reference"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["mismatch/kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["mismatch/ess"]) == pytest.approx(1.0, abs=1e-6)
    assert float(metrics["policy/clip_fraction"]) == 0.0


def test_masks_report_what_they_remove(batch):
    lp = jnp.asarray(np.where(batch["response_mask"] > 0, -1.0, 0.0), jnp.float32)
    drifted = dict(batch)
    behavior = np.where(batch["response_mask"] > 0, -1.0, 0.0).astype(np.float32)
    behavior[batch["session_index"] == 0] = -3.0  # session 0 sampled far below the trainer
    drifted["behavior_log_probs"] = behavior
    drifted["old_log_probs"] = np.asarray(lp)
    share = (batch["session_index"] == 0).sum() / (batch["response_mask"] > 0).sum()
    _, weight, metrics = policy_loss_from_log_probs(lp, drifted, sequence_mask=(0.5, 2.0))
    assert float(metrics["mask/sequence"]) == pytest.approx(share)
    assert float(weight) == (batch["response_mask"] > 0).sum() - (batch["session_index"] == 0).sum()
    _, weight, metrics = policy_loss_from_log_probs(lp, drifted, behavior_importance=(0.5, 2.0))
    assert float(metrics["mask/behavior_band"]) == pytest.approx(share)
    assert float(weight) == (batch["response_mask"] > 0).sum()  # IcePop zeroes weights only
    bypass = {k: v for k, v in drifted.items() if k != "old_log_probs"}
    _, weight, metrics = policy_loss_from_log_probs(lp, bypass, behavior_importance=(0.5, 2.0))
    assert float(metrics["mask/behavior_band"]) == pytest.approx(share)
    assert float(weight) == (batch["response_mask"] > 0).sum() - (batch["session_index"] == 0).sum()


def test_session_mean_counts_sessions(batch):
    lp = jnp.asarray(np.where(batch["response_mask"] > 0, -1.1, 0.0), jnp.float32)
    loss_sum, weight, _ = policy_loss_from_log_probs(lp, batch, aggregation="session-mean")
    assert float(weight) == 4.0
    # ratio 1: each session's token mean is minus its advantage
    per_session = [-batch["advantages"][batch["session_index"] == i][0] for i in range(4)]
    assert float(loss_sum) == pytest.approx(sum(per_session), abs=1e-5)


def test_evaluate_scores_prompt_transitions(model, variables):
    objective = GRPOObjective(model, seq_len=W - 1)
    prompt = np.array([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]], np.int32)
    lengths = np.array([3, 5], np.int32)
    out = objective.evaluate(variables, {"prompt": prompt, "prompt_length": lengths}, None)
    assert float(out["weight"]) == 2 + 4
    nll = 0.0
    for row, n in zip(prompt, lengths):
        ids = row[len(row) - n :]
        logits = model.apply(variables, jnp.asarray(ids[None]))[0]
        nll -= float(jax.nn.log_softmax(logits)[np.arange(n - 1), ids[1:]].sum())
    assert float(out["loss"]) == pytest.approx(nll, rel=1e-5)
    summary = GRPOObjective.summarize_evaluation({"loss": float(out["loss"]), "weight": 6.0})
    assert summary["perplexity"] == pytest.approx(math.exp(nll / 6), rel=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {"beta": 0.1},
        {"policy_loss": "gspo", "aggregation": "session-mean", "sequence_mask": (0.1, 10.0)},
        {"policy_loss": "cispo", "behavior_importance": (0.2, 5.0), "geometric_mask": (0.5, 2.0)},
    ],
)
def test_garbage_outside_the_response_never_reaches_loss_or_gradient(batch, options):
    rng = np.random.default_rng(0)
    outside = batch["response_mask"] == 0
    clean = dict(batch)
    lp = np.where(outside, 0.0, rng.normal(-1.0, 0.3, outside.shape)).astype(np.float32)
    ref = np.where(outside, 0.0, lp + 0.1).astype(np.float32)
    dirty = dict(batch)
    for name in ("old_log_probs", "behavior_log_probs", "advantages"):
        dirty[name] = np.where(outside, np.nan, batch[name]).astype(np.float32)
    dirty_lp = np.where(outside, np.inf, lp).astype(np.float32)
    dirty_ref = np.where(outside, np.nan, ref).astype(np.float32)

    def run(b, x, r):
        def fn(v):
            s, w, _ = policy_loss_from_log_probs(v, b, ref_log_probs=jnp.asarray(r), **options)
            return s / w

        return jax.value_and_grad(fn)(jnp.asarray(x))

    (l1, g1), (l2, g2) = run(clean, lp, ref), run(dirty, dirty_lp, dirty_ref)
    assert np.isfinite(float(l2)) and float(l1) == float(l2)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g2))
    assert np.all(np.asarray(g2)[outside] == 0)


def test_objective_uses_a_policy_loss_and_aggregation_registered_by_name(model, variables, batch):
    import dew.rl as rl

    @rl.register_policy_loss("test-grpo-reinforce")
    def reinforce(log_probs, old_log_probs, advantages, mask, **unused):
        return jnp.where(mask, -advantages * log_probs, 0.0), {"pg_clipfrac": jnp.float32(0.25)}

    @rl.register_aggregation("test-grpo-sum")
    def plain_sum(x, mask, group_ids=None):
        return jnp.sum(jnp.where(mask, x, 0.0)), jnp.ones((), x.dtype)

    objective = GRPOObjective(
        model, seq_len=W - 1, policy_loss="test-grpo-reinforce", aggregation="test-grpo-sum"
    )
    loss_sum, weight, metrics = objective.loss(variables, batch, jax.random.key(0))
    log_probs = np.asarray(objective.packed_log_probs(variables, batch))
    keep = np.asarray(batch["response_mask"]) > 0
    want = np.sum(np.where(keep, -np.asarray(batch["advantages"]) * log_probs, 0.0))
    np.testing.assert_allclose(float(loss_sum), want, rtol=1e-5)
    assert float(weight) == 1.0
    assert float(metrics["policy/clip_fraction"]) == 0.25
    assert float(metrics["policy/ppo_kl"]) == 0.0  # the loss reports none
    ppo_sum, _, _ = GRPOObjective(model, seq_len=W - 1).loss(variables, batch, jax.random.key(0))
    assert not np.isclose(float(ppo_sum), want)  # the default would not give this number
    with pytest.raises(ValueError, match=r"policy_loss: expected one of .*test-grpo-reinforce"):
        GRPOObjective(model, seq_len=W - 1, policy_loss="reinforce")


KL_SPELLINGS = [("kl", "k1"), ("abs",), ("mse", "k2"), ("low_var_kl", "k3")]


@pytest.fixture(scope="module")
def reference(variables):
    """Variables a little away from ``variables``: a reference the KL term can see."""
    leaves, tree = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(3), len(leaves))
    moved = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(tree, moved)


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_the_kl_term_uses_the_estimator_named(model, variables, reference, batch, name):
    import dew.rl as rl

    beta = 0.2
    objective = GRPOObjective(model, seq_len=W - 1, beta=beta, kl_estimator=name)
    assert objective.kl_estimator == name and objective.options()["kl_estimator"] == name
    key = jax.random.key(0)
    loss_sum, weight, metrics = objective.loss(variables, batch, key, reference)
    lp = objective.packed_log_probs(variables, batch)
    ref = objective.packed_log_probs(reference, batch)
    keep = (np.asarray(batch["response_mask"]) > 0) & (np.asarray(batch["text_segment_ids"]) > 0)
    kl = np.asarray(rl.kl_penalty(lp, ref, name))[keep]
    np.testing.assert_allclose(float(metrics["kl/reference"]), kl.mean(), rtol=1e-5)
    # on these log-probs only the name's own spellings give that number
    means = {n: np.asarray(rl.kl_penalty(lp, ref, n))[keep].mean() for n in rl.KL_ESTIMATORS}
    same = {n for n, m in means.items() if np.isclose(m, kl.mean(), rtol=1e-5)}
    assert same == next(set(group) for group in KL_SPELLINGS if name in group)
    no_kl, no_kl_weight, _ = GRPOObjective(model, seq_len=W - 1).loss(variables, batch, key)
    assert float(weight) == float(no_kl_weight) == keep.sum()
    np.testing.assert_allclose(float(loss_sum), float(no_kl) + beta * kl.sum(), rtol=1e-5)


def _numpy_entropy(model, variables, batch):
    """[B, W] next-token entropies from the model's logits in float64 numpy (0 off-chain)."""
    ids, seg = np.asarray(batch["input_ids"]), np.asarray(batch["text_segment_ids"])
    logits = np.asarray(
        model.apply(
            variables,
            jnp.asarray(ids[:, :-1]),
            segment_ids=jnp.asarray(seg[:, :-1]),
            positions=jnp.asarray(np.asarray(batch["text_positions"])[:, :-1]),
        ),
        np.float64,
    )
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    h = -(p * np.log(p)).sum(-1)
    same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
    return np.concatenate([np.zeros((len(ids), 1)), np.where(same, h, 0.0)], axis=1)


@pytest.mark.parametrize("aggregation", ["token-mean", "session-mean"])
def test_entropy_bonus_is_subtracted_with_the_losss_aggregation(
    model, variables, reference, batch, aggregation
):
    coeff, key = 0.05, jax.random.key(0)
    plain = GRPOObjective(model, seq_len=W - 1, beta=0.1, aggregation=aggregation)
    bonus = GRPOObjective(
        model, seq_len=W - 1, beta=0.1, aggregation=aggregation, entropy_coeff=coeff
    )
    assert bonus.entropy_coeff == coeff and bonus.options()["entropy_coeff"] == coeff
    lp, entropy = bonus.packed_log_probs_and_entropy(variables, batch)
    np.testing.assert_array_equal(
        np.asarray(lp), np.asarray(plain.packed_log_probs(variables, batch))
    )
    want_h = _numpy_entropy(model, variables, batch)
    np.testing.assert_allclose(np.asarray(entropy), want_h, rtol=1e-5, atol=1e-6)
    base_sum, base_weight, _ = plain.loss(variables, batch, key, reference)
    loss_sum, weight, metrics = bonus.loss(variables, batch, key, reference)
    keep = (np.asarray(batch["response_mask"]) > 0) & (np.asarray(batch["text_segment_ids"]) > 0)
    if aggregation == "token-mean":  # verl token-mean: sum over kept tokens / their count
        total = want_h[keep].sum()
    else:  # one session per completion here: the sum of each session's token mean
        sessions = np.asarray(batch["session_index"])
        total = sum(want_h[keep & (sessions == s)].mean() for s in np.unique(sessions[keep]))
    assert float(weight) == float(base_weight)
    np.testing.assert_allclose(float(loss_sum), float(base_sum) - coeff * total, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["policy/entropy"]), total / float(weight), rtol=1e-5)

    # the bonus reaches the gradient (its own value is pinned by the verl parity fixture)
    def grad(objective):
        return jax.jit(jax.grad(lambda v: objective.loss(v, batch, key, reference)[0]))(variables)

    if aggregation == "token-mean":
        moved = jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), grad(bonus), grad(plain))
        assert max(float(d) for d in jax.tree.leaves(moved)) > 0


def test_entropy_coefficient_zero_leaves_loss_and_gradient_bit_identical(
    model, variables, reference, batch
):
    key = jax.random.key(0)

    def run(objective):
        def fn(v):
            loss_sum, weight, metrics = objective.loss(v, batch, key, reference)
            return loss_sum, (weight, metrics)

        return jax.jit(jax.value_and_grad(fn, has_aux=True))(variables)

    (today, (w0, m0)), g0 = run(GRPOObjective(model, seq_len=W - 1, beta=0.1))
    (zero, (w1, m1)), g1 = run(GRPOObjective(model, seq_len=W - 1, beta=0.1, entropy_coeff=0.0))
    assert float(today) == float(zero) and float(w0) == float(w1)
    assert sorted(m0) == sorted(m1) and "policy/entropy" not in m1
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
