"""SampledRollout: sampling, reward calls, packing and refusals, on a tiny real decoder."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.data.prompts import encode_text
from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rl.sessions import group_advantages
from dew.rollouts.sampled import RewardError, SampledRollout, default_decode
from dew.sampling import Sampling
from dew.testing import tiny_decoder

VOCAB = 16
P, R, G = 5, 4, 3
EOS = 15


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, 64, init_std=0.5)


@pytest.fixture(scope="module")
def objective(model):
    return GRPOObjective(model, seq_len=P + R - 1)


@pytest.fixture(scope="module")
def variables(objective):
    return objective.init(jax.random.key(0))


def prompt_batch():
    prompt = np.zeros((2, P), np.int32)
    prompt[0, 2:] = [1, 2, 3]
    prompt[1, :] = [4, 5, 6, 7, 8]
    return {
        "prompt": prompt,
        "prompt_length": np.array([3, 5], np.int32),
        "data_source": encode_text(["toy", "toy"], "data_source"),
        "ground_truth": encode_text(["7", "12"], "ground_truth"),
        "extra_info": encode_text(['{"i": 0}', ""], "extra_info"),
    }


class Recorder:
    def __init__(self, value=None):
        self.calls = []
        self.value = value

    def __call__(self, data_source, completion, ground_truth, extra_info):
        self.calls.append((data_source, completion, ground_truth, extra_info))
        if self.value is not None:
            return self.value
        return float(ground_truth in completion.split())


@pytest.fixture(scope="module")
def sampled(objective, variables):
    reward = Recorder()
    rollout = SampledRollout(
        objective,
        reward,
        groups=G,
        max_new_tokens=R,
        sampling=Sampling(temperature=1.0, eos_id=EOS),
    )
    out = rollout(variables, prompt_batch(), jax.random.key(3))
    return rollout, reward, out


def test_layout_and_alignment(sampled, objective, variables):
    rollout, reward, out = sampled
    n = 2 * G
    for name, column in out.items():
        if name == "rewards":
            assert column.shape == (n,)
        else:
            assert column.shape[:2] == (n, P + R), name
    contexts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    # every completion is one chain: its unpadded prompt then its sampled ids
    for index in range(n):
        cells = out["session_index"] == index
        rows = np.unique(np.nonzero(cells)[0])
        assert rows.size == 1
        r = rows[0]
        cols = np.flatnonzero(cells[r])
        seg = out["text_segment_ids"][r, cols[0]]
        chain = out["input_ids"][r][out["text_segment_ids"][r] == seg]
        context = contexts[index // G]
        assert chain[: len(context)].tolist() == context
        sampled_ids = chain[len(context) :]
        assert 1 <= sampled_ids.size <= R
        assert (
            out["response_mask"][r][out["text_segment_ids"][r] == seg][len(context) :] == 1
        ).all()
        if EOS in sampled_ids.tolist():
            assert sampled_ids[-1] == EOS and EOS not in sampled_ids[:-1].tolist()
    # old_log_probs are the raw policy's; a full forward pass over the packed rows agrees
    rescored = np.asarray(objective.packed_log_probs(variables, out))
    mask = out["response_mask"] > 0
    np.testing.assert_allclose(out["old_log_probs"][mask], rescored[mask], atol=2e-5)
    # temperature 1 and no filters: the behavior distribution is the raw one
    np.testing.assert_allclose(
        out["behavior_log_probs"][mask], out["old_log_probs"][mask], atol=1e-5
    )


def test_rewards_read_decoded_text_without_eos(sampled):
    rollout, reward, out = sampled
    assert len(reward.calls) == 2 * G
    for index, (data_source, completion, ground_truth, extra_info) in enumerate(reward.calls):
        row = index // G
        assert data_source == "toy"
        assert ground_truth == ["7", "12"][row]
        assert extra_info == ['{"i": 0}', ""][row]
        assert str(EOS) not in completion.split()
        cells = (out["session_index"] == index) & (out["response_mask"] > 0)
        ids = out["input_ids"][cells]
        ids = ids[:-1] if ids[-1] == EOS else ids
        assert completion == default_decode(ids)
    expected = np.array([float(gt in c.split()) for _, c, gt, _ in reward.calls], np.float32)
    np.testing.assert_array_equal(out["rewards"], expected)


def test_advantages_are_group_relative(sampled):
    _, _, out = sampled
    adv = group_advantages(out["rewards"], [i // G for i in range(2 * G)], "group")
    for index in range(2 * G):
        values = out["advantages"][out["session_index"] == index]
        np.testing.assert_allclose(values, np.float32(adv[index]), rtol=1e-6, atol=1e-7)


def test_loss_runs_on_rollout_batch(sampled, objective, variables):
    _, _, out = sampled
    batch = {k: jnp.asarray(v) for k, v in out.items()}
    loss_sum, weight, metrics = jax.jit(objective.loss)(variables, batch, jax.random.key(0))
    assert float(weight) == float(out["response_mask"].sum())
    assert math.isfinite(float(loss_sum))
    assert float(metrics["reward/mean"]) == pytest.approx(float(out["rewards"].mean()))
    # on-policy: the ratio is one, so the loss is minus the token-mean advantage
    mask = out["response_mask"] > 0
    assert float(loss_sum) / float(weight) == pytest.approx(
        -float(out["advantages"][mask].mean()), abs=1e-4
    )


def test_top_k_support_and_temperature(objective, variables, model):
    rollout = SampledRollout(
        objective,
        Recorder(value=1.0),
        groups=2,
        max_new_tokens=R,
        sampling=Sampling(temperature=0.7, top_k=3, eos_id=EOS, return_support=True),
    )
    out = rollout(variables, prompt_batch(), jax.random.key(5))
    assert "support_ids" in out and out["support_ids"].shape[0] == 4
    cols = out["support_columns"]
    for r in range(4):
        for c in np.unique(cols[r][cols[r] >= 0]):
            kept = out["support_ids"][r][cols[r] == c]
            assert kept.size == 3 and out["input_ids"][r, c] in kept
            assert out["response_mask"][r, c] == 1
    mask = out["response_mask"] > 0
    assert (out["support_columns"] >= 0).sum() == 3 * mask.sum()
    # scoring at the sampling temperature over the recorded support gives the behavior policy
    tempered = GRPOObjective(model, seq_len=P + R - 1, sampling_temperature=0.7)
    scored = np.asarray(tempered.packed_log_probs(variables, out))
    np.testing.assert_allclose(scored[mask], out["behavior_log_probs"][mask], atol=2e-5)
    assert np.abs(out["behavior_log_probs"][mask] - out["old_log_probs"][mask]).max() > 0.05


def test_rescore_matches_recorded_log_probs(objective, variables):
    rollout = SampledRollout(
        objective, Recorder(value=0.0), groups=2, max_new_tokens=R, rescore=True
    )
    out = rollout(variables, prompt_batch(), jax.random.key(6))
    assert rollout.last_timings["rescoring"] > 0
    assert set(rollout.last_timings) == {"generation", "reward", "pack", "rescoring"}
    assert out["old_log_probs"].dtype == np.float32


def test_refusals(objective, variables, model):
    with pytest.raises(ValueError, match="groups"):
        SampledRollout(objective, Recorder(), groups=1, max_new_tokens=R)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SampledRollout(objective, Recorder(), groups=2, max_new_tokens=0)
    with pytest.raises(ValueError, match="estimator"):
        SampledRollout(objective, Recorder(), groups=2, max_new_tokens=R, estimator="ppo")
    with pytest.raises(TypeError, match="reward"):
        SampledRollout(objective, "not callable", groups=2, max_new_tokens=R)
    wrong = SampledRollout(
        GRPOObjective(model, seq_len=P + R), Recorder(), groups=2, max_new_tokens=R
    )
    with pytest.raises(ValueError, match="seq_len"):
        wrong(variables, prompt_batch(), jax.random.key(0))
    batch = prompt_batch()
    del batch["prompt_length"]
    rollout = SampledRollout(objective, Recorder(), groups=2, max_new_tokens=R)
    with pytest.raises(KeyError, match="prompt_length"):
        rollout(variables, batch, jax.random.key(0))


@pytest.mark.parametrize(
    ("reward", "match"),
    [
        (lambda *a: 1 / 0, "ZeroDivisionError.*prompt row 0"),
        (lambda *a: float("nan"), "finite.*prompt row 0"),
        (lambda *a: "high", "finite.*prompt row 0"),
        (lambda *a: None, "finite"),
    ],
)
def test_bad_rewards_name_the_prompt(objective, variables, reward, match):
    rollout = SampledRollout(objective, reward, groups=2, max_new_tokens=R)
    with pytest.raises(RewardError, match=match):
        rollout(variables, prompt_batch(), jax.random.key(0))
