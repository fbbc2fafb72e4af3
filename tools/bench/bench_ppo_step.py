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

Rounds alternate the contenders (tools/bench/_rounds.py; torch in a fresh process each round,
Dew compiled once; both pinned to the same CPUs with the same thread count), each timing
``--steps`` updates after one warm-up update; a round's time is the median of its steps.
Printed: per contender the median over rounds and the spread (min-max), the ratio of medians
torch / Dew (above 1: Dew faster) with the per-round spread, "not shown" when it crosses 1. A
JSON machine record (CPU model, flags, core count, load average before and after) goes to
tools/bench/results/ppo_step.json. The machine is shared with other work; the load average
shows how busy it was.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments, reference_python  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
B, T = 8, 256
BETA, VALUE_COEFFICIENT, VALUE_CLIP = 0.03, 0.5, 0.2
CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=1088, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64)  # fmt: skip

REFERENCE = r"""
import json, os, sys, time
import numpy as np
import torch
if int(os.environ.get("DEW_BENCH_THREADS", "0")) > 0:  # the harness's thread count
    torch.set_num_threads(int(os.environ["DEW_BENCH_THREADS"]))
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
        from dew.mesh import global_batch
        from dew.objectives.rl import PPOObjective, ValueHead
        from dew.trainer import Trainer

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


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--steps", type=int, default=4, help="timed updates per round")
    args = parser.parse_args()
    bench = Bench("ppo_step", args.cpus, args.threads)
    python = reference_python()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    info: dict[str, Any] = {}
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

        def torch_round() -> list[float]:
            done = subprocess.run(
                [python, "-c", REFERENCE, "run", ckpt, json.dumps(CONFIG), str(args.steps),
                 str(BETA), str(VALUE_COEFFICIENT), str(VALUE_CLIP), data],
                capture_output=True, text=True, env=env,
            )  # fmt: skip
            if done.returncode != 0:
                sys.exit(done.stderr[-4000:])
            got = json.loads(done.stdout.strip().splitlines()[-1])
            info.update(torch=got["torch"], threads=got["threads"])
            return got["step_s"]

        times = bench.rounds(
            {"torch": torch_round, "dew": lambda: [dew() for _ in range(args.steps)]}, args.rounds
        )
    bench.say(
        f"model: Qwen3 {written['params'] / 1e6:.2f}M parameters (policy, reference and critic "
        f"each), [{B}, {T}] tokens, response {T // 2} per row, AdamW over policy + critic; torch "
        f"{info['torch']} ({info['threads']} threads) with verl 0.9.1 losses, a fresh process "
        f"per round; dew first update (compile + run) {dew.first_step_s:.1f} s"
    )
    for name in ("torch", "dew"):
        bench.show(name, times[name])
    bench.compare("torch / dew update time", times["torch"], times["dew"], 1.0)
    bench.finish({"args": vars(args), "dew_first_step_s": dew.first_step_s,
                  "dew_parameters": dew.parameters, "shape": {"batch": B, "tokens": T, **CONFIG},
                  **info})  # fmt: skip


if __name__ == "__main__":
    main()
