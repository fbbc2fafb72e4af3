"""What the HTTP rollout servers share: a thread pool that runs one blocking request per
draw, the version bookkeeping, and the hand-off of `load` to a weight publisher.

A remote draw's version is the publisher's version when the request was submitted. The
publishers pause an engine with in-flight requests finishing first (vLLM `mode=wait`,
SGLang's own wait), so a request already running finishes on the weights it started with,
and one that arrives during a push is held and served by the new weights: the version
taken at submit is then the oldest weights that can have produced any of its tokens.
An adapter push (`AdapterReload`) pauses nothing: a request names the served adapter when
it is posted (`served_model`), so all its tokens come from that one adapter, the one of
its version or a newer one.
"""

from __future__ import annotations

import base64
import io
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import httpx
import numpy as np

from dew.rollout.draw import Draw, check_budget, check_prompt
from dew.rollout.errors import EngineHTTPError, MalformedResponse
from dew.rollout.http import post_json


class Weights(Protocol):
    """A versioned weight publisher, such as `Publication`."""

    @property
    def version(self) -> int: ...

    def load(self, variables: Any, version: int) -> None: ...


class NoPublisher(RuntimeError):
    """`load` on a rollout server built without a weight publisher."""


class RemoteServer:
    """Base of the HTTP rollout servers: subclasses implement `_draw`."""

    def __init__(self, weights: Weights | None, *, concurrency: int = 64, seed: int = 0) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency: expected a positive int, got {concurrency!r}")
        self.weights = weights
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="dew-rollout-http")
        self._seeds = itertools.count(seed)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def version(self) -> int:
        return 0 if self.weights is None else int(self.weights.version)

    def submit(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        *,
        seed: int | None = None,
    ) -> Future[Draw]:
        """Post one request from a worker thread; the future holds its `Draw` or the named
        error (`EngineTimeout`, `EngineHTTPError`, `MalformedResponse`, ...)."""
        prompt = check_prompt(prompt_ids)
        budget = check_budget(max_new_tokens)
        with self._lock:
            if self._closed:
                raise RuntimeError("submit: the rollout server is closed")
            version = self.version
            request_seed = next(self._seeds) if seed is None else int(seed)
            return self._pool.submit(self._draw, prompt, budget, request_seed, version)

    def served_model(self, default: str | None) -> str | None:
        """The name a request sends as `model`: the publisher's `served_name` when it has
        one (an `AdapterReload` switches it at each push), else `default`."""
        name = getattr(self.weights, "served_name", None)
        return name if isinstance(name, str) and name else default

    def post_model(self, client: httpx.Client, url: str, body: dict[str, Any]) -> Any:
        """POST `body` (whose `model` is `served_model`'s) and decode the answer; when the
        engine answers 404 and the served name moved meanwhile (a push retired the name
        this request read just before it switched), post once more under the new name."""
        try:
            return post_json(client, url, body)
        except EngineHTTPError as error:
            name = self.served_model(None)
            if error.status != 404 or name is None or name == body.get("model"):
                raise
            return post_json(client, url, {**body, "model": name})

    def load(self, variables: Any, version: int) -> None:
        """Publish `variables` as `version` through the weight publisher."""
        if self.weights is None:
            raise NoPublisher("load: this rollout server was built with weights=None")
        self.weights.load(variables, version)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    _draw: Callable[[np.ndarray, int, int, int], Draw]


def decode_npy(text: Any, url: str, name: str) -> np.ndarray:
    """A base64 `.npy` payload (vLLM's `routed_experts`) as an array, refused by name."""
    if not isinstance(text, str):
        raise MalformedResponse(
            f"{name}: expected base64 .npy text, got {type(text).__name__}", url
        )
    try:
        return np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)
    except (ValueError, OSError) as error:
        raise MalformedResponse(f"{name}: not a base64 .npy array ({error})", url) from error


def choice_ending(
    choice: Any, ids: np.ndarray, eos_ids: Sequence[int], routing: bool, url: str
) -> tuple[bool, np.ndarray | None]:
    """A completion choice's end and routing: EOS when it stopped (``finish_reason`` "stop")
    on an id of ``eos_ids``, and its decoded ``routed_experts`` when ``routing`` is on."""
    finish = choice.get("finish_reason")
    eos = finish == "stop" and int(ids[-1]) in eos_ids
    routed = decode_npy(choice.get("routed_experts"), url, "routed_experts") if routing else None
    return bool(eos), routed


def float_list(values: Any, url: str, name: str, n: int) -> np.ndarray:
    """`values` as float32 `[n]`, refusing a wrong length, a null or a non-number by name."""
    if not isinstance(values, list) or len(values) != n:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise MalformedResponse(f"{name}: expected {n} log-probabilities, got {got}", url)
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise MalformedResponse(f"{name}: expected numbers, got {values!r:.200}", url)
    return np.asarray(values, np.float32)


def int_list(values: Any, url: str, name: str) -> np.ndarray:
    """`values` as int32 `[n]`, refusing anything but a list of non-negative ints."""
    if not isinstance(values, list) or any(
        isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values
    ):
        raise MalformedResponse(f"{name}: expected a list of token ids, got {values!r:.200}", url)
    return np.asarray(values, np.int32)
