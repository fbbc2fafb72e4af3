"""`NativeRolloutServer`: Dew's continuous-batching `Server` behind the `RolloutServer`
interface, stepped by one background thread.

`cancel(future)` stops a pending draw between two rounds and frees its slot.

The thread runs `Server.step()` while requests are pending and sleeps on a condition
otherwise. `load(variables, version)` hands the tree to `Server.reload`, which takes the
server's lock, so the swap lands between two scheduling rounds: requests already decoding
keep their cache and continue on the new weights. Floating leaves are cast to the served
dtype on the way in (a float32 trainer tree can feed a bfloat16 server).

Each draw carries the raw-policy and the behavior log-probabilities the sampler recorded.
Its version is the smallest version among its tokens: the prefill's key/value cache stays
in use after a reload, so the weights that admitted the request shape every later token.

A base with a LoRA adapter is served as the `Server` serves it: unmerged, from a
`LoraDecoder` and `{"params": adapter, "base": base params}` (then `load` takes a new adapter
beside the same base: `load({"params": adapter, "base": base}, version)`), or merged into
plain weights; `dew.inference.adapter.with_adapter` builds either pair.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future
from typing import Any

import jax
import numpy as np

from dew.inference import Completion, Server
from dew.inference.canvas.config import refuse_canvas
from dew.rollout.draw import Draw, check_budget, check_prompt


def _served_device(variables: Any) -> Any:
    """The device the server's weights live on (the default device for host arrays)."""
    for leaf in jax.tree.leaves(variables):
        if isinstance(leaf, jax.Array) and len(leaf.devices()) == 1:
            return next(iter(leaf.devices()))
    return jax.local_devices()[0]


class ServerClosed(RuntimeError):
    """A request made to, or still pending in, a closed rollout server."""


class NativeRolloutServer:
    """Serve draws from a Dew `Server` on a background thread.

    server: a `dew.inference.Server` (for example `Server.from_task(task, slots=8,
    capacity=256)`). The server's own `version` is the starting version. Use it as a
    context manager or call `close()`, which fails every pending future with
    `ServerClosed` and joins the thread.
    """

    def __init__(self, server: Server) -> None:
        refuse_canvas("server", server, "NativeRolloutServer")
        if not isinstance(server, Server):
            raise TypeError(f"server: expected a dew.inference.Server, got {type(server).__name__}")
        self.server = server
        self._device = _served_device(server.variables)
        self._wake = threading.Condition()
        self._closed = False
        self._futures: dict[int, Future[Draw]] = {}
        self._requests: dict[int, int] = {}  # id(future) -> request id, while pending
        self._thread = threading.Thread(target=self._loop, name="dew-native-rollout", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return int(self.server.version)

    def submit(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        *,
        seed: int | None = None,
    ) -> Future[Draw]:
        """Queue one request; the future resolves to its `Draw`."""
        prompt = check_prompt(prompt_ids)
        budget = check_budget(max_new_tokens)
        future: Future[Draw] = Future()
        with self._wake:
            if self._closed:
                raise ServerClosed("submit: the rollout server is closed")
            request_id = self.server.submit(prompt, budget, seed=seed, callback=self._done)
            self._futures[request_id] = future
            self._requests[id(future)] = request_id
            self._wake.notify()
        return future

    def cancel(self, future: Future[Draw]) -> bool:
        """Stop the request behind `future` at the next round boundary (its slot frees and
        the future raises `CancelledError`); False when it already finished or is unknown."""
        with self._wake:
            request_id = self._requests.get(id(future))
            if request_id is None or self._futures.get(request_id) is not future:
                return False
            cancelled = self.server.cancel(request_id)
            self._wake.notify()
        return cancelled

    def load(self, variables: Any, version: int) -> None:
        """Serve `variables` as `version` from the next scheduling round on.

        Every leaf is first copied onto the served device: a trainer's tree may be sharded
        or replicated over a mesh of several devices (or processes, then gathered), while the
        server's compiled programs run on the one device its weights live on."""
        if isinstance(version, bool) or not isinstance(version, int | np.integer):
            raise TypeError(f"version: expected an int, got {type(version).__name__}")
        self.server.reload(jax.tree.map(self._place, variables), int(version))

    def _place(self, leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils

            leaf = np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return jax.device_put(leaf, self._device)

    def close(self) -> None:
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
        self._thread.join()
        with self._wake:
            pending, self._futures = self._futures, {}
            self._requests = {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ServerClosed("the rollout server closed before this draw"))

    def __enter__(self) -> NativeRolloutServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and not self.server.pending:
                    self._wake.wait()
                if self._closed:
                    return
            self.server.step()

    def _done(self, completion: Completion) -> None:
        with self._wake:
            future = self._futures.pop(completion.request_id, None)
            if future is not None:
                self._requests.pop(id(future), None)
        if future is None:
            return
        if completion.finish_reason == "error":
            error = completion.error or RuntimeError("the server failed this request")
            future.set_exception(error)
            return
        if completion.finish_reason == "cancelled":
            future.set_exception(CancelledError("the request was cancelled"))
            return
        versions = completion.versions
        version = int(versions.min()) if versions.size else int(completion.submitted_version)
        future.set_result(
            Draw(
                prompt_ids=completion.prompt_ids,
                ids=completion.ids,
                behavior_log_probs=completion.behavior_log_probs,
                raw_log_probs=completion.raw_log_probs,
                eos=completion.eos,
                version=version,
                support=completion.support,
            )
        )
