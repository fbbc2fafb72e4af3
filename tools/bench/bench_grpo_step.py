"""One GRPO step of Dew split into generation, rescoring and update, with the update's memory.

A small decoder (``--vocab``, ``--width``, ``--layers``) trains with ``GRPOObjective`` and
``SampledRollout`` through ``Trainer.fit``. The rollout records how long sampling, reward
scoring, packing and (with ``--rescore``) rescoring took; the update is the rest of each
step's wall time. By default the old log-probabilities are the ones the sampler recorded
(``SampledRollout``'s default), which is the work TRL does with one optimizer step per
generation batch (its ``old_per_token_logps`` is then the policy's own detached
log-probabilities, no extra forward); ``--rescore`` adds Dew's full forward pass over the
packed rows that recomputes them. Steps after the first (which
compiles) are averaged. The update's memory is XLA's own accounting of the compiled
loss-and-gradient program for the step's batch (arguments, outputs and temporaries), since
the CPU backend reports no live peak.

With ``--trl`` the same shape runs through TRL 1.16's ``GRPOTrainer`` on CPU in the reference
venv (``tools/bench/trl_grpo_step.py``, a worker that stays up: same Qwen3 dimensions, batch,
group size, budget, beta, top-k), as a contender in the same interleaved rounds
(tools/bench/_rounds.py), pinned to the same CPUs with the same thread count; a round's value
is the median of its ``--steps`` steps. Printed: median and spread of each phase and of both
steps, the ratio TRL / Dew step time with the per-round spread and the verdict (goal >= 3x),
and the ceiling: TRL's step time over the time the Dew step's matmul FLOPs take at the
``jnp.dot`` peak measured in the same rounds (the ratio a Dew step running at that peak would
reach; generation 2 x parameters x ids, the update 6 x for the policy and 2 x for the
reference, rescoring 2 x, attention left out).
TRL's memory is the process's peak resident set (both models, generation included), a coarser
number than XLA's program accounting. Record: tools/bench/results/grpo_step.json.

Usage: .venv/bin/python tools/bench/bench_grpo_step.py [--prompts 8] [--groups 4]
       [--prompt-len 32] [--new-tokens 32] [--rounds 3] [--steps 2] [--trl] [--rescore] [--cpus 0]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, Worker, add_arguments, jnp_dot_peak, reference_python  # noqa: E402
from _shapes import SHAPES  # noqa: E402

TINY = SHAPES["tiny"]  # num_heads, num_kv_heads and mlp_features (4 x width) are fixed below

GOAL = 3.0
PHASES = ("generation", "reward + pack", "rescoring", "update")


def reward(data_source: str, completion: str, ground_truth: str, extra_info: str) -> float:
    ids = completion.split()
    return sum(t == ground_truth for t in ids) / max(len(ids), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=TINY["vocab_size"])
    parser.add_argument("--width", type=int, default=TINY["hidden_size"])
    parser.add_argument("--layers", type=int, default=TINY["num_hidden_layers"])
    parser.add_argument("--steps", type=int, default=2, help="steps per contender a round")
    parser.add_argument("--trl", action="store_true", help="also run TRL's GRPOTrainer step")
    parser.add_argument("--rescore", action="store_true",
                        help="recompute old log-probs with a forward pass (TRL does not)")  # fmt: skip
    args = parser.parse_args()
    bench = Bench("grpo_step", args.cpus, args.threads)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import dew.models
    from dew.data import Dataset
    from dew.objectives.rl import GRPOObjective, SampledRollout
    from dew.sampling import Sampling
    from dew.trainer import Trainer

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
        "qwen3", vocab_size=args.vocab, emb_features=args.width, num_layers=args.layers,
        num_heads=4, num_kv_heads=2, mlp_features=4 * args.width, max_seq_len=p + r,
    )  # fmt: skip
    objective = GRPOObjective(model, seq_len=p + r - 1, beta=0.04)
    rollout = SampledRollout(objective, reward, groups=args.groups, max_new_tokens=r,
                             sampling=Sampling(temperature=1.0, top_k=50), rescore=args.rescore)  # fmt: skip
    marks: list[tuple[float, float, dict[str, float]]] = []

    def timed(variables, local, key):
        jax.block_until_ready(variables)  # the previous update ends here
        start = time.perf_counter()
        out = rollout(variables, local, key)
        marks.append((start, time.perf_counter(), dict(rollout.last_timings)))
        return out

    data = Dataset(train=lambda partition: itertools.repeat(batch), records=b, batch=b)
    trainer = Trainer(objective, optax.adamw(1e-4), key=jax.random.key(0), rollout=timed,
                      progress=False)  # fmt: skip
    state = [trainer.initial_state()]

    def dew_steps(count: int) -> dict[str, list[float]]:
        marks.clear()
        target = int(jax.device_get(state[0].step)) + count
        state[0] = trainer.fit(data, steps=target, state=state[0])
        jax.block_until_ready(state[0].params)
        end = time.perf_counter()
        out: dict[str, list[float]] = {k: [] for k in ("step", *PHASES)}
        for i, (start, done, t) in enumerate(marks):
            nxt = marks[i + 1][0] if i + 1 < len(marks) else end
            phases = {"generation": t["generation"], "reward + pack": t["reward"] + t["pack"],
                      "rescoring": t["rescoring"], "update": nxt - done}  # fmt: skip
            for k, v in phases.items():
                out[k].append(v)
            out["step"].append(nxt - start)
        return out

    start = time.perf_counter()
    dew_steps(1)  # compiles
    first_step = time.perf_counter() - start
    contenders: dict = {"dew": lambda: dew_steps(args.steps)}
    params = sum(int(np.size(x)) for x in jax.tree.leaves(state[0].params["params"]))
    forwards = 2 + 6 + 2 + (2 if args.rescore else 0)  # sampling, update, reference, rescoring
    step_flops = forwards * params * b * args.groups * (p + r)
    worker = None
    if args.trl:
        contenders["jnp.dot peak"] = jnp_dot_peak(step_flops)  # for the ceiling against TRL
        flags = []
        for name in ("prompts", "groups", "prompt_len", "new_tokens", "vocab", "width", "layers"):
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        script = str(Path(__file__).with_name("trl_grpo_step.py"))
        worker = Worker([reference_python(), script, *flags])
        rss: list[float] = []

        def trl_steps() -> list[float]:
            got = worker.ask(op="steps", steps=args.steps)
            rss.append(got["maxrss_mib"])
            return got["step_s"]

        contenders["trl"] = trl_steps
    try:
        times = bench.rounds(contenders, args.rounds)
    finally:
        if worker is not None:
            worker.close()
    n = b * args.groups
    bench.say(
        f"model: qwen3-shaped, vocab {args.vocab}, width {args.width}, {args.layers} layers; "
        f"{b} prompts x {args.groups} groups = {n} rows of {p + r} ids; {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s); {args.rounds} rounds x {args.steps} steps, "
        f"interleaved; first Dew step (compiles) {first_step:.1f} s"
    )
    total = statistics.median(times["dew step"])
    for name in PHASES:
        s = bench.show(f"dew {name}", times[f"dew {name}"])
        bench.say(f"  {'':28s} {s.median / total:6.1%} of the step")
    bench.show("dew step", times["dew step"])

    packed = rollout(state[0].params, batch, jax.random.key(1))
    device_batch = {k: jnp.asarray(v) for k, v in packed.items()}

    def update(params, reference):
        def loss(p):
            total_loss, weight, _ = objective.loss(p, device_batch, jax.random.key(0), reference)
            return total_loss / weight

        return jax.value_and_grad(loss)(params)

    compiled = jax.jit(update).lower(state[0].params, state[0].ema).compile()
    memory = compiled.memory_analysis()
    if memory is not None:
        mib = 1 / 2**20
        bench.say(
            f"update memory (XLA, per device): arguments {memory.argument_size_in_bytes * mib:.1f}"
            f" MiB, outputs {memory.output_size_in_bytes * mib:.1f} MiB, temporaries "
            f"{memory.temp_size_in_bytes * mib:.1f} MiB"
        )
    extra: dict = {"args": vars(args), "first_step_s": first_step}
    if worker is not None:
        bench.show(f"TRL 1.16 GRPOTrainer step ({worker.info['threads']} threads)", times["trl"])
        bench.say(f"  TRL peak RSS {max(rss):.0f} MiB (both models, generation included)")
        bench.compare("TRL / dew step time", times["trl"], times["dew step"], GOAL)
        bench.say(f"  dew step matmul FLOPs {step_flops / 1e9:.2f} G ({params} parameters)")
        bench.compare("ceiling: TRL / dew step at the jnp.dot peak", times["trl"],
                      times["jnp.dot peak"], GOAL)  # fmt: skip
        extra["trl"] = worker.info
    bench.finish(extra)


if __name__ == "__main__":
    main()
