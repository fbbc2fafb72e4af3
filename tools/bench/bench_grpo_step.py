"""One GRPO step of Dew split into generation, rescoring and update, with the update's memory.

A small decoder (``--vocab``, ``--width``, ``--layers``) trains with ``GRPOObjective`` and
``SampledRollout(rescore=True)`` through ``Trainer.fit``. The rollout records how long
sampling, reward scoring, packing and rescoring (a full forward pass over the packed rows)
took; the update is the rest of each step's wall time. Steps after the first (which
compiles) are averaged. The update's memory is XLA's own accounting of the compiled
loss-and-gradient program for the step's batch (arguments, outputs and temporaries), since
the CPU backend reports no live peak.

With ``--trl`` the same shape runs through TRL 1.16's ``GRPOTrainer`` on CPU in the reference
venv (``tools/bench/trl_grpo_step.py``: same Qwen3 dimensions, batch, group size, budget,
beta, top-k) and the two step times are printed side by side with their ratio (medians of the
steps after the first). TRL's memory is the process's peak resident set during training
(both models, generation included), a coarser number than XLA's program accounting.

Usage: .venv/bin/python tools/bench/bench_grpo_step.py [--prompts 8] [--groups 4]
       [--prompt-len 32] [--new-tokens 32] [--steps 6] [--trl]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import dew.models
from dew.data import Dataset
from dew.objectives.rl import GRPOObjective, SampledRollout
from dew.sampling import Sampling
from dew.trainer import Trainer


def reward(data_source: str, completion: str, ground_truth: str, extra_info: str) -> float:
    ids = completion.split()
    return sum(t == ground_truth for t in ids) / max(len(ids), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--trl", action="store_true", help="also run TRL's GRPOTrainer step")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    p, r, b = args.prompt_len, args.new_tokens, args.prompts
    lengths = rng.integers(p // 2, p + 1, b).astype(np.int32)
    prompt = np.zeros((b, p), np.int32)
    for i, n in enumerate(lengths):
        prompt[i, p - n :] = rng.integers(1, args.vocab, n)
    batch = {
        "prompt": prompt,
        "prompt_length": lengths,
        "ground_truth": np.tile(np.frombuffer(b"7", np.uint8).astype(np.int32), (b, 1)),
    }
    model = dew.models.build(
        "qwen3",
        vocab_size=args.vocab,
        emb_features=args.width,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        mlp_features=4 * args.width,
        max_seq_len=p + r,
    )
    objective = GRPOObjective(model, seq_len=p + r - 1, beta=0.04)
    rollout = SampledRollout(
        objective,
        reward,
        groups=args.groups,
        max_new_tokens=r,
        sampling=Sampling(temperature=1.0, top_k=50),
        rescore=True,
    )
    timings: list[dict[str, float]] = []
    marks: list[float] = []

    starts: list[float] = []

    def timed(variables, local, key):
        starts.append(time.perf_counter())
        out = rollout(variables, local, key)
        timings.append(dict(rollout.last_timings))
        marks.append(time.perf_counter())
        return out

    data = Dataset(train=lambda partition: itertools.repeat(batch), records=b, batch=b)
    trainer = Trainer(
        objective, optax.adamw(1e-4), key=jax.random.key(0), rollout=timed, progress=False
    )
    t0 = time.perf_counter()
    state = trainer.fit(data, steps=args.steps)
    jax.block_until_ready(state.params)
    end = time.perf_counter()
    # update time of step i: from the end of its rollout to the start of the next rollout
    updates = [starts[i + 1] - marks[i] for i in range(len(starts) - 1)] + [end - marks[-1]]
    steady = slice(1, None)
    gen = np.median([t["generation"] for t in timings[steady]])
    rew = np.median([t["reward"] + t["pack"] for t in timings[steady]])
    res = np.median([t["rescoring"] for t in timings[steady]])
    upd = np.median(updates[steady])
    total = gen + rew + res + upd
    n = b * args.groups
    print(
        f"model: qwen3-shaped, vocab {args.vocab}, width {args.width}, {args.layers} layers; "
        f"{b} prompts x {args.groups} groups = {n} rows of {p + r} ids; {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s)"
    )
    print(f"steps {args.steps} (first one compiles; medians of the rest), fit {end - t0:.1f} s")
    for name, value in (
        ("generation", gen),
        ("reward + pack", rew),
        ("rescoring", res),
        ("update", upd),
    ):
        print(f"  {name:14s} {value * 1e3:9.1f} ms  {value / total:6.1%}")

    packed = rollout(state.params, batch, jax.random.key(1))
    device_batch = {k: jnp.asarray(v) for k, v in packed.items()}

    def update(params, reference):
        def loss(p):
            total_loss, weight, _ = objective.loss(p, device_batch, jax.random.key(0), reference)
            return total_loss / weight

        return jax.value_and_grad(loss)(params)

    dew_steps = [t["generation"] + t["reward"] + t["pack"] + t["rescoring"] for t in timings]
    dew_steps = [a + u for a, u in zip(dew_steps, updates)]
    compiled = jax.jit(update).lower(state.params, state.ema).compile()
    memory = compiled.memory_analysis()
    if memory is None:
        print("update memory: not reported by this backend")
    else:
        mib = 1 / 2**20
        print(
            f"update memory (XLA, per device): arguments {memory.argument_size_in_bytes * mib:.1f}"
            f" MiB, outputs {memory.output_size_in_bytes * mib:.1f} MiB, temporaries "
            f"{memory.temp_size_in_bytes * mib:.1f} MiB"
        )
    if args.trl:
        run_trl(args, float(np.median(dew_steps[1:])))


def run_trl(args: argparse.Namespace, dew_step: float) -> None:
    """Run TRL's step in the reference venv and print it beside Dew's."""
    root = Path(__file__).resolve().parents[2]
    python = subprocess.run(
        [str(root / "tools" / "reference_env.sh")], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    flags = []
    for name in (
        "prompts",
        "groups",
        "prompt_len",
        "new_tokens",
        "vocab",
        "width",
        "layers",
        "steps",
    ):
        flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(
        [python, str(root / "tools" / "bench" / "trl_grpo_step.py"), *flags],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        print("TRL GRPOTrainer: failed\n" + done.stderr[-2000:])
        return
    result = json.loads(done.stdout.strip().splitlines()[-1])
    trl_step = float(np.median(result["step_s"][1:]))
    print(
        f"TRL 1.16 GRPOTrainer (torch {result['torch']}, {result['threads']} threads): step "
        f"{trl_step * 1e3:.0f} ms, peak RSS {result['maxrss_mib_after']:.0f} MiB "
        f"({result['maxrss_mib_after'] - result['maxrss_mib_before']:+.0f} MiB during training)"
    )
    print(f"Dew step {dew_step * 1e3:.0f} ms; TRL / Dew step time: {trl_step / dew_step:.1f}x")


if __name__ == "__main__":
    main()
