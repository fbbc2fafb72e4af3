"""Tool-episode throughput: EpisodeRollout against a plain sequential loop, same policy and tool.

Both contenders collect the same cohort, 64 episodes (16 tasks x 4 samples) of 3 turns each,
from the same ``TextGeneration`` policy against ``SubprocessEnvironment`` workers (one worker
process per episode, a JSON-lines tool that keeps the episode running for three turns), then
make the same GRPO update:

* ``rollout``: ``EpisodeRollout`` (every slot's turn sampled together, one policy call per
  round), packed and trained by one compiled ``GRPOObjective`` update;
* ``loop``: plain Python, one episode after another, one policy call per turn, then the same
  packing (``project``) and the same update.

Contenders run interleaved, one cohort each per round, for ``--rounds`` rounds after a
warm-up round that compiles every program. Printed per contender: episodes/s (median and
min-max over the rounds) and the shares of the wall time in generation, tool (environment
open/reset/step: wall time, the rollout runs them on threads) and update; then the ratio of medians with its range (worst/best pairing)
and whether the goal (>= 3x) is shown. The machine is shared by other jobs: the load average
before and after is recorded. A JSON record goes to ``--out``.

    JAX_PLATFORMS=cpu .venv/bin/python tools/bench/bench_episodes.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

import dew.models
from dew.inference import TextGeneration
from dew.objectives.rl.grpo import GRPOObjective
from dew.objectives.rollouts.episodes import (
    Action,
    EpisodeId,
    EpisodeRollout,
    EpisodeStatus,
    Observation,
    Transition,
)
from dew.objectives.rollouts.episodes import Episode as EpisodeRecord
from dew.objectives.rollouts.episodes.projection import project
from dew.objectives.rollouts.episodes.protocol import as_observation
from dew.sampling import Sampling
from dew.sandbox import SandboxLimits, SubprocessEnvironment

TASKS, GROUPS, TURNS = 16, 4, 3
P, R, VOCAB = 24, 8, 32
GOAL = 3.0
WORKER = r"""
import json, sys
turns = 0
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "reset":
        reply = {"context": [3, 4 + request["episode"]["task"] % 8], "status": "running"}
    else:
        turns += 1
        if turns >= 3:
            reply = {"context": None, "status": "completed", "detail": str(len(request["tokens"]))}
        else:
            context = request["context"][-12:] + request["tokens"] + [5]
            reply = {"context": context, "status": "running", "detail": ""}
    print(json.dumps(reply), flush=True)
"""


def verifier(episode) -> float:
    return float(episode.detail == "2")


def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "devices": jax.device_count(),
        "shared_machine": "yes: other jobs may run at the same time",
    }


class Loop:
    """The sequential peer: one episode, one turn, one policy call at a time."""

    def __init__(self, policy, factory, sampling) -> None:
        self.policy, self.factory, self.sampling = policy, factory, sampling
        self.timings: dict[str, float] = {}

    def collect(self, variables, tasks, key) -> list:
        self.policy.bind(variables)
        generation = tool = 0.0
        origin = object()
        episodes = []
        for row, task in enumerate(tasks):
            for sample in range(GROUPS):
                episode_id = EpisodeId(int(task), 1, sample, row * GROUPS + sample)
                start = time.perf_counter()
                manager = self.factory(episode_id)
                env = manager.__enter__()
                first = as_observation(env.reset(), "reset")
                tool += time.perf_counter() - start
                transitions, context, status, detail = [], first.context, None, ""
                for turn in range(TURNS):
                    start = time.perf_counter()
                    key_turn = jax.random.fold_in(key, row * 1000 + sample * 10 + turn)
                    drawn = self.policy(context, R, key_turn, self.sampling)
                    generation += time.perf_counter() - start
                    action = Action(context, drawn.ids, drawn.raw_log_probs,
                                    drawn.behavior_log_probs, bool(drawn.eos), 0, origin)  # fmt: skip
                    if not drawn.eos:
                        reply = Observation(None, EpisodeStatus.TRUNCATED, "budget")
                        transitions.append(Transition(action, reply))
                        status, detail = EpisodeStatus.TRUNCATED, "budget"
                        break
                    start = time.perf_counter()
                    reply = as_observation(env.step(action), "step")
                    tool += time.perf_counter() - start
                    transitions.append(Transition(action, reply))
                    if reply.status.terminal:
                        status, detail = reply.status, reply.detail
                        break
                    context = reply.context
                status = status or EpisodeStatus.TRUNCATED
                episode = EpisodeRecord(episode_id, first, tuple(transitions), status, detail,
                                        origin=origin)  # fmt: skip
                reward = verifier(episode)
                start = time.perf_counter()
                manager.__exit__(None, None, None)
                tool += time.perf_counter() - start
                episodes.append(EpisodeRecord(episode_id, first, tuple(transitions), status,
                                              detail, reward, origin=origin))  # fmt: skip
        self.timings = {"generation": generation, "tool": tool}
        return episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench_episodes.json")
    args = parser.parse_args()

    model = dew.models.build("causal_transformer", vocab_size=VOCAB, emb_features=64,
                             num_layers=2, num_heads=4, mlp_features=128, max_seq_len=64)  # fmt: skip
    objective = GRPOObjective(model, seq_len=P + R - 1)
    variables = objective.init(jax.random.key(0))
    sampling = Sampling(eos_id=tuple(range(16, 32)), temperature=1.0)
    directory = tempfile.mkdtemp(prefix="bench-episodes-")
    worker = os.path.join(directory, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    factory = SubprocessEnvironment([sys.executable, worker], SandboxLimits(deadline_seconds=120))
    rollout = EpisodeRollout(TextGeneration(model), factory, verifier, P, R, TURNS, GROUPS,
                             sampling, progress=False)  # fmt: skip
    loop = Loop(TextGeneration(model), factory, sampling)
    grad = jax.jit(jax.grad(lambda v, b: objective.loss(v, b, jax.random.key(0))[0]))
    tasks = np.arange(TASKS)

    def update(episodes) -> float:
        start = time.perf_counter()
        groups = [i // GROUPS for i in range(len(episodes))]
        batch = project(episodes, groups, width=P + R, rows=len(episodes) * TURNS,
                        eos_ids=sampling.eos_ids)  # fmt: skip
        batch.pop("rewards")
        jax.block_until_ready(grad(variables, batch))
        return time.perf_counter() - start

    def run_rollout(key) -> dict:
        start = time.perf_counter()
        episodes = rollout.collect(variables, tasks, key)
        collected = time.perf_counter()
        seconds = update(episodes)
        total = time.perf_counter() - start
        t = rollout.last_timings
        return {"total": total, "generation": t["generation"], "tool": t["tool_wall"],
                "update": seconds, "collect": collected - start,
                "turns": sum(e.turns for e in episodes)}  # fmt: skip

    def run_loop(key) -> dict:
        start = time.perf_counter()
        episodes = loop.collect(variables, tasks, key)
        collected = time.perf_counter()
        seconds = update(episodes)
        total = time.perf_counter() - start
        return {"total": total, "generation": loop.timings["generation"],
                "tool": loop.timings["tool"], "update": seconds, "collect": collected - start,
                "turns": sum(e.turns for e in episodes)}  # fmt: skip

    load_before = os.getloadavg()
    run_rollout(jax.random.key(99))  # warm-up: compile every program of both contenders
    run_loop(jax.random.key(99))
    results: dict[str, list[dict]] = {"rollout": [], "loop": []}
    for index in range(args.rounds):
        key = jax.random.key(index)
        results["rollout"].append(run_rollout(key))
        results["loop"].append(run_loop(key))
    load_after = os.getloadavg()

    episodes = TASKS * GROUPS
    summary = {}
    for name, runs in results.items():
        rates = [episodes / r["total"] for r in runs]
        share = {part: statistics.median(r[part] / r["total"] for r in runs)
                 for part in ("generation", "tool", "update")}  # fmt: skip
        summary[name] = {"episodes_per_s": rates, "median": statistics.median(rates),
                         "min": min(rates), "max": max(rates), "shares": share,
                         "turns": [r["turns"] for r in runs]}  # fmt: skip
        print(f"{name:8s} {statistics.median(rates):7.2f} episodes/s "
              f"(min {min(rates):.2f}, max {max(rates):.2f}); shares: generation "
              f"{share['generation']:.0%}, tool {share['tool']:.0%}, update {share['update']:.0%}; "
              f"turns {summary[name]['turns']}")  # fmt: skip
    ratio = summary["rollout"]["median"] / summary["loop"]["median"]
    low = summary["rollout"]["min"] / summary["loop"]["max"]
    high = summary["rollout"]["max"] / summary["loop"]["min"]
    verdict = "shown" if low >= GOAL else ("not shown" if high >= GOAL > low else "missed")
    print(f"ratio rollout/loop: {ratio:.2f}x (range {low:.2f}-{high:.2f}); goal >= {GOAL}x: "
          f"{verdict}")  # fmt: skip
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} on "
          f"{os.cpu_count()} cores (shared machine)")  # fmt: skip
    record = {"benchmark": "bench_episodes", "episodes": episodes, "turns": TURNS,
              "rounds": args.rounds, "machine": machine(), "load_before": load_before,
              "load_after": load_after, "results": results, "summary": summary,
              "ratio": ratio, "ratio_range": [low, high], "goal": GOAL, "verdict": verdict}  # fmt: skip
    with open(args.out + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    print(f"machine record: {args.out}")


if __name__ == "__main__":
    main()
