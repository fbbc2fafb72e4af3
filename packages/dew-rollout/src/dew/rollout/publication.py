"""`Publication`: a weight push plus a version that moves only when the push worked.

`load(variables, v)` runs `push(variables, v)`, then `stamp(v)` (for example a recording
gateway's version stamp), and sets `version = v` only when both returned. The stamp
follows the push because a stamp labels calls as sampled from `v`: ahead of a replica
it would claim weights a call never saw, behind one it only overstates lag. Construction
stamps the launch version, so a stamp left by an earlier run never labels this one.

On a multi-process JAX trainer every process calls `load` with its shards of the same
tree. The tree is gathered to host memory on every process (each global array becomes
one numpy array), process 0 pushes and stamps, and the outcome is broadcast so every
process either moves its version or raises `PushFailed` together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dew.rollout.errors import PushFailed

Push = Callable[[Any, int], None]
Stamp = Callable[[int], None]


def gather_to_host(variables: Any) -> Any:
    """Every leaf as a full host numpy array; a collective when processes > 1, so every
    process must call it with the same tree structure."""
    if jax.process_count() == 1:
        return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), variables)
    from jax.experimental import multihost_utils

    def one(leaf: Any) -> np.ndarray:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(jax.device_get(leaf))

    return jax.tree.map(one, variables)


def agree(ok: bool) -> bool:
    """Process 0's `ok`, on every process (a collective when processes > 1)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    flag = multihost_utils.broadcast_one_to_all(np.asarray(1 if ok else 0, np.int32))
    return bool(int(flag) == 1)


class Publication:
    """A versioned publisher over `push` (a `SafetensorsReload`, an `NCCLPush`, an
    `AdapterReload` or any callable `(variables, version)`), with an optional
    `stamp(version)` run after it. A push with a `select(variables)` method gets only
    what it returns, and only that is gathered to the host (an adapter push leaves the
    frozen base on the devices).

    version: the launch version, stamped at construction.
    """

    def __init__(self, push: Push, *, version: int = 0, stamp: Stamp | None = None) -> None:
        if not callable(push):
            raise TypeError(f"push: expected a callable (variables, version), got {push!r}")
        if stamp is not None and not callable(stamp):
            raise TypeError(f"stamp: expected a callable (version) or None, got {stamp!r}")
        self.push = push
        self.stamp = stamp
        self._lock = threading.Lock()
        self._version = _check_version(version)
        if stamp is not None and jax.process_index() == 0:
            stamp(self._version)

    @property
    def version(self) -> int:
        return self._version

    @property
    def served_name(self) -> str | None:
        """The model name requests should send, when the push chooses it (an
        `AdapterReload` names each adapter version); None when the push has no say."""
        name = getattr(self.push, "served_name", None)
        return name if isinstance(name, str) and name else None

    def load(self, variables: Any, version: int) -> None:
        """Push `variables` as `version`; `version` moves only if the push and the stamp
        both succeed (on every process). Raises `PushFailed` otherwise."""
        version = _check_version(version)
        select = getattr(self.push, "select", None)
        if callable(select):  # the part the push sends (an adapter push: the adapter only)
            variables = select(variables)
        with self._lock:
            host = gather_to_host(variables)
            error: BaseException | None = None
            if jax.process_index() == 0:
                try:
                    self.push(host, version)
                    if self.stamp is not None:
                        self.stamp(version)
                except Exception as caught:  # noqa: BLE001 - reported to every process
                    error = caught
            if not agree(error is None):
                if isinstance(error, PushFailed):
                    raise error
                detail = (
                    {"process 0": error}
                    if error is not None
                    else {"process 0": RuntimeError("the push failed on process 0")}
                )
                raise PushFailed(version, detail) from error
            self._version = version


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int | np.integer):
        raise TypeError(f"version: expected an int, got {type(version).__name__}")
    return int(version)
