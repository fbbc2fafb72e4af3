"""``dew.recipes.stages``: one factory (and one GRPO loss schema) behind ``dew train`` and
``dew chain``: a loss option is settable from both, and both build the same objective."""

from __future__ import annotations

import json
import re

import pytest

from dew.cli import build_parser, main, train_mapping
from dew.recipes.cli import recipe_from_config
from dew.recipes.schema import ConfigError
from dew.recipes.stages import LOSS_KEYS, GRPOLoss, build_stage
from dew.recipes.train import prepare
from dew.recipes.train_config import train_config

MODEL = {"name": "qwen3", "vocab_size": 64, "emb_features": 16, "num_layers": 1,
         "num_heads": 2, "mlp_features": 32, "max_seq_len": 64}  # fmt: skip
PROMPTS = [{"prompt": [1, 2, 3], "ground_truth": "7"}, {"prompt": [4, 5], "ground_truth": "9"}]
# every GRPO option both front ends spell alike, each away from its default
SHARED = {"beta": 0.05, "groups": 3, "max_new_tokens": 5, "temperature": 0.7, "eos_id": 2,
          "estimator": "rloo", "policy_loss": "gspo", "aggregation": "session-mean",
          "epsilon_low": 0.1, "epsilon_high": 0.3, "dual_clip": None,
          "behavior_importance": [0.5, 2.0], "sequence_mask": [0.25, 4.0],
          "geometric_mask": [0.8, 1.25], "kl_estimator": "abs",
          "entropy_coeff": 0.01}  # fmt: skip


def low(data_source, completion, ground_truth, extra_info):
    return 0.0


@pytest.fixture()
def prompts(tmp_path, monkeypatch):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (tmp_path / "rewards_stages.py").write_text(
        "def low(data_source, completion, ground_truth, extra_info):\n    return 0.0\n"
    )
    monkeypatch.chdir(tmp_path)
    return path


def train_argv(prompts, *sets):
    argv = ["train", "grpo", "--data", str(prompts), "--run-dir", str(prompts.parent / "run"),
            "--steps", "1", "--max-prompt-len", "4", "--reward", "rewards_stages:low"]  # fmt: skip
    for key, value in MODEL.items():
        argv += ["--set", f"model.{key}={value}"]
    for assignment in sets:
        argv += ["--set", assignment]
    return argv


def train_objective(prompts, *sets):
    args = build_parser().parse_args(train_argv(prompts, *sets))
    prepared = prepare(train_config(train_mapping(args), "grpo"))
    return prepared.objective, prepared.rollout


def test_train_grpo_sets_policy_loss(prompts):
    objective, _ = train_objective(prompts, "objective.policy_loss=cispo")
    assert objective.policy_loss == "cispo"
    objective, _ = train_objective(prompts)
    assert objective.policy_loss == "ppo"  # GRPOObjective's default


def test_train_grpo_refuses_an_unknown_policy_loss_in_one_line(prompts, capsys):
    status = main(train_argv(prompts, "objective.policy_loss=reinforce"))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(err) == 1, err
    # the built-in names first, then any a test in this process registered
    pattern = r"objective\.policy_loss: expected one of ppo, gspo, cispo(, \S+)*, got 'reinforce'"
    assert re.search(pattern, err[0]), err[0]


def chain_objective(prompts, options):
    stage = {"name": "g", "steps": 1, "reward": "rewards_stages:low", **options,
             "data": {"type": "Prompts", "path": str(prompts), "max_prompt_len": 4}}  # fmt: skip
    path = prompts.parent / "chain.json"
    config = {"output": str(prompts.parent / "chain"), "batch": 2, "model": MODEL,
              "optimizer": {"name": "adam", "learning_rate": 1e-3}, "stages": [stage]}  # fmt: skip
    path.write_text(json.dumps(config))
    recipe = recipe_from_config(path)
    return recipe.objective(recipe.stages[0], None)


def settings(objective, rollout):
    return (objective.seq_len, objective.loss_options, objective.sampling_temperature,
            rollout.groups, rollout.max_new_tokens, rollout.sampling,
            rollout.estimator)  # fmt: skip


def test_chain_and_train_build_equal_objectives_from_the_same_options(prompts):
    sets = [f"objective.{k}={'null' if v is None else v}" for k, v in SHARED.items()]
    trained = train_objective(prompts, *sets, "objective.top_k=5")
    chained = chain_objective(prompts, {**SHARED, "sample": 5})
    assert settings(*trained) == settings(*chained)
    loss = trained[0].loss_options
    assert (loss.policy_loss, loss.aggregation, loss.dual_clip) == ("gspo", "session-mean", None)
    assert trained[1].sampling.top_k == 5 and trained[1].sampling.eos_id == 2
    # lists in the config are tuples on the objective, from both front ends
    assert loss.behavior_importance == (0.5, 2.0) and loss.sequence_mask == (0.25, 4.0)
    assert loss.geometric_mask == (0.8, 1.25) and trained[1].estimator == "rloo"


def test_every_loss_key_reaches_the_objective():
    # a key added to GRPOLoss is a GRPOObjective keyword, read back from its loss options
    import dew.models

    model = dew.models.build("qwen3", **{k: v for k, v in MODEL.items() if k != "name"})
    options = {"policy_loss": "cispo", "aggregation": "seq-mean-token-sum-norm",
               "loss_scale_factor": 16.0, "epsilon_low": 0.15,
               "epsilon_high": 0.25, "dual_clip": 4.0, "behavior_importance": 2.0,
               "sequence_mask": (0.5, 2.0), "geometric_mask": (0.9, 1.1),
               "kl_estimator": "mse", "entropy_coeff": 0.02}  # fmt: skip
    assert set(options) == set(LOSS_KEYS)
    objective, _ = build_stage("grpo", model, 8, options, reward=low)
    assert {k: getattr(objective.loss_options, k) for k in LOSS_KEYS} == options
    assert GRPOLoss(**options).loss_options() == options


def test_kl_estimator_and_entropy_coeff_are_config_keys_of_grpo_and_ppo(prompts, capsys):
    objective, _ = train_objective(prompts, "objective.kl_estimator=k1")
    assert objective.kl_estimator == "k1"
    assert train_objective(prompts)[0].kl_estimator == "low_var_kl"  # today's k3
    status = main(train_argv(prompts, "objective.kl_estimator=k3+"))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(err) == 1, err
    assert re.search(r"objective\.kl_estimator: expected one of kl, k1, abs, mse, k2, "
                     r"low_var_kl, k3 .*got 'k3\+'", err[0]), err[0]  # fmt: skip
    with pytest.raises(ConfigError, match=r"stages\.0\.kl_estimator: expected one of"):
        chain_objective(prompts, {"kl_estimator": "full"})
    import dew.models

    model = dew.models.build("qwen3", **{k: v for k, v in MODEL.items() if k != "name"})
    ppo, _ = build_stage("ppo", model, 8, {"kl_estimator": "abs", "entropy_coeff": 0.01},
                         reward=low)  # fmt: skip
    assert ppo.kl_estimator == "abs" and ppo.options()["kl_estimator"] == "abs"
    assert ppo.entropy_coeff == 0.01 and ppo.options()["entropy_coeff"] == 0.01
    assert train_objective(prompts, "objective.entropy_coeff=0.001")[0].entropy_coeff == 0.001
    normed, _ = train_objective(prompts, "objective.aggregation=seq-mean-token-sum-norm",
                                "objective.loss_scale_factor=16")  # fmt: skip
    assert (normed.aggregation, normed.loss_scale_factor) == ("seq-mean-token-sum-norm", 16.0)
    status = main(train_argv(prompts, "objective.aggregation=seq-mean-token-sum-norm"))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert status == 2 and len(err) == 1, err
    assert "objective.loss_scale_factor: aggregation 'seq-mean-token-sum-norm' needs" in err[0]
    with pytest.raises(ConfigError, match=r"objective\.entropy_coeff: expected a finite number"):
        build_stage("ppo", model, 8, {"entropy_coeff": float("inf")}, reward=low)
    with pytest.raises(ConfigError, match=r"objective\.kl_estimator: expected one of"):
        build_stage("ppo", None, 8, {"kl_estimator": "l2"}, reward=low)


def test_unknown_option_keys_are_refused_by_name(prompts, capsys):
    status = main(train_argv(prompts, "objective.policy_los=gspo"))
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert "objective.policy_los: unknown key; did you mean 'policy_loss'?" in err
    with pytest.raises(ConfigError, match=r"stages\.0\.policy_los: unknown key; did you mean "):
        chain_objective(prompts, {"policy_los": "gspo"})
    with pytest.raises(ConfigError, match=r"stages\.0\.policy_loss: expected one of ppo, gspo"):
        chain_objective(prompts, {"policy_loss": "reinforce"})
    with pytest.raises(ConfigError, match=r"objective\.policy_los: unknown key"):
        build_stage("grpo", None, 8, {"policy_los": "gspo"}, reward=low)
    with pytest.raises(ConfigError, match=r"objective\.nll_weight: unknown key"):
        build_stage("grpo", None, 8, {"nll_weight": 1.0}, reward=low)


def test_a_loss_option_on_a_non_grpo_stage_is_refused():
    from dew.data.preference import PreferencePairs
    from dew.recipes.chain import Stage

    pair = {"chosen": [5, 6, 7], "rejected": [5, 6, 9], "chosen_mask": [0, 1, 1],
            "rejected_mask": [0, 1, 1]}  # fmt: skip
    pairs = PreferencePairs(records=(json.dumps(pair),), seq_len=8)
    with pytest.raises(ValueError, match=r"Stage.policy_loss \(d\): only a Prompts \(GRPO\)"):
        Stage("d", pairs, steps=1, policy_loss="gspo")


def test_behavior_importance_is_a_cap_or_a_band_from_either_front_end(prompts):
    capped, _ = train_objective(prompts, "objective.behavior_importance=2")
    assert capped.loss_options.behavior_importance == 2.0  # TIS: a cap
    band, _ = chain_objective(prompts, {"behavior_importance": [0.5, 3]})
    assert band.loss_options.behavior_importance == (0.5, 3.0)  # IcePop: a band
    plain, rollout = train_objective(prompts)
    options = plain.loss_options
    assert (options.behavior_importance, options.sequence_mask, options.geometric_mask) == (
        None,
        None,
        None,
    )
    assert rollout.estimator == "group"  # the defaults stay SampledRollout's and GRPOObjective's


def test_build_stage_turns_lists_into_tuples():
    import dew.models

    model = dew.models.build("qwen3", **{k: v for k, v in MODEL.items() if k != "name"})
    options = {"sequence_mask": [0.5, 2], "behavior_importance": [0.25, 4], "estimator": "mean"}
    objective, rollout = build_stage("grpo", model, 8, options, reward=low)
    assert objective.loss_options.sequence_mask == (0.5, 2.0)
    assert objective.loss_options.behavior_importance == (0.25, 4.0)
    assert rollout.estimator == "mean"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sequence_mask", [0.5], r"sequence_mask: expected \[float, float\] or null, got \[0.5\]"),
        ("geometric_mask", "0.5", r"geometric_mask: expected \[float, float\] or null, got '0.5'"),
        ("sequence_mask", [0.5, "x"], r"sequence_mask: expected \[float, float\] or null, got"),
        ("geometric_mask", [2.0, 0.5], r"geometric_mask: expected 0 < low <= high < inf"),
        ("behavior_importance", [1, 2, 3], r"behavior_importance: expected float or \[float"),
        ("behavior_importance", -1.0, r"behavior_importance: expected a positive finite cap"),
        (
            "estimator",
            "median",
            r"estimator: expected one of group, mean, rloo(, \S+)*, got 'median'",
        ),
    ],
)
def test_a_malformed_tuple_option_or_estimator_is_refused_naming_its_key(
    prompts, capsys, key, value, message
):
    with pytest.raises(ConfigError, match=r"^objective\." + message):
        build_stage("grpo", None, 8, {key: value}, reward=low)
    status = main(train_argv(prompts, f"objective.{key}={json.dumps(value)}"))
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and f"objective.{key}" in err, err
    with pytest.raises((ConfigError, ValueError), match=key):
        chain_objective(prompts, {key: value})


def test_check_value_reads_a_list_as_a_fixed_length_tuple():
    from dew.recipes.schema import check_value

    assert check_value([1, 2.5], tuple[float, float], "k") == (1.0, 2.5)
    assert check_value((3, 4), tuple[float, float], "k") == (3.0, 4.0)
    with pytest.raises(
        ConfigError, match=r"^k: expected a list of 2 \(\[float, float\]\), got \[1\]"
    ):
        check_value([1], tuple[float, float], "k")
    with pytest.raises(ConfigError, match=r"^k\[1\]: expected a number, got 'x'"):
        check_value([1, "x"], tuple[float, float], "k")


def test_train_grpo_makes_a_reward_class_with_reward_args(prompts):
    """dew train and dew chain load rewards alike: a short name, or a class made with
    objective.reward_args as keyword arguments."""
    from dew.rewards import MathReward

    (prompts.parent / "rewards_stage_args.py").write_text(
        "class Scaled:\n    def __init__(self, scale):\n        self.scale = scale\n"
        "    def __call__(self, source, completion, truth, extra):\n        return self.scale\n"
    )
    _, rollout = train_objective(prompts, "objective.reward=math")
    assert isinstance(rollout.reward, MathReward)
    _, rollout = train_objective(
        prompts,
        "objective.reward=rewards_stage_args:Scaled",
        'objective.reward_args={"scale": 2.5}',
    )
    assert rollout.reward("s", "c", "t", "") == 2.5
    with pytest.raises(ConfigError, match=r"objective.reward_args: 'rewards_stages:low' is a func"):
        train_objective(prompts, 'objective.reward_args={"scale": 2.5}')


def test_a_registered_policy_loss_is_a_config_value(prompts):
    """A loss registered with dew.rl is named from a config as the built-in ones are."""
    import dew.rl as rl

    name = "stages-test-loss"
    if name not in rl.registered("policy_loss"):
        rl.register_policy_loss(name)(rl.get_policy_loss("cispo"))
    from dew.testing import tiny_decoder

    model = tiny_decoder(vocab_size=16, max_seq_len=16)
    objective, _ = build_stage("grpo", model, 8, {"policy_loss": name}, reward=low)
    assert objective.policy_loss == name
    objective, _ = train_objective(prompts, f"objective.policy_loss={name}")
    assert objective.policy_loss == name
