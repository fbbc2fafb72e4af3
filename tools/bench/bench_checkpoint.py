"""Benchmark Dew's checkpoints (format 2, orbax underneath) against its former format and bare orbax.

Run from the repository root with the workspace interpreter:

    .venv/bin/python tools/bench/bench_checkpoint.py [--params 100_000_000] [--rounds 3]

Three contenders, each in a fresh process per round (rounds interleave them), on 4 simulated
CPU devices with the state FSDP-sharded the way ``Trainer(fsdp=True)`` shards it: parameters
(float32) plus Adam's two moments, so a 100M-parameter state is about 1.2 GB, all random
values (constant arrays, which an earlier version of this bench used, compress to almost
nothing in orbax's store and flatter it).

- ``dew``: ``dew.trainer.checkpoint.save`` / ``latest`` + ``restore_into`` (format 2: orbax
  writes each shard, then every file is fsynced and SHA-256'd, and verified on restore);
- ``npz``: format 1, the one-file layout Dew wrote before (every leaf gathered to the host,
  one ``.npz`` built in memory and hashed; the writer is copied below, the reader is Dew's);
- ``orbax``: a bare ``orbax.checkpoint.CheckpointManager`` save and restore, no digests.

A round saves the state, then restores it onto the same shardings, and reports the wall time
of each and the process's peak resident memory during each phase above what it held when
the phase began (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` before each phase;
the restore's figure includes the restored copy of the state). orbax is imported before the
clock starts in every contender (Dew imports it on its first save, a few seconds once per
process). Rounds come from tools/bench/_rounds.py (order rotating each round, all contenders
pinned to the same CPUs). Printed per contender: median and min-max of each quantity over
the rounds, then for the times two ratios of medians with their per-round spread: npz / dew
(above 1: format 2 is faster than format 1) and dew / orbax (the cost of Dew's digests and
fsyncs over bare orbax). A JSON record goes to
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
import json, os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp, numpy as np, optax
from dew.mesh import data_mesh, state_shardings
from dew.trainer.state import TrainState
contender, directory, n_params = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = 4096
cols = n_params // rows // 8 * 8
def make():
    # random values everywhere: constant arrays would compress to nothing in orbax's store
    key = jax.random.key(1)
    params = {"layer_%d" % i: {"kernel": jax.random.normal(jax.random.fold_in(key, i),
                                                          (rows, cols // 4), jnp.float32)}
              for i in range(4)}
    opt = optax.adam(1e-3)
    leaves, treedef = jax.tree.flatten(opt.init(params))
    moments = [x + jax.random.normal(jax.random.fold_in(key, 100 + j), x.shape, x.dtype)
               if x.ndim == 2 else x for j, x in enumerate(leaves)]  # Adam's mu and nu after steps
    return TrainState(step=jnp.array(7, jnp.int32), updates=jnp.array(7, jnp.int32),
                      params=params, opt_state=jax.tree.unflatten(treedef, moments), ema=None,
                      rng=jax.random.key(0))
mesh = data_mesh(None)
abstract = jax.eval_shape(make)
shardings = state_shardings(abstract, mesh, True)
state = jax.jit(make, out_shardings=shardings)()
jax.block_until_ready(state)
def rss(field):  # VmRSS (now) or VmHWM (peak since the last reset), in bytes
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
def reset_peak():  # Linux: writing 5 to clear_refs resets VmHWM to the current RSS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
import orbax.checkpoint as ocp  # every contender: its import (seconds) is paid once per process
from dew.trainer import checkpoint as ckpt
if contender == "dew":
    def save():
        ckpt.save(directory, state, step=7, position=7, keep=1)
    def restore():
        return ckpt.restore_into(state, shardings, ckpt.latest(directory))
elif contender == "npz":
    import hashlib, io, uuid
    def save():  # Dew's former writer, as it was
        leaves = jax.tree_util.tree_leaves(state)
        host = [ckpt.to_host(x) for x in leaves]
        root = ckpt.checkpoint_dir(directory)
        os.makedirs(root, exist_ok=True)
        buf = io.BytesIO()
        np.savez(buf, **{f"leaf_{i:05d}": a for i, a in enumerate(host)})
        payload = buf.getvalue()
        meta = {"format": 1, "step": 7, "position": 7, "leaves": len(host),
                "dtypes": [str(a.dtype) for a in host], "shapes": [list(a.shape) for a in host],
                "keys": {str(i): str(jax.random.key_impl(x)) for i, x in enumerate(leaves)
                         if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)},
                "sha256": {"state.npz": hashlib.sha256(payload).hexdigest()}, "extra": {}}
        tmp = os.path.join(root, f".tmp-{uuid.uuid4().hex}")
        os.makedirs(tmp)
        for name, data in (("state.npz", payload), ("meta.json", json.dumps(meta).encode())):
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data); f.flush(); os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, "step_00000007"))
    def restore():
        return ckpt.restore_into(state, shardings, ckpt.latest(directory))
else:
    manager = ocp.CheckpointManager(os.path.join(directory, "orbax"),
                                    options=ocp.CheckpointManagerOptions(max_to_keep=1))
    def is_key(x):
        return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    def save():
        manager.save(7, args=ocp.args.StandardSave(jax.tree.map(
            lambda x: jax.random.key_data(x) if is_key(x) else x, state)))
        manager.wait_until_finished()
    def restore():
        target = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(
                jax.random.key_data(x).shape if is_key(x) else x.shape,
                jnp.uint32 if is_key(x) else x.dtype,
                sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
                if is_key(x) else s),
            state, shardings)
        return manager.restore(7, args=ocp.args.StandardRestore(target))
reset_peak()
base = rss("VmRSS")
t0 = time.perf_counter()
save()
save_s = time.perf_counter() - t0
save_extra = rss("VmHWM") - base
reset_peak()
base = rss("VmRSS")
t0 = time.perf_counter()
restored = restore()
jax.block_until_ready(restored)
restore_s = time.perf_counter() - t0
restore_extra = rss("VmHWM") - base  # includes the restored state itself
leaves = jax.tree_util.tree_leaves(state)
print(json.dumps({"save_s": save_s, "restore_s": restore_s,
                  "save_extra_bytes": save_extra, "restore_extra_bytes": restore_extra,
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

    names = ("dew", "npz", "orbax")
    times = bench.rounds({n: contender(n) for n in names}, args.rounds)
    bench.say(f"state: {info['state_bytes'] / 1e9:.2f} GB over {info['devices']} devices, "
              f"{args.rounds} rounds, each contender in a fresh process per round")  # fmt: skip
    for key in ("save_s", "restore_s"):
        for name in names:
            bench.show(f"{name} {key}", times[f"{name} {key}"], 1.0, " s", 2)
        bench.compare(f"{key} npz / dew (above 1: format 2 faster than format 1)",
                      times[f"npz {key}"], times[f"dew {key}"])  # fmt: skip
        bench.compare(f"{key} dew / orbax (Dew's digests and fsyncs over bare orbax)",
                      times[f"dew {key}"], times[f"orbax {key}"])  # fmt: skip
    for key in ("save_extra_bytes", "restore_extra_bytes"):  # near 0 for orbax: no ratios
        for name in names:
            bench.show(f"{name} {key}", times[f"{name} {key}"], 1e-9, " GB", 2)
    bench.finish({"params": args.params, "flags": {"xla_force_host_platform_device_count": 4},
                  **info})  # fmt: skip


if __name__ == "__main__":
    main()
