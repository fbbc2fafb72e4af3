"""Record verl 0.9.1's PPO pieces (GAE, clipped policy and value losses, a composite loss with
the parameter gradients of a tiny model) on fixed multi-turn episodes, as Dew parity fixtures.

Run it in the shared reference environment (it re-executes itself there when torch or verl
is missing from the interpreter it was started with)::

    python tools/parity_ppo.py [--out tests/fixtures/ppo] [--wheel-sha256 HEX]

The inputs are a fixed, seeded set of tool episodes. Each episode is a list of calls, each call
the context the policy read and the ids it sampled. A call either continues the previous call's
chain (its context starts with that chain plus the sampled ids, then adds an observation) or
opens a new chain (a fresh context). One episode is truncated. verl sees each episode as one
row in draw order: every id a call adds (observation or fresh context, mask 0, then the sampled
ids, mask 1), right-padded; the truncated episode's row has an all-zero mask, which is how verl
leaves an episode out of GAE, whitening and the losses.

What is recorded (float32, torch autograd):

* ``gae``: ``compute_gae_advantage_return`` over the episode rows, the verifier reward on each
  episode's last sampled id, for two ``(gamma, lam)`` settings;
* ``policy``: ``compute_policy_loss_vanilla`` (dual clip, token-mean) and its gradient with
  respect to ``log_prob``;
* ``value``: ``compute_value_loss`` (token-mean) and its gradient with respect to ``vpreds``;
* ``composite_<case>``: a tiny policy and critic scored on the same episodes and the loss Dew's
  PPOObjective minimises, ``pg_loss + value_coefficient * vf_loss + beta * kl_loss``, each
  term verl's own (``compute_policy_loss_vanilla``, ``compute_value_loss``, ``agg_loss`` of
  ``kl_penalty(..., "low_var_kl")``), token-mean over the same response mask, with the
  advantages and returns from ``compute_gae_advantage_return`` on the recorded old values.
  Gradients are with respect to every parameter of the tiny model.

The tiny model: the policy is a bigram table (the logits for the next id are
``policy_table[previous id]``); the critic is a trainable feature per id followed by a scalar
Dense head (``value = critic_features[previous id] @ critic_kernel + critic_bias``). The value
of a sampled id is the critic's output at the position before it, as verl's critic reads it.

Files written to ``tests/fixtures/ppo/``: ``episodes.npz`` (the calls and every per-token
input), ``reference.npz`` (verl's outputs and gradients) and ``ppo.json`` (package, version,
wheel sha256, source sha256, torch version, the aggregation mode and each case's options).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "ppo"
VERL_VERSION = "0.9.1"
TORCH_VERSION = "2.13.0"
SEED = 20261130


def _ensure_reference_env() -> None:
    """Re-execute this script under the reference venv unless torch and verl import here."""
    try:
        import torch  # noqa: F401
        import verl  # noqa: F401
    except ImportError:
        if os.environ.get("DEW_PARITY_REEXEC"):
            raise
        done = subprocess.run(
            ["bash", str(ROOT / "tools" / "reference_env.sh")],
            check=True,
            capture_output=True,
            text=True,
        )
        python = done.stdout.strip().splitlines()[-1]
        os.environ["DEW_PARITY_REEXEC"] = "1"
        os.execv(python, [python, __file__, *sys.argv[1:]])


_ensure_reference_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
import verl.trainer.ppo.core_algos as core_algos  # noqa: E402
import verl.trainer.ppo.rollout_corr_helper as rollout_corr  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
from reference_wheel import atomic_write, source_sha256, wheel_sha256  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

VOCAB = 11  # ids 1..10 are drawn; 0 never appears
FEATURES = 4
N_EPISODES = 9
TRUNCATED = 4  # the index of the truncated episode
MAX_CALL_CONTEXT = 32
MAX_SAMPLED = 3

GAE_SETTINGS = {"default": (1.0, 0.95), "guide": (0.97, 0.9)}
COMPOSITE = {
    "ppo": {
        "gamma": 0.97,
        "lam": 0.9,
        "epsilon_low": 0.2,
        "epsilon_high": 0.28,
        "dual_clip": 3.0,
        "value_coefficient": 0.5,
        "value_clip": 0.2,
        "beta": 0.03,
        "behavior_importance": None,
    },
    "ppo_tis": {
        "gamma": 1.0,
        "lam": 0.95,
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
        "dual_clip": 3.0,
        "value_coefficient": 0.25,
        "value_clip": 0.1,
        "beta": 0.05,
        "behavior_importance": 2.0,
    },
}
TENSOR_OPTIONS = {
    "epsilon_low": 0.2,
    "epsilon_high": 0.28,
    "dual_clip": 3.0,
    "value_clip": 0.2,
}


# ---------------------------------------------------------------- episodes


def build_episodes(rng: np.random.Generator) -> list[list[tuple[list[int], list[int]]]]:
    """Episodes of 1-3 calls; each call is ``(context ids, sampled ids)``."""
    episodes = []
    for e in range(N_EPISODES):
        n_calls = [3, 2, 1, 3, 2, 3, 2, 1, 3][e]
        calls: list[tuple[list[int], list[int]]] = []
        chain: list[int] = []
        for k in range(n_calls):
            fresh = k == 0 or (e in (3, 6) and k == 1) or (e == 8 and k == 2)
            if fresh:
                while True:
                    context = [int(i) for i in rng.integers(1, VOCAB, int(rng.integers(2, 5)))]
                    if not chain or context[: len(chain)] != chain:
                        break
            else:
                observation = [int(i) for i in rng.integers(1, VOCAB, int(rng.integers(1, 4)))]
                context = chain + observation
            sampled = [int(i) for i in rng.integers(1, VOCAB, int(rng.integers(1, 4)))]
            calls.append((context, sampled))
            chain = context + sampled
        episodes.append(calls)
    return episodes


def episode_rows(episodes: list[list[tuple[list[int], list[int]]]]) -> dict[str, np.ndarray]:
    """verl's layout: one row per episode, each call's new ids in draw order.

    ``prev`` holds, at every sampled id, the id before it in its own chain (what the bigram
    policy and the token-feature critic read).
    """
    streams, masks, prevs = [], [], []
    for calls in episodes:
        ids: list[int] = []
        mask: list[int] = []
        prev: list[int] = []
        chain: list[int] = []
        for context, sampled in calls:
            merges = bool(chain) and context[: len(chain)] == chain
            added = context[len(chain) :] if merges else context
            ids += added
            mask += [0] * len(added)
            prev += [0] * len(added)
            full = context + sampled
            for i, token in enumerate(sampled):
                ids.append(token)
                mask.append(1)
                prev.append(full[len(context) + i - 1])
            chain = full
        streams.append(ids)
        masks.append(mask)
        prevs.append(prev)
    width = max(len(s) for s in streams)
    out = {name: np.zeros((len(streams), width), np.int32) for name in ("ids", "prev", "mask")}
    for e, (ids, mask, prev) in enumerate(zip(streams, masks, prevs)):
        out["ids"][e, : len(ids)] = ids
        out["mask"][e, : len(mask)] = mask
        out["prev"][e, : len(prev)] = prev
    return out


def flatten_calls(episodes: list[list[tuple[list[int], list[int]]]]) -> dict[str, np.ndarray]:
    """Every call as padded arrays (for Dew to rebuild the sessions)."""
    calls = [(e, k, c, s) for e, cs in enumerate(episodes) for k, (c, s) in enumerate(cs)]
    out = {
        "call_episode": np.array([c[0] for c in calls], np.int32),
        "call_index": np.array([c[1] for c in calls], np.int32),
        "call_context_length": np.array([len(c[2]) for c in calls], np.int32),
        "call_sampled_length": np.array([len(c[3]) for c in calls], np.int32),
        "call_context": np.zeros((len(calls), MAX_CALL_CONTEXT), np.int32),
        "call_sampled": np.zeros((len(calls), MAX_SAMPLED), np.int32),
    }
    for i, (_, _, context, sampled) in enumerate(calls):
        assert len(context) <= MAX_CALL_CONTEXT and len(sampled) <= MAX_SAMPLED
        out["call_context"][i, : len(context)] = context
        out["call_sampled"][i, : len(sampled)] = sampled
    return out


def build_parameters(rng: np.random.Generator) -> dict[str, np.ndarray]:
    f32 = np.float32
    table = rng.normal(0.0, 0.8, (VOCAB, VOCAB)).astype(f32)
    return {
        "policy_table": table,
        "reference_table": (table + rng.normal(0.0, 0.15, table.shape)).astype(f32),
        "critic_features": rng.normal(0.0, 0.5, (VOCAB, FEATURES)).astype(f32),
        "critic_kernel": rng.normal(0.0, 0.5, (FEATURES, 1)).astype(f32),
        "critic_bias": np.array([0.1], f32),
    }


def policy_log_probs(table: torch.Tensor, rows: dict[str, np.ndarray]) -> torch.Tensor:
    """``[E, L]`` log-prob of each sampled id under a bigram table, 0 off the mask."""
    prev = torch.as_tensor(rows["prev"], dtype=torch.long)
    ids = torch.as_tensor(rows["ids"], dtype=torch.long)
    logits = table[prev]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[..., None])[..., 0]
    return torch.where(torch.as_tensor(rows["mask"] > 0), picked, torch.zeros_like(picked))


def critic_values(
    features: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor, rows: dict[str, np.ndarray]
) -> torch.Tensor:
    """``[E, L]`` value of the state before each sampled id, 0 off the mask."""
    prev = torch.as_tensor(rows["prev"], dtype=torch.long)
    values = (features[prev] @ kernel)[..., 0] + bias[0]
    return torch.where(torch.as_tensor(rows["mask"] > 0), values, torch.zeros_like(values))


def build_inputs(
    rng: np.random.Generator, rows: dict[str, np.ndarray], params: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Recorded rollout data: old, behavior and reference log-probs, old values, rewards."""
    mask = rows["mask"] > 0
    with torch.no_grad():
        current = policy_log_probs(torch.as_tensor(params["policy_table"]), rows).numpy()
        reference = policy_log_probs(torch.as_tensor(params["reference_table"]), rows).numpy()
        values = critic_values(
            *(
                torch.as_tensor(params[k])
                for k in ("critic_features", "critic_kernel", "critic_bias")
            ),
            rows,
        ).numpy()
    shape = mask.shape
    old_values = values + rng.normal(0.0, 0.25, shape)
    rewards = rng.choice([0.0, 1.0, 0.5], N_EPISODES).astype(np.float32)
    rewards[0], rewards[1] = 1.0, 0.0
    status = np.zeros(N_EPISODES, np.int32)  # 0 completed, 1 truncated
    status[TRUNCATED] = 1
    old = current + rng.normal(0.0, 0.2, shape)
    # Tokens whose ratio leaves the clip band far on both sides; the first three tokens with a
    # negative advantage get a ratio above the dual clip (e^1.6 > 3), so that branch binds.
    jumps = rng.random(shape) < 0.3
    old = np.where(jumps, current + rng.choice([-1.6, 1.4], shape), old)
    trained = trained_mask(rows, status)
    advantages, _ = gae(token_rewards(trained, rewards), old_values.astype(np.float32), trained,
                        *GAE_SETTINGS["default"])  # fmt: skip
    negative = np.argwhere((advantages.numpy() < 0) & (trained > 0))[:3]
    old[negative[:, 0], negative[:, 1]] = current[negative[:, 0], negative[:, 1]] - 1.6
    behavior = old + rng.normal(0.0, 0.3, shape)
    f32 = np.float32
    out = {
        "old_log_prob": np.where(mask, np.minimum(old, -1e-3), 0.0).astype(f32),
        "behavior_log_prob": np.where(mask, np.minimum(behavior, -1e-3), 0.0).astype(f32),
        "ref_log_prob": np.where(mask, reference, 0.0).astype(f32),
        "old_values": np.where(mask, old_values, 0.0).astype(f32),
        "rewards": rewards,
        "status": status,
        # tensor-level inputs: a current log-prob and value prediction as plain leaves
        "log_prob": np.where(mask, current, 0.0).astype(f32),
        "vpreds": np.where(mask, values + rng.normal(0.0, 0.2, shape), 0.0).astype(f32),
    }
    return out


def trained_mask(rows: dict[str, np.ndarray], status: np.ndarray) -> np.ndarray:
    """The response mask verl trains on: sampled ids of every episode that is not truncated."""
    return (rows["mask"] * (status == 0)[:, None]).astype(np.float32)


def token_rewards(mask: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """The verifier reward on each episode's last sampled id."""
    out = np.zeros(mask.shape, np.float32)
    for e in range(mask.shape[0]):
        kept = np.flatnonzero(mask[e])
        if kept.size:
            out[e, kept[-1]] = rewards[e]
    return out


# ---------------------------------------------------------------- verl


def actor_config(options: dict[str, Any]) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=options["epsilon_low"],
        clip_ratio_low=options["epsilon_low"],
        clip_ratio_high=options["epsilon_high"],
        clip_ratio_c=options["dual_clip"],
        loss_agg_mode="token-mean",
    )


def gae(
    rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return core_algos.compute_gae_advantage_return(
        torch.as_tensor(rewards), torch.as_tensor(values), torch.as_tensor(mask), gamma, lam
    )


def record_tensors(inputs: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    rewards = token_rewards(mask, inputs["rewards"])
    out["token_rewards"] = rewards
    for name, (gamma, lam) in GAE_SETTINGS.items():
        advantages, returns = gae(rewards, inputs["old_values"], mask, gamma, lam)
        out[f"gae_{name}__advantages"] = advantages.numpy()
        out[f"gae_{name}__returns"] = returns.numpy()

    advantages = torch.as_tensor(out["gae_default__advantages"])
    response_mask = torch.as_tensor(mask).to(torch.bool)
    log_prob = torch.tensor(inputs["log_prob"], requires_grad=True)
    pg_loss, pg_metrics = core_algos.compute_policy_loss_vanilla(
        old_log_prob=torch.as_tensor(inputs["old_log_prob"]),
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode="token-mean",
        config=actor_config(TENSOR_OPTIONS),
    )
    pg_loss.backward()
    out["policy__loss"] = pg_loss.detach().numpy()
    out["policy__grad_log_prob"] = log_prob.grad.numpy().copy()
    for key, value in pg_metrics.items():
        out[f"policy__{key.split('/')[-1]}"] = np.asarray(value, np.float64)

    vpreds = torch.tensor(inputs["vpreds"], requires_grad=True)
    returns = torch.as_tensor(out["gae_default__returns"])
    vf_loss, vf_clipfrac = core_algos.compute_value_loss(
        vpreds,
        returns,
        torch.as_tensor(inputs["old_values"]),
        response_mask,
        TENSOR_OPTIONS["value_clip"],
        "token-mean",
    )
    vf_loss.backward()
    out["value__loss"] = vf_loss.detach().numpy()
    out["value__grad_vpreds"] = vpreds.grad.numpy().copy()
    out["value__clipfrac"] = np.asarray(float(vf_clipfrac), np.float64)
    return out


def record_composite(
    name: str,
    options: dict[str, Any],
    rows: dict[str, np.ndarray],
    inputs: dict[str, np.ndarray],
    params: dict[str, np.ndarray],
    mask: np.ndarray,
) -> dict[str, np.ndarray]:
    leaves = {
        key: torch.tensor(params[key], requires_grad=True)
        for key in ("policy_table", "critic_features", "critic_kernel", "critic_bias")
    }
    response_mask = torch.as_tensor(mask).to(torch.bool)
    advantages, returns = gae(
        token_rewards(mask, inputs["rewards"]),
        inputs["old_values"],
        mask,
        options["gamma"],
        options["lam"],
    )
    log_prob = policy_log_probs(leaves["policy_table"], rows)
    vpreds = critic_values(
        leaves["critic_features"], leaves["critic_kernel"], leaves["critic_bias"], rows
    )
    old = torch.as_tensor(inputs["old_log_prob"])
    weights = None
    if options["behavior_importance"] is not None:
        proto, _, _ = rollout_corr.compute_rollout_correction_and_rejection_mask(
            old_log_prob=old,
            rollout_log_prob=torch.as_tensor(inputs["behavior_log_prob"]),
            response_mask=response_mask,
            rollout_is="token",
            rollout_is_threshold=options["behavior_importance"],
        )
        weights = proto.batch["rollout_is_weights"]
    pg_loss, pg_metrics = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode="token-mean",
        config=actor_config(options),
        rollout_is_weights=weights,
    )
    vf_loss, vf_clipfrac = core_algos.compute_value_loss(
        vpreds,
        returns,
        torch.as_tensor(inputs["old_values"]),
        response_mask,
        options["value_clip"],
        "token-mean",
    )
    kld = core_algos.kl_penalty(
        logprob=log_prob,
        ref_logprob=torch.as_tensor(inputs["ref_log_prob"]),
        kl_penalty="low_var_kl",
    )
    kl_loss = core_algos.agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode="token-mean")
    loss = pg_loss + options["value_coefficient"] * vf_loss + options["beta"] * kl_loss
    loss.backward()
    prefix = f"composite_{name}__"
    out = {
        prefix + "loss": loss.detach().numpy(),
        prefix + "pg_loss": pg_loss.detach().numpy(),
        prefix + "vf_loss": vf_loss.detach().numpy(),
        prefix + "kl_loss": kl_loss.detach().numpy(),
        prefix + "vf_clipfrac": np.asarray(float(vf_clipfrac), np.float64),
        prefix + "advantages": advantages.numpy(),
        prefix + "returns": returns.numpy(),
        prefix + "log_prob": log_prob.detach().numpy(),
        prefix + "vpreds": vpreds.detach().numpy(),
    }
    if weights is not None:
        out[prefix + "is_weights"] = weights.numpy()
    for key, value in pg_metrics.items():
        out[prefix + key.split("/")[-1]] = np.asarray(value, np.float64)
    for key, leaf in leaves.items():
        out[prefix + "grad_" + key] = leaf.grad.numpy().copy()
    return out


# ---------------------------------------------------------------- provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--wheel-sha256", default=None)
    args = parser.parse_args()
    if verl.__version__ != VERL_VERSION or not torch.__version__.startswith(TORCH_VERSION):
        sys.exit(
            f"reference env: expected verl {VERL_VERSION} and torch {TORCH_VERSION}, "
            f"got verl {verl.__version__} and torch {torch.__version__}"
        )
    torch.manual_seed(0)
    rng = np.random.default_rng(SEED)
    episodes = build_episodes(rng)
    rows = episode_rows(episodes)
    params = build_parameters(rng)
    inputs = build_inputs(rng, rows, params)
    mask = trained_mask(rows, inputs["status"])

    reference = record_tensors(inputs, mask)
    for name, options in COMPOSITE.items():
        reference.update(record_composite(name, options, rows, inputs, params, mask))
        print(f"composite {name:8s} loss {float(reference[f'composite_{name}__loss']):+.6f}")
    print(f"policy loss {float(reference['policy__loss']):+.6f}")
    print(f"value loss  {float(reference['value__loss']):+.6f}")

    data = {
        **flatten_calls(episodes),
        **{f"row_{k}": v for k, v in rows.items()},
        "trained_mask": mask,
        **inputs,
        **params,
    }
    atomic_write(args.out / "episodes.npz", lambda p: np.savez(p, **data))
    atomic_write(args.out / "reference.npz", lambda p: np.savez(p, **reference))
    sidecar = {
        "package": "verl",
        "version": VERL_VERSION,
        "wheel": f"verl-{VERL_VERSION}-py3-none-any.whl",
        "wheel_sha256": wheel_sha256("verl", VERL_VERSION, args.wheel_sha256),
        "source_sha256": source_sha256((core_algos, rollout_corr, verl_F), verl),
        "torch": torch.__version__,
        "recorder": "tools/parity_ppo.py",
        "seed": SEED,
        "dtype": "float32",
        "loss_agg_mode": "token-mean",
        "layout": "one episode per row in draw order; observation ids mask 0; the truncated "
        "episode's row has an all-zero mask",
        "functions": {
            "gae": "verl.trainer.ppo.core_algos.compute_gae_advantage_return",
            "policy": "verl.trainer.ppo.core_algos.compute_policy_loss_vanilla",
            "value": "verl.trainer.ppo.core_algos.compute_value_loss",
            "kl": "verl.trainer.ppo.core_algos.kl_penalty(low_var_kl) + agg_loss(token-mean)",
            "behavior_importance": "verl.trainer.ppo.rollout_corr_helper."
            "compute_rollout_correction_and_rejection_mask(rollout_is='token')",
        },
        "gae": {name: {"gamma": g, "lam": lam} for name, (g, lam) in GAE_SETTINGS.items()},
        "tensor_options": TENSOR_OPTIONS,
        "composite": COMPOSITE,
        "composite_loss": "pg_loss + value_coefficient * vf_loss + beta * kl_loss",
        "model": "policy logits = policy_table[previous id]; value = "
        "critic_features[previous id] @ critic_kernel + critic_bias",
    }
    text = json.dumps(sidecar, indent=1, sort_keys=True) + "\n"
    atomic_write(args.out / "ppo.json", lambda p: Path(p).write_text(text))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
