"""Tool-episode throughput: EpisodeRollout against a plain sequential loop, same policy and tool.

Both contenders collect the same cohort, 64 episodes (16 tasks x 4 samples) of 3 turns each,
from the same ``TextGeneration`` policy against ``SubprocessEnvironment`` workers (one worker
process per episode, a JSON-lines tool that keeps the episode running for three turns), then
make the same GRPO update:

* ``rollout``: ``EpisodeRollout`` (every slot's turn sampled together, one policy call per
  round), packed and trained by one compiled ``GRPOObjective`` update;
* ``loop``: plain Python, one episode after another, one policy call per turn, then the same
  packing (``project``) and the same update.

Contenders run interleaved by tools/bench/_rounds.py, one cohort each per round, for
``--rounds`` rounds after a warm-up round that compiles every program, pinned to the same
CPUs. Printed per contender: seconds per cohort and episodes/s (median and min-max over the
rounds) and the shares of the wall time in generation, tool (environment open/reset/step:
wall time, the rollout runs them on threads) and update; then the ratio of medians with the
per-round spread and the verdict on the goal (>= 3x). The machine is shared by other jobs:
the load average before and after is recorded in tools/bench/results/episodes.json.

    JAX_PLATFORMS=cpu .venv/bin/python tools/bench/bench_episodes.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _rounds import Bench, add_arguments  # noqa: E402

import dew.models  # noqa: E402
from dew.inference import TextGeneration  # noqa: E402
from dew.objectives.rl import EpisodeRollout  # noqa: E402
from dew.objectives.rl.grpo import GRPOObjective  # noqa: E402
from dew.rollouts.episodes import (  # noqa: E402
    Action,
    EpisodeId,
    EpisodeStatus,
    Observation,
    Transition,
)
from dew.rollouts.episodes import Episode as EpisodeRecord  # noqa: E402
from dew.rollouts.episodes.projection import project  # noqa: E402
from dew.rollouts.episodes.protocol import as_observation  # noqa: E402
from dew.sampling import Sampling  # noqa: E402
from dew.sandbox import SandboxLimits, SubprocessEnvironment  # noqa: E402

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
    add_arguments(parser, rounds=3)
    args = parser.parse_args()
    bench = Bench("episodes", args.cpus, args.threads)

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

    run_rollout(jax.random.key(99))  # warm-up: compile every program of both contenders
    run_loop(jax.random.key(99))
    keys = iter(range(10**6))
    times = bench.rounds({"rollout": lambda: run_rollout(jax.random.key(next(keys) // 2)),
                          "loop": lambda: run_loop(jax.random.key(next(keys) // 2))},
                         args.rounds)  # fmt: skip
    episodes = TASKS * GROUPS
    bench.say(f"{episodes} episodes ({TASKS} tasks x {GROUPS} samples) of up to {TURNS} turns "
              "per contender a round; seconds per cohort (collect + update)")  # fmt: skip
    for name in ("rollout", "loop"):
        total = times[f"{name} total"]
        bench.show(f"{name} total", total, 1.0, " s", 2,
                   extra=f"{episodes / sorted(total)[len(total) // 2]:.2f} episodes/s")  # fmt: skip
        shares = ", ".join(
            f"{part} {sorted(times[f'{name} {part}'])[len(total) // 2] / sorted(total)[len(total) // 2]:.0%}"
            for part in ("generation", "tool", "update")
        )
        bench.say(f"  {'':28s} shares of the median: {shares}")
    bench.compare("rollout vs loop (loop time / rollout time)", times["loop total"],
                  times["rollout total"], GOAL)  # fmt: skip
    bench.finish({"episodes": episodes, "turns": TURNS, "goal": GOAL})


if __name__ == "__main__":
    main()
