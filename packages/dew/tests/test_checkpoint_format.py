"""The checkpoint format (orbax, format 2): what a step directory holds, what a reader skips
and why, resharding on restore, and resuming from a format-1 (``state.npz``) checkpoint."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from dew.data import Dataset
from dew.mesh import data_mesh
from dew.objectives.lm import LMObjective
from dew.testing import tiny_decoder
from dew.trainer import Trainer
from dew.trainer import checkpoint as ckpt

MESH = data_mesh()
SPLIT = NamedSharding(MESH, PartitionSpec("data"))
REPL = NamedSharding(MESH, PartitionSpec())


def small_state(seed: int) -> dict:
    """A pytree like a TrainState's: a sharded float matrix, an int counter, a PRNG key."""
    rng = np.random.default_rng(seed)
    w = jax.device_put(rng.standard_normal((8, 3)).astype(np.float32), SPLIT)
    return {"w": w, "n": jax.device_put(jnp.int32(seed), REPL), "rng": jax.random.key(seed)}


def shardings(split: bool) -> dict:
    return {"w": SPLIT if split else REPL, "n": REPL, "rng": REPL}


def test_a_step_directory_holds_orbax_state_and_a_manifest_of_every_file(tmp_path):
    state = small_state(1)
    path = ckpt.save(tmp_path, state, step=5, position=7, extra={"updates": 4})
    assert path == str(tmp_path.resolve() / "checkpoints" / "step_00000005")
    meta = json.loads(open(os.path.join(path, "meta.json")).read())
    assert (meta["format"], meta["step"], meta["position"], meta["leaves"]) == (2, 5, 7, 3)
    assert meta["extra"] == {"updates": 4} and meta["keys"] == {"1": "threefry2x32"}
    on_disk = sorted(
        os.path.relpath(os.path.join(d, f), path).replace(os.sep, "/")
        for d, _, fs in os.walk(os.path.join(path, "state"))
        for f in fs
    )
    assert sorted(meta["sha256"]) == on_disk and len(on_disk) > 3
    for name, digest in meta["sha256"].items():
        assert hashlib.sha256(open(os.path.join(path, name), "rb").read()).hexdigest() == digest
    restored = ckpt.latest(tmp_path)
    assert restored is not None and (restored.step, restored.position) == (5, 7)


def test_restore_is_bit_exact_onto_another_sharding(tmp_path):
    state = small_state(2)
    ckpt.save(tmp_path, state, step=1, position=1)
    back = ckpt.restore_into(state, shardings(False), ckpt.latest(tmp_path))
    assert back["w"].sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(back["w"]), np.asarray(state["w"]))
    assert int(back["n"]) == 2
    assert jax.dtypes.issubdtype(back["rng"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(
        jax.random.key_data(back["rng"]), jax.random.key_data(state["rng"])
    )


def test_a_leftover_partial_save_is_ignored_and_cleared(tmp_path):
    ckpt.save(tmp_path, small_state(3), step=1, position=1)
    partial = tmp_path / "checkpoints" / ".tmp-step_00000002"
    (partial / "state").mkdir(parents=True)  # a save killed before its rename
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]
    assert ckpt.latest(tmp_path).step == 1
    ckpt.save(tmp_path, small_state(4), step=2, position=2, keep=1)
    assert not partial.exists()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2]


def test_missing_files_unknown_format_and_wrong_leaf_count_are_skipped(tmp_path):
    for step in (1, 2, 3, 4):
        ckpt.save(tmp_path, small_state(step), step=step, position=step, keep=4)
    root = tmp_path / "checkpoints"
    meta4 = root / "step_00000004" / "meta.json"
    meta4.write_text(json.dumps({**json.loads(meta4.read_text()), "format": 9}))
    meta3 = json.loads((root / "step_00000003" / "meta.json").read_text())
    gone = sorted(meta3["sha256"])[-1]
    os.remove(root / "step_00000003" / gone)
    with pytest.warns(RuntimeWarning) as caught:
        assert ckpt.latest(tmp_path).step == 2
    text = [str(w.message) for w in caught]
    assert "step_00000004: meta.json: format 9, expected 2 (or 1, read only)" in text[0]
    assert f"step_00000003: checksum mismatch or missing file: {gone}" in text[1]
    with pytest.warns(RuntimeWarning) as caught:
        assert ckpt.latest(tmp_path, expected_leaves=4) is None
    assert "step_00000002: holds 3 leaves, the train state has 4" in str(caught[2].message)


def test_a_leaf_of_another_shape_or_dtype_is_named(tmp_path):
    state = small_state(5)
    ckpt.save(tmp_path, state, step=1, position=1)
    restored = ckpt.latest(tmp_path)
    wider = {**state, "w": jnp.zeros((8, 4), jnp.float32)}
    with pytest.raises(ValueError, match=r"leaf 2 has shape \(8, 3\), state expects \(8, 4\)"):
        ckpt.restore_into(wider, shardings(True), restored)
    halved = {**state, "w": jnp.zeros((8, 3), jnp.bfloat16)}
    with pytest.raises(ValueError, match="leaf 2 has dtype float32, state expects bfloat16"):
        ckpt.restore_into(halved, shardings(True), restored)


# ----------------------------------------------------------------------------- format 1


def write_format_1(run_dir, state, step: int, position: int) -> str:
    """A checkpoint the way Dew wrote them before orbax: one state.npz and its SHA-256."""
    leaves = jax.tree_util.tree_leaves(state)
    host = [ckpt.to_host(x) for x in leaves]
    buf = io.BytesIO()
    np.savez(buf, **{f"leaf_{i:05d}": a for i, a in enumerate(host)})
    payload = buf.getvalue()
    keys = {str(i): str(jax.random.key_impl(x)) for i, x in enumerate(leaves) if ckpt._is_key(x)}
    meta = {"format": 1, "step": step, "position": position, "leaves": len(host),
            "dtypes": [str(a.dtype) for a in host], "shapes": [list(a.shape) for a in host],
            "keys": keys, "sha256": {"state.npz": hashlib.sha256(payload).hexdigest()},
            "extra": {}}  # fmt: skip
    path = os.path.join(ckpt.checkpoint_dir(run_dir), f"step_{step:08d}")
    os.makedirs(path)
    open(os.path.join(path, "state.npz"), "wb").write(payload)
    open(os.path.join(path, "meta.json"), "w").write(json.dumps(meta))
    return path


def batches():
    def train(partition, start=0):
        for i in itertools.count(start):
            rng = np.random.default_rng(i)
            yield {"text": rng.integers(1, 32, size=(8, 9)).astype(np.int32)}

    return Dataset(train=train, batch=8)


def test_a_format_1_run_resumes_bit_identically_and_moves_to_format_2(tmp_path):
    objective = LMObjective(tiny_decoder(32, 9), 8, ema_decay=0.9)

    trainer = Trainer(
        objective, optax.adamw(1e-2), key=jax.random.key(3), fsdp=True, progress=False
    )  # one trainer for the three runs: its step compiles once
    full = trainer.fit(batches(), steps=4)
    write_format_1(tmp_path, trainer.fit(batches(), steps=2), step=2, position=2)
    resumed = trainer.fit(batches(), steps=4, run_dir=tmp_path)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(ckpt.to_host(a), ckpt.to_host(b))
    newest = ckpt.latest(tmp_path)
    assert newest.step == 4 and newest.meta["format"] == 2
    # a format-1 file that no longer matches its digest is skipped like any other
    (tmp_path / "checkpoints" / "step_00000004" / "meta.json").unlink()
    npz = tmp_path / "checkpoints" / "step_00000002" / "state.npz"
    npz.write_bytes(npz.read_bytes()[:-10])
    with pytest.warns(RuntimeWarning) as caught:
        assert ckpt.latest(tmp_path) is None
    assert "step_00000002: state.npz checksum" in str(caught[-1].message)
