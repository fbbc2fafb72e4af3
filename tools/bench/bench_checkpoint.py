"""Benchmark Dew's checkpoint format against orbax-checkpoint on a 100M-parameter train state.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_checkpoint.py [--params 100_000_000] [--rounds 3]

Each contender runs in a fresh process per round (rounds interleave the contenders), on 4
simulated CPU devices with the state FSDP-sharded the way ``Trainer(fsdp=True)`` shards it:
parameters (float32) plus Adam's two moments, so a 100M-parameter state is about 1.2 GB. A
round saves the state, then restores it onto the same shardings, and reports the wall time
of each and the process's peak resident memory above what it held before saving (Linux
``ru_maxrss``). Rounds come from tools/bench/_rounds.py (order rotating each round, both
contenders pinned to the same CPUs). Printed per contender: median and min-max of each
quantity over the rounds, then the ratio of medians orbax / dew (above 1: Dew faster or
lighter) with its per-round spread. A JSON record goes to
``tools/bench/results/checkpoint.json`` (CPU model and flags, core count, load average before
and after). This machine is shared by several agents running tests at the same time: times
carry that noise; read the spread before the ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import Bench, add_arguments  # noqa: E402

WORKER = r"""
import json, os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np, optax
from dew.trainer.mesh import data_mesh, state_shardings
from dew.trainer.state import TrainState
contender, directory, n_params = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = 4096
cols = n_params // rows // 8 * 8
def make():
    params = {"layer_%d" % i: {"kernel": jnp.full((rows, cols // 4), i + 1.0, jnp.float32)}
              for i in range(4)}
    opt = optax.adam(1e-3)
    return TrainState(step=jnp.array(7, jnp.int32), updates=jnp.array(7, jnp.int32),
                      params=params, opt_state=opt.init(params), ema=None,
                      rng=jax.random.key(0))
mesh = data_mesh(None)
abstract = jax.eval_shape(make)
shardings = state_shardings(abstract, mesh, True)
state = jax.jit(make, out_shardings=shardings)()
jax.block_until_ready(state)
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = peak()
if contender == "dew":
    from dew.trainer import checkpoint as ckpt
    t0 = time.perf_counter()
    ckpt.save(directory, state, step=7, position=7, keep=1)
    save_s = time.perf_counter() - t0
    save_peak = peak()
    t0 = time.perf_counter()
    restored = ckpt.restore_into(state, shardings, ckpt.latest(directory))
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - t0
else:
    import orbax.checkpoint as ocp
    manager = ocp.CheckpointManager(os.path.join(directory, "orbax"),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=1))
    t0 = time.perf_counter()
    manager.save(7, args=ocp.args.StandardSave(jax.tree.map(
        lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, state)))
    manager.wait_until_finished()
    save_s = time.perf_counter() - t0
    save_peak = peak()
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(jax.random.key_data(x).shape if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x.shape,
                                          jnp.uint32 if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x.dtype,
                                          sharding=s if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),
        state, shardings)
    t0 = time.perf_counter()
    restored = manager.restore(7, args=ocp.args.StandardRestore(target))
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - t0
    manager.close()
leaves = jax.tree_util.tree_leaves(state)
print(json.dumps({"save_s": save_s, "restore_s": restore_s,
                  "save_extra_bytes": save_peak - base, "total_extra_bytes": peak() - base,
                  "state_bytes": sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves
                                     if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)),
                  "devices": len(jax.devices())}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, rounds=3)
    parser.add_argument("--params", type=int, default=100_000_000)
    args = parser.parse_args()
    bench = Bench("checkpoint", args.cpus, args.threads)
    info: dict = {}

    def contender(name: str):
        def call() -> dict[str, float]:
            with tempfile.TemporaryDirectory() as d:
                out = subprocess.run([sys.executable, "-c", WORKER, name, d, str(args.params)],
                                     capture_output=True, text=True, check=False)  # fmt: skip
            if out.returncode:
                sys.exit(f"{name}: failed\n{out.stderr[-3000:]}")
            record = json.loads(out.stdout.strip().splitlines()[-1])
            info.update(state_bytes=record.pop("state_bytes"), devices=record.pop("devices"))
            return record

        return call

    times = bench.rounds({"dew": contender("dew"), "orbax": contender("orbax")}, args.rounds)
    bench.say(f"state: {info['state_bytes'] / 1e9:.2f} GB over {info['devices']} devices, "
              f"{args.rounds} rounds, each contender in a fresh process per round")  # fmt: skip
    for key in ("save_s", "restore_s", "save_extra_bytes", "total_extra_bytes"):
        scale, unit = (1e-9, " GB") if "bytes" in key else (1.0, " s")
        for name in ("dew", "orbax"):
            bench.show(f"{name} {key}", times[f"{name} {key}"], scale, unit, 2)
        bench.compare(f"{key} orbax / dew (above 1: dew faster or lighter)",
                      times[f"orbax {key}"], times[f"dew {key}"])  # fmt: skip
    bench.finish({"params": args.params, "flags": {"xla_force_host_platform_device_count": 4},
                  **info})  # fmt: skip


if __name__ == "__main__":
    main()
