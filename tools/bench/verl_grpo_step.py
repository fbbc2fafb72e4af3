"""verl 0.9.1's eager GRPO-style loss step as a timing worker; bench_rl.py drives it.

Runs inside the reference venv (tools/reference_env.sh). The step: verl's
compute_policy_loss_vanilla (dual clip, token-mean) plus
kl_coef * agg_loss(kl_penalty(log_prob, ref, "k3"), token-mean), backward to log_prob.

Protocol, one JSON object per line on stdin, one reply per line on stdout:

- ``{"load": PATH}``: read the npz bench_rl.py wrote (log_prob, old_log_prob, ref_log_prob,
  advantages, response_mask [B, T]; clip_low, clip_high, clip_c, kl_coef), warm up, reply
  ``{"loss": ..., "grad_abs_sum": ...}``;
- ``{"time": N}``: run N steps, reply ``{"times_s": [...], "cpu_s": [...]}`` (wall-clock and
  process CPU seconds per step);
- ``{"quit": true}``: exit.

The first reply line is ``{"torch": version, "threads": n}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import verl.trainer.ppo.core_algos as core_algos
from verl.workers.config import ActorConfig


def make_step(path: str) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    """The step closure over the tensors in ``path`` and the leaf whose gradient it fills."""
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
    kl_coef = float(data["kl_coef"])
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

    return step, log_prob


def reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    threads = threads or int(os.environ.get("DEW_BENCH_THREADS", "0"))  # the harness's count
    if threads > 0:
        torch.set_num_threads(threads)
    reply({"torch": torch.__version__, "threads": torch.get_num_threads()})
    step = leaf = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if "load" in cmd:
            step, leaf = make_step(cmd["load"])
            for _ in range(3):
                loss = step()
            reply({"loss": loss.item(), "grad_abs_sum": leaf.grad.abs().sum().item()})
        elif "time" in cmd:
            assert step is not None, "time before load"
            times, cpu = [], []
            for _ in range(int(cmd["time"])):
                start, start_cpu = time.perf_counter(), time.process_time()
                step()
                cpu.append(time.process_time() - start_cpu)
                times.append(time.perf_counter() - start)
            reply({"times_s": times, "cpu_s": cpu})
        else:
            return


if __name__ == "__main__":
    main()
