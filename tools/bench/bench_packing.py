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

Usage: .venv/bin/python tools/bench/bench_packing.py [--sessions 2048] [--width 4096]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dew.objectives.rollouts import Call, Session, chain_lengths, pack, rows_needed

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
    parser.add_argument("--sessions", type=int, default=2048)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"width {args.width}, {args.sessions} sessions per distribution, goal >= {GOAL:.0%}")
    header = (
        f"{'distribution':12s} {'chains':>7s} {'tokens':>9s} {'rows packed/padded':>19s} "
        f"{'packed':>7s} {'padded':>7s} {'pad-to-max':>10s} {'ratio':>6s} {'sessions/s':>11s}"
    )
    print(header)
    worst = 1.0
    for name, make in (("lognormal", lognormal), ("pareto", pareto), ("agentic", agentic)):
        r = measure(name, make(rng, args.sessions, args.width), args.width)
        worst = min(worst, r["packed"])
        print(
            f"{r['name']:12s} {r['chains']:7d} {r['tokens']:9d} "
            f"{r['packed_rows']:8d}/{r['padded_rows']:<10d} {r['packed']:7.1%} {r['padded']:7.1%} "
            f"{r['padded_to_longest']:10.1%} {r['ratio']:5.1f}x {r['sessions_per_s']:11.0f}"
        )
    verdict = "meets" if worst >= GOAL else "misses"
    print(f"lowest packed density {worst:.1%}: {verdict} the {GOAL:.0%} goal")


if __name__ == "__main__":
    main()
