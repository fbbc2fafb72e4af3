"""Time and memory of a training step under each gradient-checkpointing policy
(``DecoderConfig.remat``, ``dew.models.remat``).

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_remat.py [--rounds 3] [--steps 3] [--cpus 0,1]

One random ``qwen3`` decoder (``--width`` 256, ``--layers`` 4, 4 heads, 2 KV heads, MLP 4x
width, vocabulary 4096) and one compiled step each policy: the next-token loss, its gradient
and an AdamW update (``jax.jit`` with donated parameters and optimizer state), on ``--batch``
rows of ``--seq-len`` tokens. Printed per policy:

* the step time, median and spread over interleaved rounds (a round's value is the median of
  ``--steps`` steps), and its ratio to ``none`` (the recomputation's cost);
* what XLA's compiled step reports (``memory_analysis``: temporary bytes, the peak the
  buffer assignment plans besides arguments and outputs);
* the bytes JAX keeps between the forward and the backward pass (the residual leaves of
  ``jax.vjp``, counted from shapes): what remat trades away, the same on every backend.

On CPU XLA schedules a layer's recomputation early, so the compiled temporary bytes shrink
far less than the residuals (on GPU and TPU the scheduler keeps to the saving). Record:
tools/bench/results/remat.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments  # noqa: E402

POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


def build(policy: str, args: argparse.Namespace):
    """``(step, state, batch, temp_bytes, residual_bytes)`` of one policy's compiled step."""
    import jax
    import jax.numpy as jnp
    import optax

    from dew import models

    model = models.build("qwen3", vocab_size=4096, emb_features=args.width, num_layers=args.layers,
                         num_heads=4, num_kv_heads=2, mlp_features=4 * args.width,
                         max_seq_len=args.seq_len, remat=policy)  # fmt: skip
    rows = jax.random.randint(jax.random.key(0), (args.batch, args.seq_len + 1), 0, 4096)
    params = jax.jit(model.init)(jax.random.key(1), rows[:, :-1])["params"]
    optimizer = optax.adamw(3e-4)

    def loss(params, rows):
        logits = model.apply({"params": params}, rows[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, rows[:, 1:, None], axis=-1).mean()

    def step(state, rows):
        params, opt = state
        value, grads = jax.value_and_grad(loss)(params, rows)
        updates, opt = optimizer.update(grads, opt, params)
        return (optax.apply_updates(params, updates), opt), value

    state = (params, optimizer.init(params))
    compiled = jax.jit(step, donate_argnums=0).lower(state, rows).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes

    def residuals(params, rows):
        _, backward = jax.vjp(lambda p: loss(p, rows), params)
        return jax.tree.leaves(backward)

    saved = sum(a.size * a.dtype.itemsize for a in jax.eval_shape(residuals, params, rows))
    return compiled, state, rows, temp, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per round and policy")
    parser.add_argument("--width", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per row")
    parser.add_argument("--batch", type=int, default=8, help="rows per step")
    args = parser.parse_args()
    bench = Bench("remat", cpus=args.cpus, threads=args.threads)
    import jax

    built = {}
    for policy in POLICIES:
        start = time.perf_counter()
        built[policy] = list(build(policy, args))
        bench.say(f"  {policy}: built and compiled in {time.perf_counter() - start:.1f} s")

    def contender(policy: str):
        def run() -> list[float]:
            compiled, state, rows = built[policy][:3]
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                state, value = compiled(state, rows)
                jax.block_until_ready(value)
                times.append(time.perf_counter() - start)
            built[policy][1] = state
            return times

        return run

    times = bench.rounds({p: contender(p) for p in POLICIES}, rounds=args.rounds)
    bench.say(f"qwen3 width {args.width}, {args.layers} layers, batch {args.batch} x "
              f"{args.seq_len} tokens, {jax.devices()[0].platform}")  # fmt: skip
    memory = {}
    for policy in POLICIES:
        temp, saved = built[policy][3:]
        memory[policy] = {"temp_bytes": temp, "residual_bytes": saved}
        bench.show(policy, times[policy], extra=f"temp {temp / 2**20:.1f} MiB, "
                   f"residuals {saved / 2**20:.1f} MiB")  # fmt: skip
    for policy in POLICIES[1:]:
        bench.compare(f"{policy} / none step time", times[policy], times["none"])
    steps = {p: statistics.median(times[p]) for p in POLICIES}
    bench.finish({"memory": memory, "median_step_s": steps, "shape": vars(args)})


if __name__ == "__main__":
    main()
