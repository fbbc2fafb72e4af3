"""load_pretrained holds about one host copy of a checkpoint at a time.

Each tensor's numpy array is dropped once its jax array is made, so host (numpy) memory
peaks near the file's bytes plus one tensor's transient copy; keeping every float32 array
until the end, as the loader once did, peaks at twice the file. The parameters come back as
jax arrays, with no numpy copy left behind.
"""

from __future__ import annotations

import tracemalloc

import jax
import numpy as np

from dew.models import Pretrained, build, load_pretrained


def test_loading_peaks_near_one_host_copy(tmp_path):
    model = build("qwen3", vocab_size=1024, emb_features=256, num_layers=6, num_heads=4,
                  num_kv_heads=2, mlp_features=1024)  # fmt: skip
    variables = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
    leaves = jax.tree.leaves(variables["params"])
    total = sum(x.nbytes for x in leaves)
    largest = max(x.nbytes for x in leaves)
    assert 10 * largest < total  # many tensors: one host copy and two differ clearly
    saved = Pretrained.from_model(model, variables).save(tmp_path / "m", dtype="float32")
    # A first load outside the measurement: the first jax arrays of a fresh process import
    # and set up modules (several MB of Python objects) that are not the loader's copies.
    load_pretrained(saved)
    tracemalloc.start()
    try:
        loaded = load_pretrained(saved)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < total + 2 * largest + 2_000_000, (peak, total, largest)  # the old: 2 x total
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded.variables))
    for a, b in zip(jax.tree.leaves(loaded.variables), jax.tree.leaves(variables), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
