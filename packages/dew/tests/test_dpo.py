"""DPOObjective on a tiny decoder: the loss against an independent numpy computation, the
frozen reference, masking, refusals, evaluation and a short training run."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.data import PreferencePairs
from dew.objectives.rl import DPOObjective
from dew.testing import tiny_decoder

WIDTH = 6
ROWS = [
    {
        "chosen": [1, 2, 3, 5],
        "rejected": [1, 2, 4, 4, 5],
        "chosen_mask": [0, 0, 1, 1],
        "rejected_mask": [0, 0, 1, 1, 1],
    },
    {
        "chosen": [1, 6, 3, 3, 5, 7],
        "rejected": [1, 6, 4, 5],
        "chosen_mask": [0, 0, 1, 1, 1, 1],
        "rejected_mask": [0, 0, 1, 1],
    },
    {
        "chosen": [2, 3, 5],
        "rejected": [2, 4, 5],
        "chosen_mask": [0, 1, 1],
        "rejected_mask": [0, 1, 1],
    },
    {"chosen": [6, 1, 3, 5], "rejected": [6, 1, 4, 5]},
]


@pytest.fixture(scope="module")
def setup():
    model = tiny_decoder(8, WIDTH)
    objective = DPOObjective(model, seq_len=WIDTH - 1, beta=0.5)
    reference = objective.init(jax.random.key(0))
    noise = jax.random.split(jax.random.key(1), len(jax.tree.leaves(reference)))
    policy = jax.tree.unflatten(
        jax.tree.structure(reference),
        [
            leaf + 0.3 * jax.random.normal(k, leaf.shape, leaf.dtype)
            for leaf, k in zip(jax.tree.leaves(reference), noise, strict=True)
        ],
    )
    pairs = PreferencePairs(records=tuple(json.dumps(r) for r in ROWS), seq_len=WIDTH)
    batch = {k: jnp.asarray(v) for k, v in pairs.arrays.items()}
    loss = jax.jit(objective.loss)
    return model, objective, reference, policy, batch, loss


def numpy_dpo(model, policy, reference, batch, beta):
    """Independent float64 computation of the summed loss and the reward metrics."""
    ids = np.asarray(batch["input_ids"])
    mask = np.asarray(batch["completion_mask"])[:, :, 1:] > 0
    pairs, _, width = ids.shape
    flat = ids.reshape(2 * pairs, width)

    def sequence_sums(variables):
        logits = np.asarray(model.apply(variables, jnp.asarray(flat[:, :-1])), np.float64)
        logits = logits - logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        picked = np.take_along_axis(log_probs, flat[:, 1:, None], -1)[..., 0]
        picked = picked.reshape(pairs, 2, width - 1)
        return np.where(mask, picked, 0.0).sum(-1)

    rewards = beta * (sequence_sums(policy) - sequence_sums(reference))
    margin = rewards[:, 0] - rewards[:, 1]
    losses = np.logaddexp(0.0, -margin)  # -log sigmoid(margin)
    return losses.sum(), rewards


def test_loss_matches_numpy(setup) -> None:
    model, objective, reference, policy, batch, loss = setup
    loss_sum, weight, metrics = loss(policy, batch, jax.random.key(0), reference)
    expected, rewards = numpy_dpo(model, policy, reference, batch, objective.beta)
    assert float(weight) == len(ROWS)
    np.testing.assert_allclose(float(loss_sum), expected, rtol=2e-5)
    np.testing.assert_allclose(float(metrics["rewards/chosen"]), rewards[:, 0].mean(), rtol=1e-4)
    np.testing.assert_allclose(float(metrics["rewards/rejected"]), rewards[:, 1].mean(), rtol=1e-4)
    np.testing.assert_allclose(
        float(metrics["rewards/margin"]), (rewards[:, 0] - rewards[:, 1]).mean(), rtol=1e-4
    )
    accuracy = float(np.mean(rewards[:, 0] > rewards[:, 1]))
    assert float(metrics["rewards/accuracy"]) == pytest.approx(accuracy)
    assert np.all(np.abs(rewards) > 1e-3)  # the perturbed policy really moved


def test_unmoved_policy_reports_log2_and_no_wins(setup) -> None:
    _, _, reference, _, batch, loss = setup
    loss_sum, weight, metrics = loss(reference, batch, jax.random.key(0), reference)
    assert float(loss_sum) == pytest.approx(len(ROWS) * math.log(2.0), rel=1e-6)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"):
        assert float(metrics[name]) == 0.0


def test_sum_adds_over_microbatches(setup) -> None:
    _, _, reference, policy, batch, loss = setup
    whole = loss(policy, batch, jax.random.key(0), reference)
    halves = [
        loss(policy, {k: v[s] for k, v in batch.items()}, jax.random.key(0), reference)
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert float(halves[0][0] + halves[1][0]) == pytest.approx(float(whole[0]), rel=1e-6)
    assert float(halves[0][1] + halves[1][1]) == float(whole[1])


def test_reference_gets_no_gradient(setup) -> None:
    _, objective, reference, policy, batch, _ = setup
    key = jax.random.key(0)
    ref_grad = jax.grad(lambda r: objective.loss(policy, batch, key, r)[0])(reference)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(ref_grad))
    policy_grad = jax.grad(lambda p: objective.loss(p, batch, key, reference)[0])(policy)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(policy_grad)) > 0.0


def test_padding_ids_do_not_matter(setup) -> None:
    _, _, reference, policy, batch, loss = setup
    mask = np.asarray(batch["completion_mask"])
    ids = np.asarray(batch["input_ids"]).copy()
    ids[0, 0, 4:] = 7  # chosen row 0 ends at 4 ids: these are padding
    assert np.all(mask[0, 0, 4:] == 0)
    changed = {**batch, "input_ids": jnp.asarray(ids)}
    base = loss(policy, batch, jax.random.key(0), reference)[0]
    assert float(loss(policy, changed, jax.random.key(0), reference)[0]) == float(base)
    ids[0, 0, 1] = 6  # a prompt token: context for the completion, so the loss moves
    changed = {**batch, "input_ids": jnp.asarray(ids)}
    assert float(loss(policy, changed, jax.random.key(0), reference)[0]) != float(base)


def test_batch_and_reference_are_checked(setup) -> None:
    _, objective, reference, policy, batch, _ = setup
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="reference: DPOObjective needs the frozen reference"):
        objective.loss(policy, batch, key, None)
    with pytest.raises(KeyError, match="completion_mask"):
        objective.loss(policy, {"input_ids": batch["input_ids"]}, key, reference)
    short = {k: v[:, :, :-1] for k, v in batch.items()}
    with pytest.raises(ValueError, match=r"batch\['input_ids'\]: expected shape \[B, 2, 6\]"):
        objective.loss(policy, short, key, reference)
    flat = {k: v[:, 0] for k, v in batch.items()}
    with pytest.raises(ValueError, match="chosen/rejected"):
        objective.loss(policy, flat, key, reference)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"beta": 0.0}, ValueError, "beta: expected a positive number"),
        ({"beta": -0.1}, ValueError, "beta: expected a positive number"),
        ({"beta": float("nan")}, ValueError, "beta"),
        ({"beta": float("inf")}, ValueError, "beta: expected a finite number"),
        ({"beta": True}, ValueError, "beta"),
        ({"ema_decay": 0.99}, ValueError, "ema_decay: DPO keeps its reference frozen"),
        ({"ema_decay": None}, ValueError, "ema_decay"),
        ({"seq_len": 0}, ValueError, "seq_len"),
        ({"nll_weight": -0.5}, ValueError, "nll_weight: expected a finite number >= 0"),
        ({"nll_weight": float("nan")}, ValueError, "nll_weight"),
        ({"nll_weight": "1"}, ValueError, "nll_weight"),
        ({"pretrained": {"weights": 1}}, ValueError, "pretrained: expected a full variables"),
    ],
)
def test_constructor_refusals(setup, kwargs, error, match) -> None:
    model = setup[0]
    arguments = {"seq_len": WIDTH - 1, "beta": 0.1, **kwargs}
    with pytest.raises(error, match=match):
        DPOObjective(model, **arguments)


def test_ema_decay_is_fixed_and_pretrained_is_the_start(setup) -> None:
    model, objective, reference, policy, _, _ = setup
    assert objective.ema_decay == 1.0
    with pytest.raises(AttributeError):
        objective.ema_decay = 0.9  # type: ignore[misc]
    assert DPOObjective(model, WIDTH - 1, beta=0.1, ema_decay=1.0).ema_decay == 1.0
    started = DPOObjective(model, WIDTH - 1, beta=0.1, pretrained=policy)
    assert started.init(jax.random.key(5)) == dict(policy)
    assert set(reference) == {"params"}


def test_nll_weight_adds_the_chosen_token_mean_nll(setup) -> None:
    """RPO: the loss grows by alpha times the chosen side's token-mean NLL of the whole
    batch (pooled over tokens, not a mean of per-pair means), computed here in numpy."""
    model, objective, reference, policy, batch, loss = setup
    key = jax.random.key(0)
    plain, pairs, metrics = loss(policy, batch, key, reference)
    rpo = DPOObjective(model, seq_len=WIDTH - 1, beta=0.5, nll_weight=0.7)
    total, rpo_pairs, rpo_metrics = jax.jit(rpo.loss)(policy, batch, key, reference)
    ids = np.asarray(batch["input_ids"])[:, 0]
    mask = np.asarray(batch["completion_mask"])[:, 0, 1:] > 0
    logits = np.asarray(model.apply(policy, jnp.asarray(ids[:, :-1])), np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll = (lse - np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0])[mask].mean()
    assert float(rpo_pairs) == float(pairs) == len(ROWS)
    np.testing.assert_allclose(float(metrics["nll/chosen"]), nll, rtol=1e-5)
    np.testing.assert_allclose(float(total), float(plain) + 0.7 * nll * len(ROWS), rtol=1e-5)
    # the term pulls the chosen answers up: its gradient differs from plain DPO's
    grads = [jax.grad(lambda v, o=o: o.loss(v, batch, key, reference)[0])(policy)
             for o in (objective, rpo)]  # fmt: skip
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), *grads)
    assert max(jax.tree.leaves(diff)) > 0


def test_evaluate_is_chosen_answer_perplexity(setup) -> None:
    model, objective, _, policy, batch, _ = setup
    out = jax.jit(objective.evaluate)(policy, batch, jax.random.key(0))
    ids = np.asarray(batch["input_ids"])[:, 0]
    mask = np.asarray(batch["completion_mask"])[:, 0, 1:] > 0
    logits = np.asarray(model.apply(policy, jnp.asarray(ids[:, :-1])), np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    nll = lse - np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0]
    assert float(out["weight"]) == mask.sum()
    np.testing.assert_allclose(float(out["loss"]), nll[mask].sum(), rtol=1e-5)
    summary = objective.summarize_evaluation({k: float(v) for k, v in out.items()})
    assert summary["perplexity"] == pytest.approx(math.exp(nll[mask].mean()), rel=1e-5)


def test_training_prefers_the_chosen_answers(setup) -> None:
    model = setup[0]
    records = tuple(json.dumps(row) for row in ROWS)
    pairs = PreferencePairs(records=records, seq_len=WIDTH)
    objective = DPOObjective(model, seq_len=WIDTH - 1, beta=0.5)
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(3))
    data = pairs.load(batch=4, val=PreferencePairs(records=records, seq_len=WIDTH))
    before = trainer.evaluate(trainer.initial_state().params, data)
    state = trainer.fit(data, steps=25)
    batch = {k: jnp.asarray(v) for k, v in pairs.arrays.items()}
    loss_sum, weight, metrics = objective.loss(state.params, batch, jax.random.key(0), state.ema)
    assert float(loss_sum / weight) < 0.5 * math.log(2.0)
    assert float(metrics["rewards/accuracy"]) == 1.0
    assert float(metrics["rewards/margin"]) > 0.0
    after = trainer.evaluate(state.params, data)
    assert set(after) >= {"perplexity", "loss"} and math.isfinite(after["perplexity"])
    chosen_targets = int(np.sum(pairs.arrays["completion_mask"][:, 0, 1:]))
    assert before["tokens"] == after["tokens"] == chosen_targets == 11
    assert after["perplexity"] < before["perplexity"]
