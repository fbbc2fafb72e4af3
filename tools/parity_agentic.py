"""Record verl 0.9.1's GRPO policy losses on fixed agentic batches as Dew parity fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_agentic.py [--wheel-sha256 HEX]

Dew trains packed rows: several chains share a ``[rows, width]`` row. verl trains one chain
per row. This recorder builds a fixed, seeded set of sessions (multi-call sessions whose calls
extend each other, so each session is one chain), writes them in verl's layout (one chain per
row, right-padded) and runs verl's own functions on them, float32, with torch autograd:

* the policy losses ``compute_policy_loss_vanilla`` / ``_gspo`` / ``_cispo`` through
  ``get_policy_loss_fn`` with a real, frozen ``ActorConfig``;
* rollout corrections the way verl's trainer applies them: decoupled mode runs
  ``compute_rollout_correction_and_rejection_mask(old, rollout)`` and passes the IS weights and
  the rejected response mask to the loss; bypass mode runs ``compute_policy_loss_bypass_mode``
  (old = rollout, corrections from the detached current policy, PPO clip loss);
* the KL term as ``verl.workers.utils.losses.ppo_loss`` adds it:
  ``kl_loss_coef * agg_loss(kl_penalty(log_prob, ref, "low_var_kl"), response_mask)`` with the
  same response mask the policy loss received;
* advantages from ``compute_grpo_outcome_advantage`` / ``compute_rloo_outcome_advantage``
  over ragged groups.

Files written to ``tests/fixtures/agentic/``:

* ``chains.npz``: the sessions and every per-token input, ``[S, L]`` (``ids``, ``lengths``,
  ``response_mask``, ``call_of``, ``log_prob``, ``old_log_prob``, ``rollout_log_prob``,
  ``ref_log_prob``, ``rewards``, ``group``, ``advantages``) and the advantages of every
  estimator (``adv_grpo``, ``adv_grpo_mean``, ``adv_rloo``);
* ``losses.npz``: per case ``<case>__loss`` (scalar), ``<case>__grad`` ``[S, L]`` (d loss /
  d log_prob) and ``<case>__<metric>`` for the verl metrics Dew mirrors;
* ``agentic.json``: package, version, wheel sha256, source sha256, torch version, and per case
  the Dew options, the verl configuration and ``loss_agg_mode``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import verl
import verl.trainer.ppo.core_algos as core_algos
import verl.trainer.ppo.rollout_corr_helper as rollout_corr
import verl.utils.torch_functional as verl_F
from reference_wheel import atomic_write, source_sha256, wheel_sha256
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "agentic"
VERL_VERSION = "0.9.1"
SEED = 20260507
N_SESSIONS = 14
MAX_LEN = 24


# ---------------------------------------------------------------- inputs


def build_chains(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Sessions of 1-3 merging calls; one chain each, right-padded to MAX_LEN."""
    ids = np.zeros((N_SESSIONS, MAX_LEN), np.int32)
    mask = np.zeros((N_SESSIONS, MAX_LEN), np.int32)
    call_of = np.full((N_SESSIONS, MAX_LEN), -1, np.int32)
    lengths = np.zeros(N_SESSIONS, np.int32)
    for s in range(N_SESSIONS):
        n_calls = int(rng.integers(1, 4))
        pos = 0
        prompt = int(rng.integers(2, 5))
        ids[s, :prompt] = rng.integers(1, 50, prompt)
        pos = prompt
        for k in range(n_calls):
            sampled = int(rng.integers(1, 5))
            if pos + sampled > MAX_LEN:
                break
            ids[s, pos : pos + sampled] = rng.integers(1, 50, sampled)
            mask[s, pos : pos + sampled] = 1
            call_of[s, pos : pos + sampled] = k
            pos += sampled
            observation = int(rng.integers(1, 4))
            if k + 1 < n_calls and pos + observation + 1 <= MAX_LEN:
                ids[s, pos : pos + observation] = rng.integers(1, 50, observation)
                pos += observation
            else:
                break
        lengths[s] = pos
    # one single-token session and one long one exercise the edges
    return {"ids": ids, "response_mask": mask, "call_of": call_of, "lengths": lengths}


def build_log_probs(rng: np.random.Generator, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Old, current, rollout (behavior) and reference log-probs; 0 off the response."""
    shape = mask.shape
    old = -np.abs(rng.normal(1.0, 0.7, shape))
    current = old + rng.normal(0.0, 0.25, shape)
    # tokens whose ratio passes the dual clip (ratio > 3) and one beyond the +-20 log clamp
    jumps = rng.random(shape) < 0.1
    old = np.where(jumps, old - 3.0, old)
    current = np.where(jumps, old + rng.uniform(1.2, 2.5, shape), current)
    old[5, np.flatnonzero(mask[5])[0]] = -23.0
    current[5, np.flatnonzero(mask[5])[0]] = -0.5
    behavior = old + rng.normal(0.0, 0.15, shape)
    # a few tokens far off the behavior policy, to trip the bands and sequence masks
    spikes = rng.random(shape) < 0.06
    behavior = np.where(spikes, behavior - rng.uniform(1.0, 2.5, shape), behavior)
    reference = old + rng.normal(0.0, 0.2, shape)
    # one session drifted as a whole, for the sequence masks
    behavior[3] = behavior[3] + 0.6
    out = {}
    for name, value in (
        ("log_prob", current),
        ("old_log_prob", old),
        ("rollout_log_prob", behavior),
        ("ref_log_prob", reference),
    ):
        out[name] = np.where(mask > 0, np.minimum(value, -1e-3), 0.0).astype(np.float32)
    assert out["log_prob"][5].min() > -24
    return out


def build_rewards(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rewards in ragged groups: sizes 4, 3, 1, 2, 4 (one group with equal rewards)."""
    sizes = [4, 3, 1, 2, 4]
    group = np.repeat(np.arange(len(sizes)), sizes).astype(np.int32)
    assert group.size == N_SESSIONS
    rewards = rng.integers(0, 3, N_SESSIONS).astype(np.float32)
    rewards[group == 3] = 1.0  # zero spread
    return {"group": group, "rewards": rewards}


def verl_advantages(rewards: np.ndarray, group: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32)
    lengths = mask.shape[1]
    last = np.array([np.flatnonzero(row)[-1] if row.any() else lengths - 1 for row in mask])
    token_rewards[torch.arange(mask.shape[0]), torch.as_tensor(last)] = torch.as_tensor(rewards)
    response_mask = torch.as_tensor(mask, dtype=torch.float32)
    index = np.asarray([f"g{g}" for g in group], dtype=object)
    out = {}
    for name, fn, kwargs in (
        ("adv_grpo", core_algos.compute_grpo_outcome_advantage, {}),
        (
            "adv_grpo_mean",
            core_algos.compute_grpo_outcome_advantage,
            {"norm_adv_by_std_in_grpo": False},
        ),
        ("adv_rloo", core_algos.compute_rloo_outcome_advantage, {}),
    ):
        advantages, _ = fn(token_rewards.clone(), response_mask, index, **kwargs)
        out[name] = advantages[torch.arange(mask.shape[0]), torch.as_tensor(last)].numpy()
    return out


# ---------------------------------------------------------------- cases


def case(
    name: str,
    *,
    policy_loss: str = "ppo",
    aggregation: str = "token-mean",
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.28,
    dual_clip: float | None = 3.0,
    behavior_importance: float | tuple[float, float] | None = None,
    sequence_mask: tuple[float, float] | None = None,
    geometric_mask: tuple[float, float] | None = None,
    bypass: bool = False,
) -> dict[str, Any]:
    return {
        "name": name,
        "policy_loss": policy_loss,
        "aggregation": aggregation,
        "beta": beta,
        "epsilon_low": epsilon_low,
        "epsilon_high": epsilon_high,
        "dual_clip": dual_clip,
        "behavior_importance": behavior_importance,
        "sequence_mask": sequence_mask,
        "geometric_mask": geometric_mask,
        "bypass": bypass,
    }


CASES = [
    case("ppo_token_mean"),
    case("ppo_token_mean_kl", beta=0.05),
    case("ppo_no_dual_clip", dual_clip=None, epsilon_high=0.2),
    case("ppo_dual_clip_2", dual_clip=2.0, epsilon_low=0.1, epsilon_high=0.1),
    case("ppo_session_mean_kl", aggregation="session-mean", beta=0.05),
    case("gspo_token_mean", policy_loss="gspo", epsilon_low=3e-4, epsilon_high=4e-4),
    case(
        "gspo_session_mean",
        policy_loss="gspo",
        aggregation="session-mean",
        epsilon_low=3e-4,
        epsilon_high=4e-4,
    ),
    case("gspo_wide_clip_kl", policy_loss="gspo", epsilon_low=0.2, epsilon_high=0.2, beta=0.05),
    case("cispo_token_mean", policy_loss="cispo", epsilon_low=1.0, epsilon_high=0.2),
    case("cispo_session_mean", policy_loss="cispo", aggregation="session-mean", epsilon_low=1.0),
    case("tis_cap", behavior_importance=2.0),
    case("tis_cap_1_2_kl", behavior_importance=1.2, beta=0.05),
    case("icepop_band", behavior_importance=(0.5, 2.0)),
    case("sequence_mask", sequence_mask=(0.5, 2.0)),
    case("geometric_mask", geometric_mask=(0.9, 1.1)),
    case(
        "all_corrections_session_mean",
        aggregation="session-mean",
        behavior_importance=2.0,
        sequence_mask=(0.3, 3.0),
        geometric_mask=(0.85, 1.15),
        beta=0.05,
    ),
    case("gspo_tis", policy_loss="gspo", behavior_importance=1.5, epsilon_low=0.2),
    case("cispo_icepop", policy_loss="cispo", behavior_importance=(0.5, 2.0), epsilon_low=1.0),
    case("bypass_plain_kl", bypass=True, beta=0.05),
    case("bypass_band", bypass=True, behavior_importance=(0.5, 2.0)),
    case("bypass_sequence_masks", bypass=True, sequence_mask=(0.5, 2.0), geometric_mask=(0.9, 1.1)),
    case(
        "bypass_all_session_mean",
        bypass=True,
        aggregation="session-mean",
        behavior_importance=(0.6, 1.8),
        sequence_mask=(0.3, 3.0),
    ),
]

AGG = {"token-mean": "token-mean", "session-mean": "seq-mean-token-mean"}
LOSS_MODE = {"ppo": "vanilla", "gspo": "gspo", "cispo": "cispo"}


def _k1_threshold(band: tuple[float, float]) -> str:
    return f"{band[0]!r}_{band[1]!r}"


def verl_options(c: dict[str, Any]) -> dict[str, Any]:
    """The verl configuration a Dew case maps to (also written to the sidecar)."""
    rs: list[str] = []
    rs_thresholds: list[str] = []
    rollout_is = None
    rollout_is_threshold: Any = None
    band = c["behavior_importance"]
    if c["bypass"]:
        if isinstance(band, tuple):
            # the ratio already is current over behavior: the band only masks, verl token_k1
            # with the reciprocal thresholds (k1 = -log ratio)
            rs.append("token_k1")
            rs_thresholds.append(_k1_threshold((1.0 / band[1], 1.0 / band[0])))
        elif band is not None:
            raise ValueError("a TIS cap has no bypass-mode counterpart")
    elif band is not None:
        rollout_is = "token"
        rollout_is_threshold = _k1_threshold(band) if isinstance(band, tuple) else float(band)
    if c["sequence_mask"] is not None:
        rs.append("seq_sum_k1")
        rs_thresholds.append(_k1_threshold(c["sequence_mask"]))
    if c["geometric_mask"] is not None:
        rs.append("seq_mean_k1")
        rs_thresholds.append(_k1_threshold(c["geometric_mask"]))
    return {
        "loss_mode": "bypass_mode" if c["bypass"] else LOSS_MODE[c["policy_loss"]],
        "loss_type": "ppo_clip" if c["bypass"] else None,
        "loss_agg_mode": AGG[c["aggregation"]],
        "clip_ratio_low": c["epsilon_low"],
        "clip_ratio_high": c["epsilon_high"],
        # verl always dual-clips; a huge clip_ratio_c never binds, which is Dew's dual_clip=None
        "clip_ratio_c": 1e30 if c["dual_clip"] is None else c["dual_clip"],
        "rollout_is": rollout_is,
        "rollout_is_threshold": rollout_is_threshold,
        "rollout_rs": ",".join(rs) if rs else None,
        "rollout_rs_threshold": ",".join(rs_thresholds) if rs else None,
        "use_kl_loss": c["beta"] > 0,
        "kl_loss_coef": c["beta"],
        "kl_loss_type": "low_var_kl",
    }


def actor_config(options: dict[str, Any]) -> ActorConfig:
    correction = RolloutCorrectionConfig(
        rollout_is=options["rollout_is"],
        rollout_is_threshold=options["rollout_is_threshold"] or 2.0,
        rollout_rs=options["rollout_rs"],
        rollout_rs_threshold=options["rollout_rs_threshold"],
        bypass_mode=options["loss_mode"] == "bypass_mode",
        loss_type=options["loss_type"] or "ppo_clip",
    )
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=options["clip_ratio_low"],
        clip_ratio_low=options["clip_ratio_low"],
        clip_ratio_high=options["clip_ratio_high"],
        clip_ratio_c=options["clip_ratio_c"],
        loss_agg_mode=options["loss_agg_mode"],
        use_kl_loss=options["use_kl_loss"],
        kl_loss_coef=options["kl_loss_coef"],
        kl_loss_type=options["kl_loss_type"],
        policy_loss=PolicyLossConfig(loss_mode=options["loss_mode"], rollout_correction=correction),
    )


def run_case(c: dict[str, Any], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = verl_options(c)
    config = actor_config(options)
    log_prob = torch.tensor(inputs["log_prob"], requires_grad=True)
    old = torch.tensor(inputs["old_log_prob"])
    rollout = torch.tensor(inputs["rollout_log_prob"])
    ref = torch.tensor(inputs["ref_log_prob"])
    mask = torch.tensor(inputs["response_mask"]).to(torch.bool)
    advantages = torch.tensor(inputs["advantages"])[:, None] * mask.float()
    metrics: dict[str, float] = {}
    if c["bypass"]:
        # verl's trainer sets old_log_probs = rollout_log_probs and dispatches here
        policy_fn = core_algos.get_policy_loss_fn("bypass_mode")
        pg_loss, pg_metrics = policy_fn(
            old_log_prob=rollout,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=options["loss_agg_mode"],
            config=config,
        )
        kl_mask = mask  # ppo_loss aggregates the KL over the batch's own response mask
        # the mask the policy loss saw, for the metrics Dew reports
        _, loss_mask, _ = rollout_corr.compute_rollout_correction_and_rejection_mask(
            old_log_prob=log_prob.detach(),
            rollout_log_prob=rollout,
            response_mask=mask,
            rollout_rs=options["rollout_rs"],
            rollout_rs_threshold=options["rollout_rs_threshold"],
        )
        is_weights = None
    else:
        weights_proto, loss_mask, corr_metrics = (
            rollout_corr.compute_rollout_correction_and_rejection_mask(
                old_log_prob=old,
                rollout_log_prob=rollout,
                response_mask=mask,
                rollout_is=options["rollout_is"],
                rollout_is_threshold=options["rollout_is_threshold"],
                rollout_rs=options["rollout_rs"],
                rollout_rs_threshold=options["rollout_rs_threshold"],
            )
        )
        pg_metrics = {}
        pg_metrics.update(corr_metrics)
        is_weights = weights_proto.batch["rollout_is_weights"] if weights_proto else None
        policy_fn = core_algos.get_policy_loss_fn(options["loss_mode"])
        pg_loss, more = policy_fn(
            old_log_prob=old,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=loss_mask.to(torch.bool),
            loss_agg_mode=options["loss_agg_mode"],
            config=config,
            rollout_is_weights=is_weights,
        )
        pg_metrics.update(more)
        kl_mask = loss_mask.to(torch.bool)
    loss = pg_loss
    if options["use_kl_loss"]:
        kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref, kl_penalty="low_var_kl")
        kl_loss = core_algos.agg_loss(
            loss_mat=kld, loss_mask=kl_mask, loss_agg_mode=options["loss_agg_mode"]
        )
        loss = loss + kl_loss * options["kl_loss_coef"]
        metrics["kl_loss"] = float(kl_loss.detach())
    loss.backward()
    out = {"loss": loss.detach().numpy(), "grad": log_prob.grad.numpy().copy()}
    out["kept_mask"] = loss_mask.to(torch.int32).numpy()
    if is_weights is not None:
        out["is_weights"] = is_weights.numpy()
    metrics["pg_loss"] = float(pg_loss.detach())
    for key, value in pg_metrics.items():
        short = key.replace("rollout_corr/", "").replace("actor/", "")
        metrics[short] = float(value)
    for key in (
        "pg_clipfrac",
        "pg_clipfrac_lower",
        "ppo_kl",
        "kl",
        "kl_loss",
        "k3_kl",
        "rollout_is_eff_sample_size",
        "pg_loss",
        "rollout_rs_token_k1_masked_fraction",
        "rollout_rs_seq_sum_k1_masked_fraction",
        "rollout_rs_seq_mean_k1_masked_fraction",
    ):
        if key in metrics:
            out[key] = np.asarray(metrics[key], np.float64)
    return out


# ---------------------------------------------------------------- provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--wheel-sha256", default=None)
    args = parser.parse_args()
    if verl.__version__ != VERL_VERSION:
        sys.exit(f"expected verl {VERL_VERSION}, found {verl.__version__}")
    torch.manual_seed(0)
    rng = np.random.default_rng(SEED)
    chains = build_chains(rng)
    inputs = {**chains, **build_log_probs(rng, chains["response_mask"]), **build_rewards(rng)}
    advantages = verl_advantages(inputs["rewards"], inputs["group"], inputs["response_mask"])
    inputs.update(advantages)
    inputs["advantages"] = advantages["adv_grpo"].astype(np.float32)

    results: dict[str, np.ndarray] = {}
    sidecar_cases = []
    for c in CASES:
        out = run_case(c, inputs)
        for key, value in out.items():
            results[f"{c['name']}__{key}"] = np.asarray(value)
        options = verl_options(c)
        dew_options = {k: v for k, v in c.items() if k != "name"}
        sidecar_cases.append(
            {
                "name": c["name"],
                "dew_options": dew_options,
                "verl_options": options,
                "loss_agg_mode": options["loss_agg_mode"],
                "function": (
                    "verl.trainer.ppo.core_algos.compute_policy_loss_bypass_mode"
                    if c["bypass"]
                    else f"verl.trainer.ppo.core_algos.compute_policy_loss_{options['loss_mode']}"
                ),
                "loss": float(out["loss"]),
            }
        )
        print(f"{c['name']:32s} loss {float(out['loss']):+.6f}")

    atomic_write(args.out / "chains.npz", lambda p: np.savez(p, **inputs))
    atomic_write(args.out / "losses.npz", lambda p: np.savez(p, **results))
    sidecar = {
        "package": "verl",
        "version": VERL_VERSION,
        "wheel": f"verl-{VERL_VERSION}-py3-none-any.whl",
        "wheel_sha256": wheel_sha256("verl", VERL_VERSION, args.wheel_sha256),
        "source_sha256": source_sha256((core_algos, rollout_corr, verl_F), verl),
        "torch": torch.__version__,
        "recorder": "tools/parity_agentic.py",
        "dtype": "float32",
        "seed": SEED,
        "layout": "one chain per row, right-padded; Dew packs the same sessions",
        "kl": "ppo_loss: kl_loss_coef * agg_loss(kl_penalty(log_prob, ref, 'low_var_kl'), mask)",
        "advantages": {
            "adv_grpo": "compute_grpo_outcome_advantage (epsilon 1e-6)",
            "adv_grpo_mean": "compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False)",
            "adv_rloo": "compute_rloo_outcome_advantage",
        },
        "cases": sidecar_cases,
    }
    text = json.dumps(sidecar, indent=1, sort_keys=True, default=_json_default) + "\n"
    atomic_write(args.out / "agentic.json", lambda p: Path(p).write_text(text))
    print(f"wrote {len(CASES)} cases to {args.out}")


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(type(value))


if __name__ == "__main__":
    main()
