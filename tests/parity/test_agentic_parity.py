"""GRPOObjective's loss on packed rows against verl 0.9.1 on the same chains, one per row.

Fixtures: ``tests/fixtures/agentic/`` written by ``tools/parity_agentic.py`` (verl run in the
reference environment). Here the same sessions go through Dew's ``pack`` into shared rows,
the recorded per-token log-probs are placed at their packed cells, and the loss core
(``policy_loss_from_log_probs``) must give verl's loss, its gradient with respect to the
current log-probs (mapped back to verl's layout) and the metrics Dew mirrors.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.objectives.rl.grpo import policy_loss_from_log_probs
from dew.objectives.rl.sessions import Call, Session, Status, group_advantages, pack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agentic"
SIDECAR = json.loads((FIXTURES / "agentic.json").read_text())
CHAINS = dict(np.load(FIXTURES / "chains.npz"))
LOSSES = dict(np.load(FIXTURES / "losses.npz"))
WIDTH = 32

# Largest differences measured: loss 2.7e-8, gradient 7.5e-9 (float32); bounds with margin.
LOSS_TOL = 1e-7
GRAD_TOL = 2e-8


def build_sessions(with_raw: bool) -> list[Session]:
    sessions = []
    for s in range(CHAINS["ids"].shape[0]):
        n = int(CHAINS["lengths"][s])
        ids = CHAINS["ids"][s, :n]
        call_of = CHAINS["call_of"][s, :n]
        calls = []
        for k in range(int(call_of.max()) + 1):
            where = np.flatnonzero(call_of == k)
            calls.append(
                Call(
                    prompt_ids=ids[: where[0]],
                    sampled_ids=ids[where],
                    behavior_log_probs=CHAINS["rollout_log_prob"][s, where],
                    raw_log_probs=CHAINS["old_log_prob"][s, where] if with_raw else None,
                )
            )
        sessions.append(
            Session(
                task=int(CHAINS["group"][s]),
                sample=s,
                calls=calls,
                status=Status.COMPLETED,
                reward=float(CHAINS["rewards"][s]),
            )
        )
    return sessions


def cell_map(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every occupied packed cell: its (row, column) and the (session, position) it holds."""
    rows, cols = np.nonzero(batch["text_segment_ids"] > 0)
    owner = {}
    for r, c in zip(rows, cols):
        s = batch["session_index"][r, c]
        if s >= 0:
            owner[(r, batch["text_segment_ids"][r, c])] = s
    sessions = np.array([owner[(r, batch["text_segment_ids"][r, c])] for r, c in zip(rows, cols)])
    positions = batch["text_positions"][rows, cols]
    return np.stack([rows, cols]), sessions, positions


def to_packed(values: np.ndarray, where, sessions, positions, shape) -> np.ndarray:
    out = np.zeros(shape, np.float32)
    out[where[0], where[1]] = values[sessions, positions]
    return out


def to_chains(values: np.ndarray, where, sessions, positions) -> np.ndarray:
    out = np.zeros(CHAINS["ids"].shape, np.float32)
    out[sessions, positions] = values[where[0], where[1]]
    return out


def test_fixture_provenance():
    assert SIDECAR["package"] == "verl" and SIDECAR["version"] == "0.9.1"
    assert SIDECAR["recorder"] == "tools/parity_agentic.py"
    assert {c["loss_agg_mode"] for c in SIDECAR["cases"]} == {"token-mean", "seq-mean-token-mean"}
    assert len(SIDECAR["cases"]) >= 20


@pytest.mark.parametrize(
    ("estimator", "key", "kwargs"),
    [("group", "adv_grpo", {}), ("mean", "adv_grpo_mean", {}), ("rloo", "adv_rloo", {})],
)
def test_advantages_match_verl(estimator, key, kwargs):
    ours = group_advantages(CHAINS["rewards"], CHAINS["group"].tolist(), estimator)
    np.testing.assert_allclose(ours, CHAINS[key], rtol=0, atol=3e-7)
    batch = pack(build_sessions(with_raw=True), WIDTH, estimator=estimator)
    where, sessions, positions = cell_map(batch)
    sampled = batch["response_mask"][where[0], where[1]] > 0
    np.testing.assert_allclose(
        batch["advantages"][where[0], where[1]][sampled],
        CHAINS[key][sessions][sampled].astype(np.float32),
        atol=3e-7,
    )


def _case_ids():
    return [c["name"] for c in SIDECAR["cases"]]


@pytest.fixture(scope="module")
def packed():
    out = {}
    for with_raw in (True, False):
        batch = pack(build_sessions(with_raw=with_raw), WIDTH)
        where, sessions, positions = cell_map(batch)
        shape = batch["input_ids"].shape
        batch["advantages"] = to_packed(
            np.broadcast_to(CHAINS["advantages"][:, None], CHAINS["ids"].shape),
            where,
            sessions,
            positions,
            shape,
        )
        arrays = {
            name: to_packed(CHAINS[name], where, sessions, positions, shape)
            for name in ("log_prob", "ref_log_prob", "old_log_prob", "rollout_log_prob")
        }
        out[with_raw] = (batch, where, sessions, positions, arrays)
    return out


@pytest.mark.parametrize("case", SIDECAR["cases"], ids=_case_ids())
def test_loss_and_gradients_match_verl(case, packed):
    options = dict(case["dew_options"])
    bypass = options.pop("bypass")
    for name in ("behavior_importance", "sequence_mask", "geometric_mask"):
        if isinstance(options[name], list):
            options[name] = tuple(options[name])
    batch, where, sessions, positions, arrays = packed[not bypass]
    assert ("old_log_probs" in batch) is (not bypass)
    if not bypass:
        np.testing.assert_array_equal(batch["old_log_probs"], arrays["old_log_prob"])
    np.testing.assert_array_equal(batch["behavior_log_probs"], arrays["rollout_log_prob"])
    device_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    ref = jnp.asarray(arrays["ref_log_prob"])

    def loss_fn(log_probs):
        loss_sum, weight, metrics = policy_loss_from_log_probs(
            log_probs, device_batch, ref_log_probs=ref, **options
        )
        return loss_sum / weight, metrics

    (loss, metrics), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
        jnp.asarray(arrays["log_prob"])
    )
    name = case["name"]
    expected_loss = float(LOSSES[f"{name}__loss"])
    assert abs(float(loss) - expected_loss) <= LOSS_TOL, (float(loss), expected_loss)
    ours = to_chains(np.asarray(grad), where, sessions, positions)
    # packing must not leak gradient into cells that hold no chain token
    occupied = np.zeros(batch["input_ids"].shape, bool)
    occupied[where[0], where[1]] = True
    assert np.all(np.asarray(grad)[~occupied] == 0)
    np.testing.assert_allclose(ours, LOSSES[f"{name}__grad"], rtol=0, atol=GRAD_TOL)

    def check(metric, verl_key, atol=1e-6):
        key = f"{name}__{verl_key}"
        if key in LOSSES:
            assert float(metrics[metric]) == pytest.approx(float(LOSSES[key]), abs=atol), metric

    check("policy/clip_fraction", "pg_clipfrac")
    check("policy/clip_fraction_lower", "pg_clipfrac_lower")
    check("policy/ppo_kl", "ppo_kl")
    check("mismatch/kl", "kl")
    check("mismatch/k3_kl", "k3_kl", atol=5e-6)
    if options["behavior_importance"] is not None and not bypass:
        check("mismatch/ess", "rollout_is_eff_sample_size")
    check("mask/sequence", "rollout_rs_seq_sum_k1_masked_fraction")
    check("mask/geometric", "rollout_rs_seq_mean_k1_masked_fraction")
    if bypass:
        check("mask/behavior_band", "rollout_rs_token_k1_masked_fraction")
    if options["beta"] > 0 and options["aggregation"] == "token-mean":
        check("kl/reference", "kl_loss")  # the metric is a token mean in both modes
