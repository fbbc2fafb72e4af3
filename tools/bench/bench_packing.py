"""Packing density of ``sessions.pack`` against one-sequence-per-row right padding.

For sessions with a long-tailed length distribution, prints the share of ``[rows, width]``
cells that hold a real id when Dew packs chains first-fit decreasing into rows, next to the
share a padded layout gets with one chain per row at the same width (what a trainer without
packing pays). Both layouts hold exactly the same chains. Also prints the rows each needs and
the packer's throughput on the host.

Distributions (seeded):

- ``lognormal``: single-call sessions, prompt ~ lognormal(4.5, 0.6), response ~
  lognormal(5.0, 1.0), clipped to the width: the long tail of RLVR completions;
- ``pareto``: single-call, lengths ~ 64 * (1 + Pareto(1.5)), a heavier tail;
- ``agentic``: multi-turn sessions of 1-6 calls whose contexts extend each other (one chain
  each), observation and action lengths lognormal, so a few sessions are very long.

The packer's time is measured in interleaved rounds (tools/bench/_rounds.py) and printed as a
median with its spread; the densities are exact. Record: tools/bench/results/packing.json.

Usage: .venv/bin/python tools/bench/bench_packing.py [--sessions 2048] [--width 4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from _rounds import Bench, add_arguments  # noqa: E402

from dew.sessions import Call, Session, chain_lengths, pack, rows_needed

GOAL = 0.90


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(1, 30000, max(int(n), 1)).tolist()


def single_call(rng: np.random.Generator, prompt: int, response: int, index: int) -> Session:
    call = Call(
        prompt_ids=_ids(rng, prompt),
        sampled_ids=_ids(rng, response),
        behavior_log_probs=np.full(max(int(response), 1), -1.0),
    )
    return Session(task=index // 8, sample=index % 8, calls=(call,), reward=float(index % 3))


def lognormal(rng: np.random.Generator, n: int, width: int) -> list[Session]:
    out = []
    for i in range(n):
        prompt = int(np.clip(rng.lognormal(4.5, 0.6), 8, width // 4))
        response = int(np.clip(rng.lognormal(5.0, 1.0), 1, width - prompt))
        out.append(single_call(rng, prompt, response, i))
    return out


def pareto(rng: np.random.Generator, n: int, width: int) -> list[Session]:
    out = []
    for i in range(n):
        total = int(np.clip(64 * (1 + rng.pareto(1.5)), 16, width))
        prompt = max(8, total // 5)
        out.append(single_call(rng, prompt, max(total - prompt, 1), i))
    return out


def agentic(rng: np.random.Generator, n: int, width: int) -> list[Session]:
    out = []
    for i in range(n):
        chain = _ids(rng, int(np.clip(rng.lognormal(5.0, 0.5), 16, width // 4)))
        calls = []
        for _ in range(int(rng.integers(1, 7))):
            action = int(np.clip(rng.lognormal(4.0, 1.0), 1, 1024))
            if len(chain) + action > width:
                break
            sampled = _ids(rng, action)
            calls.append(
                Call(
                    prompt_ids=list(chain), sampled_ids=sampled, behavior_log_probs=[-1.0] * action
                )
            )
            observation = int(np.clip(rng.lognormal(3.5, 1.0), 1, 2048))
            chain = chain + sampled + _ids(rng, observation)
            if len(chain) >= width:
                break
        out.append(Session(task=i // 8, sample=i % 8, calls=tuple(calls), reward=float(i % 2)))
    return out


def measure(name: str, sessions: list[Session], width: int) -> dict[str, float]:
    lengths = chain_lengths(sessions, width, truncation="score")
    start = time.perf_counter()
    batch = pack(sessions, width, truncation="score")
    seconds = time.perf_counter() - start
    rows = batch["input_ids"].shape[0]
    assert rows == rows_needed(lengths, width)
    filled = int((batch["text_segment_ids"] > 0).sum())
    assert filled == sum(lengths)
    packed_density = filled / (rows * width)
    padded_density = sum(lengths) / (len(lengths) * width)
    tight = max(lengths)  # padding to the longest chain of this batch instead of the width
    padded_tight = sum(lengths) / (len(lengths) * tight)
    return {
        "name": name,
        "chains": len(lengths),
        "tokens": sum(lengths),
        "packed_rows": rows,
        "padded_rows": len(lengths),
        "packed": packed_density,
        "padded": padded_density,
        "padded_to_longest": padded_tight,
        "ratio": packed_density / padded_density,
        "sessions_per_s": len(sessions) / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--sessions", type=int, default=2048)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    bench = Bench("packing", args.cpus, args.threads)
    rng = np.random.default_rng(args.seed)
    made = {name: make(rng, args.sessions, args.width)
            for name, make in (("lognormal", lognormal), ("pareto", pareto), ("agentic", agentic))}  # fmt: skip
    found: dict[str, dict[str, float]] = {}

    def packer(name: str):
        def call() -> float:
            found[name] = measure(name, made[name], args.width)
            return 1.0 / found[name]["sessions_per_s"]  # seconds per session

        return call

    times = bench.rounds({name: packer(name) for name in made}, args.rounds)
    bench.say(f"width {args.width}, {args.sessions} sessions per distribution, goal >= {GOAL:.0%}"
              " packed density (deterministic: the same every round)")  # fmt: skip
    worst = 1.0
    for name, r in found.items():
        worst = min(worst, r["packed"])
        bench.say(
            f"  {name:10s} chains {r['chains']:5d} tokens {r['tokens']:8d} rows packed/padded "
            f"{r['packed_rows']}/{r['padded_rows']}: packed {r['packed']:.1%}, padded "
            f"{r['padded']:.1%}, padded to the longest {r['padded_to_longest']:.1%}, "
            f"density ratio {r['ratio']:.1f}x"
        )
        bench.show(f"{name} pack, per session", times[name], 1e6, " us")
    verdict = "met" if worst >= GOAL else "not met"
    bench.say(f"lowest packed density {worst:.1%}: goal >= {GOAL:.0%} {verdict}")
    bench.finish({"args": vars(args), "densities": found, "goal": GOAL, "verdict": verdict})


if __name__ == "__main__":
    main()
