"""One PPO update (policy and critic) in Dew against the same update in torch, interleaved.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_ppo_step.py [--rounds 3] [--steps 4]

The model is the 5.2M-parameter Qwen3 of ``tools/bench/bench_sft.py`` (4 layers, width 256,
4 heads, 2 KV heads, head_dim 64, MLP 1088, vocab 4096, tied, float32), written once by
``transformers`` in the reference interpreter (``tools/reference_env.sh``). One update reads a
prepared batch of [8, 256] tokens (the second half of each row is the response) and runs:
the policy's log-probs, the frozen reference's log-probs (KL, beta 0.03), the critic's values
(a second Qwen3 of the same shape with a scalar head), the dual-clip policy loss, the clipped
value loss and the k3 KL, one backward pass and one AdamW step over policy and critic.

Contenders:

- ``dew``: ``PPOObjective(policy, critic=ValueHead(backbone))`` through ``Trainer``'s
  compiled step (policy and critic in one variables tree, one optimizer).
- ``torch``: the same update in eager torch 2.13 CPU with verl 0.9.1's own loss functions
  (``compute_policy_loss_vanilla``, ``compute_value_loss``, ``kl_penalty`` + ``agg_loss``) and
  one AdamW over both models. TRL 1.16 has no PPO trainer any more (it left TRL before 1.0), so
  there is no TRL PPO step to time; this torch loop is the peer.

Rounds alternate the contenders (torch in a fresh process each round, Dew compiled once), each
timing ``--steps`` updates after one warm-up update; a round's time is the median of its steps.
Printed: per contender the median over rounds and the spread (min-max), the ratio of medians
torch / Dew (above 1: Dew faster) and its spread, which is reported as "not shown" when it
crosses 1. A JSON machine record (CPU model, flags, core count, load average before and after)
is written beside the numbers (``--out``). The machine is shared with other work; the load
average shows how busy it was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
B, T = 8, 256
BETA, VALUE_COEFFICIENT, VALUE_CLIP = 0.03, 0.5, 0.2
CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=1088, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip

REFERENCE = r"""
import json, sys, time
import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
mode, directory, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
torch.manual_seed(0)
config = Qwen3Config(**cfg, max_position_embeddings=1024, tie_word_embeddings=True, rope_theta=10000.0)
if mode == "write":
    model = Qwen3ForCausalLM(config).float()
    model.save_pretrained(directory)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__}))
    sys.exit(0)
import verl.trainer.ppo.core_algos as ca
from verl.workers.config import ActorConfig
steps, beta, coef, clip = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
data = np.load(sys.argv[8])
policy = Qwen3ForCausalLM.from_pretrained(directory).float().train()
reference = Qwen3ForCausalLM.from_pretrained(directory).float().eval()
critic = Qwen3ForCausalLM.from_pretrained(directory).float().model.train()
head = torch.nn.Linear(cfg["hidden_size"], 1)
params = [*policy.parameters(), *critic.parameters(), *head.parameters()]
optimizer = torch.optim.AdamW(params, lr=1e-5)
config_actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                           clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
ids = torch.as_tensor(data["input_ids"]).long()
t = {k: torch.as_tensor(data[k][:, 1:]) for k in ("old_log_probs", "advantages", "returns", "old_values")}
mask = torch.as_tensor(data["response_mask"][:, 1:] > 0)

def log_probs(model):
    logits = model(ids[:, :-1]).logits.float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

def update():
    lp = log_probs(policy)
    with torch.no_grad():
        ref = log_probs(reference)
    values = head(critic(ids[:, :-1]).last_hidden_state)[..., 0]
    pg, _ = ca.compute_policy_loss_vanilla(t["old_log_probs"], lp, t["advantages"], mask,
                                           "token-mean", config_actor)
    vf, _ = ca.compute_value_loss(values, t["returns"], t["old_values"], mask, clip, "token-mean")
    kl = ca.agg_loss(ca.kl_penalty(lp, ref, "low_var_kl"), mask, "token-mean")
    loss = pg + coef * vf + beta * kl
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss)

update()
times = []
for _ in range(steps):
    start = time.perf_counter(); update(); times.append(time.perf_counter() - start)
print(json.dumps({"step_s": times, "threads": torch.get_num_threads(), "torch": torch.__version__}))
"""


def reference_python() -> str:
    script = ROOT / "tools" / "reference_env.sh"
    done = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name") and "cpu_model" not in info:
                info["cpu_model"] = line.split(":", 1)[1].strip()
            if line.startswith("flags") and "flags" not in info:
                flags = line.split(":", 1)[1].split()
                info["flags"] = [f for f in flags if f.startswith(("avx", "fma", "amx", "sse4"))]
    except OSError:
        pass
    info["affinity"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return info


def make_batch() -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(1, CONFIG["vocab_size"], (B, T)).astype(np.int32)
    response = np.zeros((B, T), np.int32)
    response[:, T // 2 :] = 1
    floats = lambda scale, shift=0.0: np.where(  # noqa: E731
        response > 0, rng.normal(shift, scale, (B, T)), 0.0
    ).astype(np.float32)
    return {
        "input_ids": ids,
        "text_segment_ids": np.ones((B, T), np.int32),
        "text_positions": np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
        "response_mask": response,
        "old_log_probs": floats(0.3, -np.log(CONFIG["vocab_size"])),
        "advantages": floats(1.0),
        "returns": floats(1.0),
        "old_values": floats(0.5),
    }


class DewUpdate:
    """Dew's compiled PPO step on one placed batch, state carried across calls."""

    def __init__(self, directory: str, batch: dict[str, Any]) -> None:
        import jax
        import optax

        from dew import models
        from dew.objectives.rl import PPOObjective, ValueHead
        from dew.trainer import Trainer
        from dew.trainer.mesh import global_batch

        pre = models.load_pretrained(directory)
        critic = ValueHead(models.build("qwen3", **pre.config.__dict__))
        objective = PPOObjective(
            pre.model, T - 1, critic=critic, beta=BETA, value_coefficient=VALUE_COEFFICIENT,
            value_clip=VALUE_CLIP, epsilon_high=0.28, pretrained=dict(pre.variables),
        )  # fmt: skip
        trainer = Trainer(objective, optax.adamw(1e-5), key=jax.random.key(0),
                          devices=jax.devices()[:1])  # fmt: skip
        self.jax = jax
        self.state = trainer.initial_state()
        self.batch = global_batch(batch, trainer.mesh)
        self.step = trainer._step()
        start = time.perf_counter()
        self()
        self.first_step_s = time.perf_counter() - start
        self.parameters = sum(x.size for x in jax.tree.leaves(self.state.params))

    def __call__(self) -> float:
        start = time.perf_counter()
        self.state, metrics = self.step(self.state, self.batch)
        self.jax.block_until_ready(metrics)
        return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{min(values) * 1e3:.0f}-{max(values) * 1e3:.0f} ms"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="timed updates per round")
    parser.add_argument("--out", type=Path, default=Path("bench_ppo_step.json"))
    args = parser.parse_args()
    if args.rounds < 3:
        sys.exit("--rounds: expected at least 3")
    record: dict[str, Any] = {"machine": machine(), "load_before": os.getloadavg()}
    python = reference_python()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    rounds: dict[str, list[float]] = {"torch": [], "dew": []}
    with tempfile.TemporaryDirectory() as directory:
        ckpt = str(Path(directory) / "qwen3")
        done = subprocess.run(
            [python, "-c", REFERENCE, "write", ckpt, json.dumps(CONFIG)],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(done.stderr[-4000:])
        written = json.loads(done.stdout.strip().splitlines()[-1])
        batch = make_batch()
        data = str(Path(directory) / "batch.npz")
        np.savez(data, **batch)
        dew = DewUpdate(ckpt, batch)
        for number in range(args.rounds):
            done = subprocess.run(
                [python, "-c", REFERENCE, "run", ckpt, json.dumps(CONFIG), str(args.steps),
                 str(BETA), str(VALUE_COEFFICIENT), str(VALUE_CLIP), data],
                capture_output=True, text=True, env=env,
            )  # fmt: skip
            if done.returncode != 0:
                sys.exit(done.stderr[-4000:])
            torch_round = json.loads(done.stdout.strip().splitlines()[-1])
            rounds["torch"].append(median(torch_round["step_s"]))
            rounds["dew"].append(median([dew() for _ in range(args.steps)]))
            print(
                f"round {number + 1}: torch {rounds['torch'][-1] * 1e3:.0f} ms, "
                f"dew {rounds['dew'][-1] * 1e3:.0f} ms per update"
            )
    record["load_after"] = os.getloadavg()
    torch_median, dew_median = median(rounds["torch"]), median(rounds["dew"])
    ratio = torch_median / dew_median
    low, high = min(rounds["torch"]) / max(rounds["dew"]), max(rounds["torch"]) / min(rounds["dew"])
    verdict = "shown" if low > 1 or high < 1 else "not shown (the spread crosses 1)"
    print(
        f"model: Qwen3 {written['params'] / 1e6:.2f}M parameters (policy, reference and critic "
        f"each), [{B}, {T}] tokens, response {T // 2} per row, AdamW over policy + critic"
    )
    print(f"torch {torch_round['torch']} ({torch_round['threads']} threads) with verl 0.9.1 losses")
    print(f"dew first update (compile + run): {dew.first_step_s:.1f} s")
    for name in ("torch", "dew"):
        print(
            f"{name:6s} median {median(rounds[name]) * 1e3:7.1f} ms  spread {spread(rounds[name])}"
        )
    print(f"ratio torch / dew: {ratio:.2f}x (spread {low:.2f}-{high:.2f}x; Dew faster: {verdict})")
    print(
        f"load average before {record['load_before'][0]:.1f}, after {record['load_after'][0]:.1f} "
        f"on {os.cpu_count()} cores, shared with other work"
    )
    record.update(
        rounds=rounds, ratio=ratio, ratio_spread=[low, high], verdict=verdict,
        dew_first_step_s=dew.first_step_s, dew_parameters=dew.parameters,
        torch=torch_round["torch"], threads=torch_round["threads"],
        shape={"batch": B, "tokens": T, **CONFIG},
    )  # fmt: skip
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"machine record: {args.out}")


if __name__ == "__main__":
    main()
