"""Asynchronous GRPO: how long the trainer waits and how far off-policy it trains, with
``ahead`` fixed at 0 or 1 or chosen by ``AdaptiveAhead``, under fast and slow rewards.

Three contenders train the same GRPO budget on the same decoder (B prompts x G samples of R
new ids per update, the same reward), each for ``--updates`` updates per round, in each of
two regimes:

* ``ahead0``: ``RolloutScheduler`` over a ``PromptSource`` on a ``NativeRolloutServer``,
  synchronous (``ahead=0``): each batch is drawn after the previous update;
* ``ahead1``: the same scheduler, batch ``i + 1`` drawn while the trainer updates on batch
  ``i`` (``ahead=1``);
* ``adaptive``: the same scheduler with ``ahead=AdaptiveAhead(target_wait, max_gap,
  start=1)``, free to choose 0 .. ``max_lag`` (``--max-lag``, every contender's bound);

* ``fast``: the reward is the share of even ids (microseconds);
* ``slow``: the same reward after sleeping ``--slow-ms`` per sample (an external verifier),
  on the source's 4 reward workers.

Each round continues every contender's own run by ``--updates`` updates (one Trainer per
contender and regime, so nothing recompiles after the warm-up), the six in an order that
rotates by one each round. The first update of each round refills the pipeline and is left
out: a round's updates/minute, waiting share and gap cover the later updates only, from the
start of the second rollout call to the end of the round. The waiting share is the seconds
the scheduler spent collecting (``SchedulerRecord.waited``) over that wall time; the gap is
the mean over those batches of ``staleness/gap``, each batch's mean ``|old_log_probs -
behavior_log_probs|`` over its response tokens. One table: median (min-max over rounds).

    JAX_PLATFORMS=cpu uv run python tools/bench/bench_async.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments, spread  # noqa: E402

GOAL_WAIT = 0.05
VOCAB, P, R = 64, 8, 24
EOS = tuple(range(0, VOCAB, 8))


def even_share(data_source: str, completion: str, truth: str, info: str) -> float:
    ids = [int(t) for t in completion.split()]
    return sum(i % 2 == 0 for i in ids) / max(1, len(ids))


class Timed:
    """Wraps a rollout: the wall clock at the start and end of each call."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.starts: list[float] = []
        self.ends: list[float] = []

    def at_step(self, step: int, updates: int) -> None:
        at_step = getattr(self.rollout, "at_step", None)
        if at_step is not None:
            at_step(step, updates)

    def __call__(self, variables: Any, batch: Any, key: Any) -> Any:
        self.starts.append(time.perf_counter())
        out = self.rollout(variables, batch, key)
        self.ends.append(time.perf_counter())
        return out


def slow(delay: float) -> Any:
    """``even_share`` after sleeping ``delay`` seconds: a reward that takes its time."""

    def reward(data_source: str, completion: str, truth: str, info: str) -> float:
        time.sleep(delay)
        return even_share(data_source, completion, truth, info)

    return reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--updates", type=int, default=6, help="updates per round")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--width", type=int, default=64, help="decoder features")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--slow-ms", type=float, default=20.0, help="slow reward, per sample")
    parser.add_argument("--max-lag", type=int, default=3, help="every contender's max_lag")
    parser.add_argument("--target-wait", type=float, default=GOAL_WAIT)
    parser.add_argument("--max-gap", type=float, default=0.02)
    args = parser.parse_args()
    bench = Bench("async", args.cpus, args.threads)

    import jax
    import numpy as np
    import optax

    from dew import Trainer
    from dew.data import Dataset
    from dew.inference import Server
    from dew.objectives.rl import GRPOObjective
    from dew.rollout import NativeRolloutServer, PromptSource, RolloutScheduler, prompt_tasks
    from dew.rollout.scheduler.staleness import AdaptiveAhead
    from dew.sampling import Sampling
    from dew.testing import tiny_decoder

    width = P + R
    model = tiny_decoder(VOCAB, width, emb_features=args.width, num_layers=args.layers,
                         num_heads=4, mlp_features=4 * args.width, init_std=0.5)  # fmt: skip
    objective = GRPOObjective(model, seq_len=width - 1, behavior_importance=2.0)
    variables = objective.init(jax.random.key(0))
    objective = GRPOObjective(model, seq_len=width - 1, behavior_importance=2.0,
                              pretrained=variables)  # fmt: skip
    sampling = Sampling(temperature=1.0, eos_id=EOS)
    rows = args.prompts * args.groups

    def batches(partition: Any, start: int = 0) -> Any:
        i = start
        while True:
            rng = np.random.default_rng([3, i])
            yield {"prompt": rng.integers(1, VOCAB, (args.prompts, P)).astype(np.int32),
                   "prompt_length": np.full((args.prompts,), P, np.int32)}  # fmt: skip
            i += 1

    data = Dataset(train=batches, batch=args.prompts)
    closers: list[Any] = []
    rewards = {"fast": even_share, "slow": slow(args.slow_ms / 1e3)}

    def scheduled(ahead: Any, reward: Any) -> dict[str, Any]:
        core = Server(model, variables, slots=rows, capacity=width, sampling=sampling,
                      min_window=width)  # fmt: skip
        server = NativeRolloutServer(core)
        source = PromptSource(server, reward, max_new_tokens=R)
        closers.extend([source.close, server.close])
        records: list[Any] = []
        scheduler = RolloutScheduler(objective, source, server, width=width, rows=rows,
                                     tasks=prompt_tasks, groups=args.groups, ahead=ahead,
                                     max_lag=args.max_lag, truncation="score",
                                     log=records.append)  # fmt: skip
        timed = Timed(scheduler)
        trainer = Trainer(objective, optax.adam(1e-4), key=jax.random.key(1), rollout=timed,
                          progress=False)  # fmt: skip
        return {"trainer": trainer, "timed": timed, "records": records,
                "data": scheduler.tasks(data), "state": None}  # fmt: skip

    def adaptive() -> Any:
        return AdaptiveAhead(args.target_wait, args.max_gap, start=1)

    runs = {
        f"{regime}/{name}": scheduled(ahead() if callable(ahead) else ahead, reward)
        for regime, reward in rewards.items()
        for name, ahead in (("ahead0", 0), ("ahead1", 1), ("adaptive", adaptive))
    }

    def advance(run: dict[str, Any], updates: int) -> dict[str, float]:
        """Train ``updates`` more; what the updates after the first measured."""
        state = run["state"] or run["trainer"].initial_state()
        target = int(jax.device_get(state.step)) + updates
        timed, records = run["timed"], run["records"]
        first_call, first_record = len(timed.starts), len(records)
        state = run["trainer"].fit(run["data"], steps=target, state=state)
        jax.block_until_ready(state.params)
        end = time.perf_counter()
        run["state"] = state
        wall = end - timed.starts[first_call + 1]
        later = records[first_record + 1 :]
        return {
            "updates/min": (updates - 1) / wall * 60.0,
            "waiting": sum(r.waited for r in later) / wall,
            "gap": float(np.mean([r.metrics["staleness/gap"] for r in later])),
            "ahead": float(np.mean([r.metrics["staleness/ahead"] for r in later])),
        }

    def contender(name: str) -> Any:
        return lambda: advance(runs[name], args.updates)

    bench.say(
        f"GRPO budget per update: {args.prompts} prompts x {args.groups} samples, P={P}, "
        f"R={R}; decoder {args.layers} layers x {args.width}; {args.updates} updates per "
        f"round; max_lag {args.max_lag}; slow reward {args.slow_ms:g} ms/sample; adaptive: "
        f"target_wait {args.target_wait:g}, max_gap {args.max_gap:g}, start 1"
    )
    for name in runs:  # warm-up: compile every program of every contender
        advance(runs[name], 3)
    times = bench.rounds({name: contender(name) for name in runs}, args.rounds)
    bench.say("  median (min-max over rounds)")
    bench.say(f"  {'regime':7s} {'contender':9s} {'wait share %':>20s} "
              f"{'gap |log-ratio|':>26s} {'mean ahead':>16s} {'updates/min':>24s}")  # fmt: skip
    for name in runs:
        regime, who = name.split("/")
        cells = [spread(times[f"{name} {k}"]) for k in ("waiting", "gap", "ahead", "updates/min")]
        bench.say(
            f"  {regime:7s} {who:9s} {cells[0].text(100.0, '', 1):>20s} "
            f"{cells[1].text(1.0, '', 4):>26s} {cells[2].text(1.0, '', 2):>16s} "
            f"{cells[3].text(1.0, '', 1):>24s}"
        )
    for regime in rewards:
        for other in ("ahead0", "ahead1"):
            bench.compare(f"{regime}: adaptive / {other} updates/min",
                          times[f"{regime}/adaptive updates/min"],
                          times[f"{regime}/{other} updates/min"])  # fmt: skip
    for close in closers:
        close()
    bench.finish({"args": vars(args)})


if __name__ == "__main__":
    main()
