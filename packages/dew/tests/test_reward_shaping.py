"""Reward shaping in the trainer's own rollouts: DAPO's overlong penalty and KL in the reward
(fixed and adaptive controllers), checked against dew.rl on the packed batch, the controller
carried through a checkpoint exactly, and the config keys with their one-line errors."""

from __future__ import annotations

import itertools
import json

import jax
import numpy as np
import optax
import pytest

from dew import rl
from dew.data.dataset import Dataset
from dew.data.prompts import encode_text
from dew.objectives.rl.grpo import GRPOObjective
from dew.recipes.schema import ConfigError
from dew.recipes.stages import build_stage
from dew.rollouts.sampled import SampledRollout
from dew.rollouts.shaping import KLInReward, Overlong
from dew.sampling import Sampling
from dew.sessions import group_advantages
from dew.testing import tiny_decoder
from dew.trainer import Trainer

VOCAB, P, R, G, EOS = 16, 4, 6, 4, 15
ROWS = 3


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(VOCAB, 32, init_std=0.5)


@pytest.fixture(scope="module")
def start(model):
    return GRPOObjective(model, seq_len=P + R - 1).init(jax.random.key(0))


@pytest.fixture(scope="module")
def moved(start):
    """Variables a step away from ``start``: the policy that samples, so the KL is not 0."""
    leaves, tree = jax.tree.flatten(start)
    keys = jax.random.split(jax.random.key(5), len(leaves))
    noise = [0.3 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(tree, [x + n for x, n in zip(leaves, noise)])


def prompts():
    prompt = np.array([[0, 1, 2, 3], [0, 0, 4, 5], [6, 7, 8, 9]], np.int32)
    return {
        "prompt": prompt,
        "prompt_length": np.array([3, 2, 4], np.int32),
        "data_source": encode_text(["toy"] * ROWS, "data_source"),
        "ground_truth": encode_text(["3", "5", "7"], "ground_truth"),
        "extra_info": encode_text([""] * ROWS, "extra_info"),
    }


def sevens(data_source, completion, ground_truth, extra_info):
    return float(completion.split().count("7"))


def rollout_with(model, start, **shaping):
    objective = GRPOObjective(model, seq_len=P + R - 1, pretrained=start)
    sampling = Sampling(temperature=1.0, eos_id=EOS)
    return SampledRollout(objective, sevens, groups=G, max_new_tokens=R, sampling=sampling,
                          **shaping)  # fmt: skip


def session_lengths(out):
    index, mask = np.asarray(out["session_index"]), np.asarray(out["response_mask"]) > 0
    return np.bincount(index[mask & (index >= 0)], minlength=ROWS * G)


def test_overlong_penalty_shapes_the_rewards_and_the_advantages(model, start):
    plain = rollout_with(model, start)
    shaped = rollout_with(model, start, overlong=Overlong(buffer=3, penalty_factor=0.5))
    a = plain(start, prompts(), jax.random.key(1))
    b = shaped(start, prompts(), jax.random.key(1))
    lengths = session_lengths(b)
    np.testing.assert_array_equal(lengths, session_lengths(a))  # the same draws
    penalty = np.asarray(rl.overlong_penalty(lengths, R, 3, 0.5))
    assert (penalty < 0).any() and (penalty == 0).any(), lengths  # both sides of the ramp
    np.testing.assert_allclose(b["rewards"], a["rewards"] + penalty, rtol=0, atol=1e-7)
    want = group_advantages(b["rewards"], [i // G for i in range(ROWS * G)], "group")
    index = np.asarray(b["session_index"])
    np.testing.assert_allclose(b["advantages"][index >= 0], want[index[index >= 0]], atol=1e-6)
    assert shaped.last_metrics["reward/overlong_share"] == pytest.approx(np.mean(penalty < 0))
    assert shaped.last_metrics["reward/score"] == pytest.approx(float(np.mean(a["rewards"])))
    assert plain.last_metrics == {}


@pytest.mark.parametrize("estimator", ["kl", "low_var_kl"])
def test_kl_in_reward_charges_each_session_its_summed_kl(model, start, moved, estimator):
    plain = rollout_with(model, start)
    kl = KLInReward(0.2, estimator, target=0.05, horizon=24)
    shaped = rollout_with(model, start, kl_in_reward=kl)
    a = plain(moved, prompts(), jax.random.key(2))
    b = shaped(moved, prompts(), jax.random.key(2))
    # what dew.rl says the charge is, from the two policies' log-probs on the packed rows
    objective = shaped.objective
    fields = {k: v for k, v in b.items() if k != "rewards"}
    log_probs = objective.packed_log_probs(moved, fields)
    ref_log_probs = objective.packed_log_probs(start, fields)
    per_token = np.asarray(rl.kl_penalty(log_probs, ref_log_probs, estimator))
    index, mask = np.asarray(b["session_index"]), np.asarray(b["response_mask"]) > 0
    keep = mask & (index >= 0)
    totals = np.bincount(index[keep], weights=per_token[keep], minlength=ROWS * G)
    assert np.all(np.abs(totals) > 0)
    np.testing.assert_allclose(b["rewards"], a["rewards"] - 0.2 * totals, rtol=1e-5, atol=1e-5)
    counts = np.bincount(index[keep], minlength=ROWS * G)
    current_kl = float(np.mean(totals / counts))
    metrics = shaped.last_metrics
    assert metrics["reward/kl_penalty"] == pytest.approx(current_kl, rel=1e-5)
    assert metrics["reward/kl_coefficient"] == 0.2
    # the controller stepped once, by dew.rl's update with the batch's sample count
    want = rl.adaptive_kl_coefficient(0.2, metrics["reward/kl_penalty"], ROWS * G, 0.05, 24)
    assert kl.coefficient == want != 0.2
    want_adv = group_advantages(b["rewards"], [i // G for i in range(ROWS * G)], "group")
    np.testing.assert_allclose(b["advantages"][keep], want_adv[index[keep]], atol=1e-5)


def test_no_charge_while_the_policy_is_the_reference(model, start):
    kl = KLInReward(0.5)  # fixed
    shaped = rollout_with(model, start, kl_in_reward=kl)
    plain = rollout_with(model, start)
    np.testing.assert_array_equal(
        shaped(start, prompts(), jax.random.key(4))["rewards"],
        plain(start, prompts(), jax.random.key(4))["rewards"],
    )
    assert shaped.last_metrics["reward/kl_penalty"] == 0.0 and kl.coefficient == 0.5


def _fit(model, start, run_dir, steps, target):
    kl = KLInReward(0.1, target=target, horizon=12)
    rollout = rollout_with(model, start, kl_in_reward=kl)
    data = Dataset(train=lambda partition: itertools.repeat(prompts()), val=None,
                   records=ROWS, batch=ROWS)  # fmt: skip
    trainer = Trainer(rollout.objective, optax.adam(3e-2), key=jax.random.key(3),
                      rollout=rollout, progress=False, checkpoint_every=2)  # fmt: skip
    state = trainer.fit(data, steps=steps, log_every=1, run_dir=run_dir)
    return state, kl


def test_the_adaptive_coefficient_resumes_exactly(model, start, tmp_path):
    whole, kl_whole = _fit(model, start, tmp_path / "whole", 4, target=1e-4)
    _fit(model, start, tmp_path / "stopped", 2, target=1e-4)
    saved = json.loads(next((tmp_path / "stopped" / "checkpoints").glob("*/meta.json")).read_text())
    assert saved["extra"]["rollout"]["kl_in_reward"]["coefficient"] != 0.1  # it moved
    resumed, kl_resumed = _fit(model, start, tmp_path / "stopped", 4, target=1e-4)
    assert kl_resumed.coefficient == kl_whole.coefficient  # bit for bit, through JSON
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logged = [
        json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    ]
    # each step charged what the controller made of the previous step's logged KL
    coefficient = 0.1
    for record in logged:
        assert record["reward/kl_coefficient"] == coefficient
        coefficient = rl.adaptive_kl_coefficient(
            coefficient, record["reward/kl_penalty"], ROWS * G, 1e-4, 12
        )
    assert coefficient == kl_whole.coefficient
    assert len({r["reward/kl_coefficient"] for r in logged}) == 4


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kl_target": 0.1}, "objective.kl_target: needs kl_in_reward > 0, got 0.1"),
        ({"kl_in_reward": 0.1, "kl_target": 0.1}, "objective.kl_horizon: the adaptive controller"),
        ({"kl_in_reward": -1.0}, "objective.kl_in_reward: expected a finite number > 0"),
        ({"kl_in_reward": 0.1, "kl_in_reward_estimator": "k9"}, "objective.kl_in_reward_estimator"),
        ({"overlong_buffer": 99}, "objective.overlong_buffer: expected at most max_new_tokens (6)"),
        ({"overlong_penalty": 2.0}, "objective.overlong_penalty: needs overlong_buffer"),
    ],
)
def test_bad_shaping_keys_name_the_key(model, options, message):
    with pytest.raises(ConfigError) as err:
        build_stage("grpo", model, P + R, {"max_new_tokens": R, **options}, reward=sevens)
    assert message in str(err.value), str(err.value)


def test_kl_in_reward_needs_a_starting_policy(model):
    with pytest.raises(ConfigError, match="objective.kl_in_reward: needs a starting policy"):
        build_stage("grpo", model, P + R, {"max_new_tokens": R, "kl_in_reward": 0.1}, reward=sevens)
    with pytest.raises(ConfigError, match="objective.kl_in_reward: needs a starting policy"):
        build_stage("ppo", model, P + R, {"max_new_tokens": R, "kl_in_reward": 0.1}, reward=sevens)


def test_build_stage_wires_the_shaping_into_grpo_and_ppo(model, start):
    options = {"max_new_tokens": R, "kl_in_reward": 0.1, "kl_target": 0.2, "kl_horizon": 50,
               "overlong_buffer": 2, "overlong_penalty": 0.5}  # fmt: skip
    _, grpo = build_stage("grpo", model, P + R, options, reward=sevens, pretrained=start)
    assert grpo.kl_in_reward.adaptive and grpo.overlong.buffer == 2
    _, ppo = build_stage("ppo", model, P + R, options, reward=sevens, pretrained=start)
    assert ppo.kl_in_reward.target == 0.2 and ppo.episodes.overlong.penalty_factor == 0.5


def test_ppo_charges_the_kl_on_each_action_before_gae(model, start, moved):
    from dew.rollouts.ppo import episode_targets

    options = {"max_new_tokens": R, "groups": 2, "eos_id": EOS, "kl_in_reward": 0.3}
    objective, rollout = build_stage("ppo", model, P + R, options, reward=sevens, pretrained=start)
    initial = objective.init(jax.random.key(0))
    variables = {"params": {"policy": moved["params"], "critic": initial["params"]["critic"]}}
    out = rollout(variables, prompts(), jax.random.key(6))
    rows = {k: out[k] for k in ("input_ids", "text_segment_ids", "text_positions")}
    log_probs = objective.packed_log_probs(variables, rows)
    ref_log_probs = objective.policy_objective.packed_log_probs(start, rows)
    index, mask = np.asarray(out["session_index"]), np.asarray(out["response_mask"]) > 0
    keep = mask & (index >= 0)
    charges = np.where(keep, 0.3 * np.asarray(rl.k1_kl(log_probs, ref_log_probs)), 0.0)
    want = episode_targets(
        out, out["old_values"], out["rewards"], 1.0, 0.95, token_rewards=-charges
    )
    plain = episode_targets(out, out["old_values"], out["rewards"], 1.0, 0.95)
    np.testing.assert_allclose(out["advantages"], want["advantages"], atol=1e-5)
    np.testing.assert_allclose(out["returns"], want["returns"], atol=1e-5)
    assert np.max(np.abs(out["returns"] - plain["returns"])) > 1e-3
    assert rollout.last_metrics["reward/kl_coefficient"] == 0.3
    assert rollout.state_dict() == {"kl_in_reward": {"coefficient": 0.3}}  # fixed


def test_asynchronous_rollouts_refuse_what_they_would_not_apply():
    from dew.recipes.ppo_stage import PPOObjectiveConfig
    from dew.recipes.train_config import GRPOObjectiveConfig, _rollout

    grpo = GRPOObjectiveConfig(kl_in_reward=0.1, behavior_importance=2.0)
    with pytest.raises(ConfigError, match="objective.kl_in_reward: rollout.mode async does not"):
        _rollout({"rollout": {"mode": "async"}}, "grpo", grpo)
    ppo = PPOObjectiveConfig(kl_in_reward=0.1, overlong_buffer=2, behavior_importance=2.0)
    with pytest.raises(ConfigError, match="objective.overlong_buffer: rollout.mode async"):
        _rollout({"rollout": {"mode": "async"}}, "ppo", ppo)
    ppo = PPOObjectiveConfig(kl_in_reward=0.1, behavior_importance=2.0)  # PPO charges it itself
    assert _rollout({"rollout": {"mode": "async"}}, "ppo", ppo).is_async
    assert _rollout({"rollout": {"mode": "sync"}}, "grpo", grpo) is not None
    # the scheduler measures the adaptive correction itself
    adaptive = GRPOObjectiveConfig(behavior_importance=2.0, behavior_importance_quantile=0.99)
    assert _rollout({"rollout": {"mode": "async"}}, "grpo", adaptive).is_async
    # and filters uniform groups in its admission, which then owns admit
    dynamic = GRPOObjectiveConfig(behavior_importance=2.0, dynamic_sampling_groups=2)
    assert _rollout({"rollout": {"mode": "async"}}, "grpo", dynamic).is_async
    with pytest.raises(ConfigError, match="rollout.admit: dynamic sampling admits its own 2"):
        _rollout({"rollout": {"mode": "async", "admit": 1}}, "grpo", dynamic)


@pytest.mark.parametrize(
    ("kind", "options", "key"),
    [
        ("grpo", {"kl_in_reward": 0.1}, "kl_in_reward"),
        ("ppo", {"overlong_buffer": 2}, "overlong_buffer"),
    ],
)
def test_tool_episodes_refuse_what_they_would_not_apply(model, kind, options, key):
    from dew.recipes.environment_run import episode_parts

    with pytest.raises(ConfigError, match=f"{key} \\(source\\): tool episodes take only the KL"):
        episode_parts(None, model, {"eos_id": EOS, **options}, pretrained=None, batch=2, seed=0,
                      kind=kind)  # fmt: skip


def _scripted(rounds):
    """A ``draw`` that returns scripted scores per round (completions: (round, index))."""
    calls = []

    def draw(key):
        scores = np.asarray(rounds[len(calls)], np.float32)
        calls.append(key)
        return [(len(calls) - 1, i) for i in range(scores.size)], scores

    return draw, calls


def test_dynamic_sampling_keeps_the_first_informative_groups():
    from dew.rollouts.dynamic_sampling import DynamicSampling

    # 3 prompts x 2 completions; round 0 has one informative group (prompt 1), round 1 another
    draw, calls = _scripted([[1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 1]])
    completions, scores, rows, metrics = DynamicSampling(2, max_draws=3).collect(
        draw, jax.random.key(0), prompts=3, size=2
    )
    assert len(calls) == 2 and rows.tolist() == [1, 0]
    assert completions == [(0, 2), (0, 3), (1, 0), (1, 1)]
    np.testing.assert_array_equal(scores, [0, 1, 1, 0])
    assert metrics == {"sampling/draws": 2.0, "sampling/informative_share": 0.5,
                       "sampling/filled_groups": 0.0}  # fmt: skip
    assert not np.array_equal(jax.random.key_data(calls[0]), jax.random.key_data(calls[1]))


def test_dynamic_sampling_fills_with_uniform_groups_at_the_cap():
    from dew.rollouts.dynamic_sampling import DynamicSampling

    draw, calls = _scripted([[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 0, 0]])
    _, scores, rows, metrics = DynamicSampling(2, max_draws=2).collect(
        draw, jax.random.key(0), prompts=2, size=2
    )
    assert len(calls) == 2 and rows.tolist() == [0, 1] and scores.tolist() == [1, 1, 0, 0]
    assert metrics["sampling/filled_groups"] == 2.0 and metrics["sampling/draws"] == 2.0
    with pytest.raises(ValueError, match="dynamic_sampling_groups: expected at most the 2"):
        DynamicSampling(3).collect(draw, jax.random.key(0), prompts=2, size=2)


def test_sampled_rollout_trains_on_informative_groups_only(model, start):
    from dew.rollouts.dynamic_sampling import DynamicSampling

    def first_token_odd(data_source, completion, ground_truth, extra_info):
        return float(int((completion.split() or ["0"])[0]) % 2)

    objective = GRPOObjective(model, seq_len=P + R - 1)
    rollout = SampledRollout(objective, first_token_odd, groups=G, max_new_tokens=R,
                             sampling=Sampling(temperature=1.0, eos_id=EOS),
                             dynamic_sampling=DynamicSampling(2, max_draws=4))  # fmt: skip
    out = rollout(start, prompts(), jax.random.key(7))
    assert out["input_ids"].shape == (2 * G, P + R) and out["rewards"].shape == (2 * G,)
    assert rollout.last_metrics["sampling/filled_groups"] == 0.0
    groups = np.asarray(out["rewards"]).reshape(2, G)
    assert np.all(np.ptp(groups, axis=1) > 0)
    index = np.asarray(out["session_index"])
    assert np.abs(np.asarray(out["advantages"])[index >= 0]).min() > 0
    # a reward with no signal at all: every draw is spent, the batch keeps its shape
    constant = SampledRollout(objective, lambda *args: 1.0, groups=G, max_new_tokens=R,
                              sampling=Sampling(temperature=1.0, eos_id=EOS),
                              dynamic_sampling=DynamicSampling(2, max_draws=2))  # fmt: skip
    out = constant(start, prompts(), jax.random.key(7))
    assert out["input_ids"].shape == (2 * G, P + R)
    assert constant.last_metrics == {"sampling/draws": 2.0, "sampling/informative_share": 0.0,
                                     "sampling/filled_groups": 2.0}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        (
            "grpo",
            {"dynamic_sampling_draws": 5},
            "objective.dynamic_sampling_draws: needs dynamic_sampling_groups",
        ),
        (
            "grpo",
            {"dynamic_sampling_groups": 0},
            "objective.dynamic_sampling_groups: expected a positive integer",
        ),
        (
            "ppo",
            {"dynamic_sampling_groups": 2},
            "objective.dynamic_sampling_groups: PPO's baseline is its critic",
        ),
    ],
)
def test_bad_dynamic_sampling_keys_name_the_key(model, kind, options, message):
    with pytest.raises(ConfigError) as err:
        build_stage(kind, model, P + R, {"max_new_tokens": R, **options}, reward=sevens)
    assert message in str(err.value), str(err.value)


def test_a_config_keeps_no_more_groups_than_it_draws(tmp_path):
    from dew.recipes.train_config import train_config

    (tmp_path / "p.jsonl").write_text('{"prompt": "1 2", "ground_truth": "3"}\n')
    mapping = {"run": {"steps": 1, "batch": 2, "run_dir": str(tmp_path / "run")}, "model": {"name": "qwen3"},
               "data": {"path": str(tmp_path / "p.jsonl")},
               "objective": {"dynamic_sampling_groups": 3}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"objective.dynamic_sampling_groups: expected at most "
                       r"run.batch \(2, the prompts drawn per round\), got 3"):  # fmt: skip
        train_config(mapping, "grpo")
    mapping["objective"]["dynamic_sampling_groups"] = 2
    assert train_config(mapping, "grpo").objective.dynamic_sampling_groups == 2


def _ratios_batch(ratios, keep):
    ratios, keep = np.asarray(ratios, np.float64), np.asarray(keep, bool)
    return ({"response_mask": keep.astype(np.int32), "session_index": np.where(keep, 0, -1)},
            np.log(ratios), np.zeros(ratios.shape))  # fmt: skip


def test_adaptive_correction_is_a_running_quantile_floored_at_one():
    from dew.rollouts.correction_caps import AdaptiveCorrection

    ratios = np.array([[0.5, 1.0, 2.0, 4.0, 100.0], [0.25, 1.0, 1.0, 3.0, 1.0]])
    keep = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])  # the 100 is padding
    batch, old, behavior = _ratios_batch(ratios, keep)
    measured = float(np.quantile(ratios[keep > 0], 0.9))
    floor = float(np.quantile(ratios[keep > 0], 0.1))
    band = AdaptiveCorrection(0.9, band=True, decay=0.5)
    columns, metrics = band.observe(batch, old, behavior)
    assert band.cap == pytest.approx(measured) and band.floor == pytest.approx(floor)
    np.testing.assert_allclose(columns["behavior_cap"], [measured] * 2, rtol=1e-6)
    np.testing.assert_allclose(columns["behavior_floor"], [floor] * 2, rtol=1e-6)
    assert metrics["correction/measured_cap"] == pytest.approx(measured)
    # the second batch moves the estimate half way (decay 0.5); an on-policy batch measures 1
    batch2, old2, behavior2 = _ratios_batch(np.ones((2, 5)), np.ones((2, 5)))
    band.observe(batch2, old2, behavior2)
    assert band.cap == pytest.approx(0.5 * measured + 0.5) and band.floor == pytest.approx(
        0.5 * floor + 0.5
    )
    # a batch without trained tokens keeps the estimate; the state round-trips
    empty, old3, behavior3 = _ratios_batch(np.ones((2, 5)), np.zeros((2, 5)))
    state = band.state_dict()
    columns, _ = band.observe(empty, old3, behavior3)
    assert band.state_dict() == state and columns["behavior_cap"][0] == np.float32(band.cap)
    other = AdaptiveCorrection(0.9, band=True, decay=0.5)
    other.load_state_dict(json.loads(json.dumps(state)))
    assert other.state_dict() == state
    tight = AdaptiveCorrection(0.75)
    tight.observe(*_ratios_batch(np.full((1, 4), 0.5), np.ones((1, 4))))
    assert tight.cap == 1.0 and tight.floor is None  # never below 1: on-policy tokens keep weight 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"quantile": 0.5}, "behavior_importance_quantile"), ({"quantile": 1.0}, "quantile"),
     ({"quantile": 0.9, "decay": 1.0}, "behavior_importance_decay")],
)  # fmt: skip
def test_adaptive_correction_refuses_bad_settings(kwargs, field):
    from dew.rollouts.correction_caps import AdaptiveCorrection

    with pytest.raises(ValueError, match=field):
        AdaptiveCorrection(**kwargs)


def test_the_loss_uses_the_batch_s_measured_cap(model, start):
    from dew.rollouts.correction_caps import AdaptiveCorrection

    sampling = Sampling(temperature=2.0, eos_id=EOS)  # behavior at T=2, old rescored at T=1
    adaptive = GRPOObjective(model, seq_len=P + R - 1, behavior_importance=1000.0)
    rollout = SampledRollout(adaptive, sevens, groups=G, max_new_tokens=R, sampling=sampling,
                             correction=AdaptiveCorrection(0.6), rescore=True)  # fmt: skip
    out = rollout(start, prompts(), jax.random.key(8))
    cap = float(out["behavior_cap"][0])
    assert 1.0 < cap < 1000.0 and rollout.last_metrics["correction/cap"] == pytest.approx(cap)
    assert rollout.state_dict() == {"correction": {"cap": rollout.correction.cap, "floor": None}}
    fixed = GRPOObjective(model, seq_len=P + R - 1, behavior_importance=cap)
    batch = {k: v for k, v in out.items() if k != "behavior_cap"}
    key = jax.random.key(0)
    got = adaptive.loss(start, out, key)
    want = fixed.loss(start, batch, key)
    loose = adaptive.loss(start, batch, key)  # without the column: the constant 1000
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
    assert float(got[2]["mismatch/ess"]) == pytest.approx(float(want[2]["mismatch/ess"]), rel=1e-6)
    assert abs(float(loose[0]) - float(got[0])) > 1e-6
    # an IcePop band reads both ends from the batch
    wide = GRPOObjective(model, seq_len=P + R - 1, behavior_importance=(1e-3, 1e3))
    banded = {**out, "behavior_floor": np.full(len(out["rewards"]), 0.8, np.float32)}
    narrow = GRPOObjective(model, seq_len=P + R - 1, behavior_importance=(0.8, cap))
    got, want = wide.loss(start, banded, key), narrow.loss(start, batch, key)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
    assert float(got[2]["mask/behavior_band"]) == float(want[2]["mask/behavior_band"]) > 0


def test_correction_keys_build_and_refuse(model, start):
    options = {"max_new_tokens": R, "behavior_importance": [0.5, 2.0],
               "behavior_importance_quantile": 0.95, "behavior_importance_decay": 0.8}  # fmt: skip
    _, rollout = build_stage("grpo", model, P + R, options, reward=sevens)
    assert rollout.correction.band and rollout.correction.decay == 0.8
    _, ppo = build_stage(
        "ppo", model, P + R, {**options, "behavior_importance": 2.0}, reward=sevens
    )
    assert not ppo.episodes.correction.band and ppo.state_dict() == {
        "correction": {"cap": None, "floor": None}
    }
    for bad, message in (
        (
            {"behavior_importance_quantile": 0.9},
            "objective.behavior_importance_quantile: needs behavior_importance",
        ),
        (
            {"behavior_importance_decay": 0.5},
            "objective.behavior_importance_decay: needs behavior_importance_quantile",
        ),
    ):
        with pytest.raises(ConfigError) as err:
            build_stage("grpo", model, P + R, {"max_new_tokens": R, **bad}, reward=sevens)
        assert message in str(err.value), str(err.value)
