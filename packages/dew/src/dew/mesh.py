"""Device meshes and shardings for data-parallel (and FSDP-style) training.

The Trainer uses a one-axis mesh named ``"data"`` over every device of every process (in
``jax.devices()`` order, which keeps each process's devices contiguous). Batches are split
along their first axis over ``"data"``. Parameters and optimizer state are either replicated
or, with ``fsdp=True``, each leaf is split along its largest axis that the mesh size divides
(leaves with no such axis, such as scalars, stay replicated); XLA then gathers the shards
where a computation needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"


def data_mesh(devices: list[jax.Device] | None = None) -> Mesh:
    """A one-axis ``"data"`` mesh over ``devices`` (default: all devices of all processes)."""
    return Mesh(np.array(devices if devices is not None else jax.devices()), (AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows (axis 0) split over the ``"data"`` axis."""
    return NamedSharding(mesh, PartitionSpec(AXIS))


def fsdp_spec(shape: tuple[int, ...], size: int) -> PartitionSpec:
    """Split the largest axis of ``shape`` divisible by ``size``; replicate if none is."""
    best = None
    for axis, dim in enumerate(shape):
        if dim >= size and dim % size == 0 and (best is None or dim > shape[best]):
            best = axis
    if best is None or size == 1:
        return PartitionSpec()
    return PartitionSpec(*([None] * best + [AXIS]))


def state_shardings(abstract: Any, mesh: Mesh, fsdp: bool) -> Any:
    """A sharding for every leaf of ``abstract`` (a tree of ``ShapeDtypeStruct``)."""

    def one(leaf: Any) -> NamedSharding:
        if not fsdp or jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return replicated(mesh)
        return NamedSharding(mesh, fsdp_spec(tuple(leaf.shape), mesh.size))

    return jax.tree.map(one, abstract)


def global_batch(local: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Assemble each process's rows into global arrays sharded over ``"data"``.

    ``local[name]`` is ``[b, ...]`` on every process; the global array is ``[b * P, ...]`` with
    process ``p``'s rows at ``p * b``, split over the devices. A single process whose row count
    does not divide by the number of devices gets its batch replicated on every device (correct,
    but without data parallelism); several processes must give divisible row counts. Scalars
    (0-d values) are replicated.
    """
    sharding = batch_sharding(mesh)
    out = {}
    for name, value in local.items():
        arr = np.asarray(value)
        if arr.ndim == 0:
            out[name] = jax.device_put(arr, replicated(mesh))
            continue
        rows = arr.shape[0] * jax.process_count()
        if rows % mesh.size:
            if jax.process_count() == 1:
                out[name] = jax.device_put(arr, replicated(mesh))
                continue
            raise ValueError(
                f"batch[{name!r}]: {rows} global rows do not split over {mesh.size} devices"
            )
        out[name] = jax.make_array_from_process_local_data(sharding, arr)
    return out
