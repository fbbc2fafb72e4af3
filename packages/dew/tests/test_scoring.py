"""The shared scoring module and the rollout subpackage's old import paths."""

from __future__ import annotations

import importlib
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives import scoring


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_target_log_probs_match_a_numpy_log_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (2, 5))
    ours = np.asarray(scoring.target_log_probs(jnp.asarray(logits), jnp.asarray(targets)))
    want = np.take_along_axis(_log_softmax(logits.astype(np.float64)), targets[..., None], -1)
    np.testing.assert_allclose(ours, want[..., 0], rtol=1e-5, atol=1e-6)
    nll, correct = scoring.token_nll(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_array_equal(np.asarray(nll), -ours)
    np.testing.assert_array_equal(np.asarray(correct), logits.argmax(-1) == targets)


def test_target_log_probs_gradient_is_onehot_minus_softmax() -> None:
    # The gradient against the float64 formula: g * (onehot - softmax).
    rng = np.random.default_rng(3)
    logits = (3 * rng.standard_normal((2, 5, 7))).astype(np.float32)
    targets = rng.integers(0, 7, (2, 5))
    weights = rng.standard_normal((2, 5)).astype(np.float32)

    def weighted(x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.asarray(weights) * scoring.target_log_probs(x, jnp.asarray(targets)))

    grad = np.asarray(jax.jit(jax.grad(weighted))(jnp.asarray(logits)))
    probs = np.exp(_log_softmax(logits.astype(np.float64)))
    onehot = np.eye(7)[targets]
    np.testing.assert_allclose(grad, weights[..., None] * (onehot - probs), rtol=1e-5, atol=1e-6)
    # bfloat16 logits are scored (and differentiated) in float32
    low = jax.grad(weighted)(jnp.asarray(logits, jnp.bfloat16))
    assert low.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(low)))


def test_target_log_probs_renormalise_over_a_support() -> None:
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 3, 6)).astype(np.float32)
    targets = np.array([[2, 4, 1]])
    # input column 2 is target column 1: its kept ids are {4, 5}; other columns keep everything
    support_ids = jnp.asarray([[4, 5, -1]])
    support_columns = jnp.asarray([[2, 2, -1]])
    ours = np.asarray(
        scoring.target_log_probs(
            jnp.asarray(logits), jnp.asarray(targets), support_ids, support_columns
        )
    )
    full = _log_softmax(logits.astype(np.float64))
    kept = logits[0, 1, [4, 5]].astype(np.float64)
    want_kept = logits[0, 1, 4] - np.log(np.exp(kept).sum())
    np.testing.assert_allclose(ours[0, 1], want_kept, rtol=1e-5)
    np.testing.assert_allclose(ours[0, [0, 2]], full[0, [0, 2], [2, 1]], rtol=1e-5)


def test_same_chain_and_positions_follow_the_segments() -> None:
    segments = jnp.asarray([[1, 1, 2, 2, 2, 0], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(
        np.asarray(scoring.same_chain(segments)),
        [[True, False, True, True, False], [False, False, True, True, True]],
    )
    np.testing.assert_array_equal(
        np.asarray(scoring.positions_from_segments(segments)),
        [[0, 1, 0, 1, 2, 0], [0, 1, 0, 1, 2, 3]],
    )


def test_summarize_nll_with_and_without_accuracy() -> None:
    totals = {"loss": 6.0, "weight": 3.0, "correct": 1.5}
    out = scoring.summarize_nll(totals, accuracy=True)
    assert out == {"loss": 2.0, "perplexity": math.exp(2.0), "accuracy": 0.5, "tokens": 3.0}
    assert "accuracy" not in scoring.summarize_nll(totals, accuracy=False)
    empty = scoring.summarize_nll({}, accuracy=True)
    assert empty["tokens"] == 0.0 and all(math.isnan(empty[k]) for k in ("loss", "accuracy"))
    huge = scoring.summarize_nll({"loss": 1e6, "weight": 1.0}, accuracy=False)
    assert huge["perplexity"] == math.exp(scoring.PERPLEXITY_CAP)


def test_objectives_share_one_summary() -> None:
    from dew.objectives.lm import LMObjective
    from dew.objectives.rl.dpo import DPOObjective
    from dew.objectives.rl.grpo import GRPOObjective

    totals = {"loss": 3.0, "weight": 2.0, "correct": 1.0}
    assert LMObjective.summarize_evaluation(totals) == scoring.summarize_nll(totals, accuracy=True)
    assert DPOObjective.summarize_evaluation(totals) == LMObjective.summarize_evaluation(totals)
    assert GRPOObjective.summarize_evaluation(totals) == scoring.summarize_nll(
        totals, accuracy=False
    )


def test_packed_log_probs_score_each_id_inside_its_chain() -> None:
    vocab = 5

    class Table:
        """Logits that depend only on the input id, so chains cannot leak into each other."""

        def apply(self, variables, ids, segment_ids=None, positions=None):
            return variables["params"][ids]

    table = jnp.asarray(np.random.default_rng(2).standard_normal((vocab, vocab)), jnp.float32)
    batch = {
        "input_ids": jnp.asarray([[1, 2, 3, 4, 0]]),
        "text_segment_ids": jnp.asarray([[1, 1, 2, 2, 0]]),
        "text_positions": jnp.asarray([[0, 1, 0, 1, 0]]),
    }
    out = np.asarray(scoring.packed_log_probs(Table(), {"params": table}, batch))
    logp = _log_softmax(np.asarray(table, np.float64))
    np.testing.assert_allclose(out, [[0.0, logp[1, 2], 0.0, logp[3, 4], 0.0]], rtol=1e-5)
    hot = np.asarray(scoring.packed_log_probs(Table(), {"params": table}, batch, temperature=2.0))
    logp2 = _log_softmax(np.asarray(table, np.float64) / 2.0)
    np.testing.assert_allclose(hot[0, 1], logp2[1, 2], rtol=1e-5)
    assert jax.numpy.shape(out) == (1, 5)


#: The names the spec imports from ``dew.objectives.rl.sessions``, whose home is dew.sessions.
SPEC_SESSION_NAMES = [
    "Call",
    "ESTIMATORS",
    "GROUP_EPSILON",
    "Session",
    "Status",
    "TRUNCATIONS",
    "Task",
    "chain_lengths",
    "group_advantages",
    "pack",
    "rows_needed",
    "session_metrics",
]


def test_the_spec_paths_name_the_objects_of_their_rooms() -> None:
    facade = importlib.import_module("dew.objectives.rl.sessions")
    sessions = importlib.import_module("dew.sessions")
    assert facade is sessions
    from dew.objectives.rl.sessions import pack

    assert pack is sessions.pack
    rl = importlib.import_module("dew.objectives.rl")
    assert rl.sessions is sessions
    assert rl.verl is importlib.import_module("dew.objectives.rl.verl")
    assert rl.verl is importlib.import_module("dew.sessions.verl")
    sampled = importlib.import_module("dew.rollouts.sampled")
    assert rl.SampledRollout is sampled.SampledRollout
    assert set(sessions.__all__) >= set(SPEC_SESSION_NAMES)


def test_check_text_batch_names_the_objective_and_the_field():
    good = {"text": jnp.zeros((2, 5), jnp.int32), "text_segment_ids": jnp.ones((2, 5), jnp.int32)}
    scoring.check_text_batch(good, "LMObjective", 5, ("text", "text_segment_ids"))
    with pytest.raises(
        KeyError, match=re.escape("LMObjective needs a 'text' field, got ['tokens']")
    ):
        scoring.check_text_batch({"tokens": good["text"]}, "LMObjective", 5, ("text",))
    bad = {"text": good["text"], "text_segment_ids": jnp.ones((2, 4), jnp.int32)}
    message = "batch['text_segment_ids']: expected shape [B, 5] (seq_len + 1), got (2, 4)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        scoring.check_text_batch(bad, "X", 5, ("text", "text_segment_ids"))
    # Fields outside the checked list are not the checker's business.
    scoring.check_text_batch(bad, "X", 5, ("text",))
