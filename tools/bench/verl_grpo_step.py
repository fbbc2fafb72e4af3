"""Time verl 0.9.1's eager GRPO-style loss step; run by bench_rl.py inside the reference venv.

Reads the inputs bench_rl.py wrote (an npz with log_prob, old_log_prob, ref_log_prob, advantages,
response_mask, all [B, T]), runs verl's compute_policy_loss_vanilla (dual clip, token-mean) plus
kl_coef * agg_loss(kl_penalty(k3), token-mean), and backward to log_prob. Prints one JSON line:
the median and all step times in seconds, the loss, a checksum of the gradient, and the torch
thread count.

Usage: <reference python> tools/bench/verl_grpo_step.py INPUTS.npz REPEATS KL_COEF
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import torch
import verl.trainer.ppo.core_algos as core_algos
from verl.workers.config import ActorConfig


def main() -> None:
    path, repeats, kl_coef = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    data = np.load(path)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=float(data["clip_low"]),
        clip_ratio_low=float(data["clip_low"]),
        clip_ratio_high=float(data["clip_high"]),
        clip_ratio_c=float(data["clip_c"]),
    )
    old = torch.from_numpy(data["old_log_prob"])
    ref = torch.from_numpy(data["ref_log_prob"])
    adv = torch.from_numpy(data["advantages"])
    mask = torch.from_numpy(data["response_mask"].astype(np.float32))
    log_prob = torch.from_numpy(data["log_prob"]).requires_grad_(True)

    def step() -> torch.Tensor:
        log_prob.grad = None
        pg_loss, _ = core_algos.compute_policy_loss_vanilla(
            old, log_prob, adv, mask, loss_agg_mode="token-mean", config=config
        )
        kl = core_algos.kl_penalty(log_prob, ref, "k3")
        loss = pg_loss + kl_coef * core_algos.agg_loss(kl, mask, "token-mean")
        loss.backward()
        return loss

    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
    grad = log_prob.grad.numpy()
    print(
        json.dumps(
            {
                "median_s": statistics.median(times),
                "times_s": times,
                "loss": float(loss),
                "grad_abs_sum": float(np.abs(grad).sum()),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
