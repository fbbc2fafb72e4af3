"""`Server`: continuous batching of generation requests over fixed cache slots.

The server owns a key/value cache of `slots` rows and `capacity` positions,
kept on the device between calls (its buffers are donated to each program).
`step()` runs one scheduling round:

1. waiting requests take free slots; their prompts are prefilled together
   (left-padded to a bucketed width, each row's real tokens packed into its
   slot) and their first token is sampled;
2. every live slot decodes up to `steps_per_call` tokens inside one compiled
   loop (rows that end stop writing their cache; the loop exits early when
   all rows have ended);
3. requests that ended (EOS, budget, cancel, error) leave and free their slot.

Requests therefore join and leave between decode steps. `reload(variables)`
swaps the weights between two rounds, casting floating leaves to the served
dtype (and rebuilding the fused serving layout of `dew.models.serving`), and
bumps the weights version; each finished `Completion` lists the
version that produced each of its tokens. Every request draws from its own
key, folded with its token index, so what it samples does not depend on which
other requests share the batch.

A request whose prompt plus budget exceeds `capacity` is refused at submit
with `RequestTooLarge`. A callback that raises is logged and does not stop
the others. If a compiled program raises, every request it was
serving finishes with the error and its slot is freed; the cache is rebuilt.
The server is thread-safe: `submit`, `cancel` and `reload` may be called from
other threads while one thread drives `step`.

A `dew.models.lora.LoraDecoder` with variables `{"params": adapter, "base": base params}`
is served with the adapter applied on the fly (the weights kept in the training layout);
`reload` then takes a new adapter beside the same base. `dew.inference.adapter.with_adapter`
builds that pair, or the merged one, from a base and an adapter.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.inference._served_weights import served_variables
from dew.inference.compiled import CompileStats, ProgramCache, bucket
from dew.inference.generation import as_key, check_context, tree_signature, variables_of
from dew.inference.requests import Completion, Request, RequestTooLarge
from dew.inference.slot_programs import admit_program, decode_program
from dew.models.config import dtype_name
from dew.models.decoder import CausalTransformer, empty_cache
from dew.models.lora import LoraDecoder
from dew.sampling import Sampling

_LOG = logging.getLogger(__name__)


def _derive_key_data(seed: Any, request_id: Any, fold: bool) -> jax.Array:
    """Raw key data of ``key(seed)``, folded with ``request_id`` when ``fold``."""
    base = jax.random.key(seed)
    return jax.random.key_data(jax.random.fold_in(base, request_id) if fold else base)


_compiled_key_data = jax.jit(_derive_key_data, static_argnums=2)


def _key_data_for(seed: int, request_id: int, fold: bool) -> np.ndarray:
    """uint32 key data of a request drawing from ``seed`` (folded with its id when ``fold``):
    one compiled call instead of a few dispatched operations when both fit in int32."""
    fits = 0 <= seed < 2**31 and 0 <= request_id < 2**31
    derive = _compiled_key_data if fits else _derive_key_data
    return np.asarray(derive(seed, request_id, fold), np.uint32)


class Server(CompileStats):
    """Continuous-batching generation over `slots` cache rows of `capacity` positions.

    model, variables: the decoder and its weights. sampling: one `Sampling`
    for every request. dtype: served compute dtype (default: the model's);
    floating weights are cast to it. steps_per_call: decode steps per compiled
    call between scheduling rounds. min_bucket: smallest padded prompt width.
    min_window: smallest attention window of a decode program; decode attends
    over the first `window` cache slots (a power of two covering the longest
    live row, or the capacity), so a large capacity costs nothing until used.
    version: the weights version of `variables`.
    """

    def __init__(
        self,
        model: CausalTransformer,
        variables: Any,
        *,
        slots: int = 8,
        capacity: int = 256,
        sampling: Sampling | None = None,
        dtype: Any = None,
        steps_per_call: int = 8,
        min_bucket: int = 16,
        min_window: int = 128,
        version: int = 0,
        seed: int = 0,
    ) -> None:
        if not isinstance(model, CausalTransformer):
            raise TypeError(f"model: expected a CausalTransformer, got {type(model).__name__}")
        for name, value in (
            ("slots", slots),
            ("capacity", capacity),
            ("steps_per_call", steps_per_call),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if capacity > model.config.max_seq_len:
            raise ValueError(
                f"capacity: {capacity} exceeds the model's max_seq_len={model.config.max_seq_len}"
            )
        served = dtype_name(dtype) if dtype is not None else model.config.dtype
        config = model.config.replace(dtype=served)
        self._lora = model.lora if isinstance(model, LoraDecoder) else None
        self.model = (
            CausalTransformer(config) if self._lora is None else LoraDecoder(config, self._lora)
        )
        self.dtype = jnp.dtype(self.model.config.compute_dtype)
        self.sampling = sampling if sampling is not None else Sampling(temperature=0.0)
        self.slots = slots
        self.capacity = capacity
        self.steps_per_call = steps_per_call
        self.min_bucket = min_bucket
        self.programs = ProgramCache()
        self._lock = threading.RLock()
        self._ids = itertools.count()
        self._seed = seed
        self._waiting: collections.deque[Request] = collections.deque()
        self._active: list[Request | None] = [None] * slots
        self._tok = np.zeros(slots, np.int32)
        self._live = np.zeros(slots, bool)
        self._count = np.zeros(slots, np.int32)
        self._budget = np.ones(slots, np.int32)
        self._prompt_len = np.zeros(slots, np.int32)
        self.min_window = min_window
        self._key_width = int(jax.random.key_data(jax.random.key(0)).shape[-1])
        self._keys = np.zeros((slots, self._key_width), np.uint32)
        self._callbacks: dict[int, Callable[[Completion], None]] = {}
        self._k = (
            self.sampling.support_width(model.config.vocab_size)
            if self.sampling.return_support
            else 0
        )
        self.variables: Mapping[str, Any] = served_variables(
            variables_of(variables), self.dtype, self.model.config, self._lora
        )
        self._signature = tree_signature(self.variables)
        self.version = version
        self._cache = empty_cache(self.model.config, slots, capacity)

    # -- public API --------------------------------------------------------------------

    @classmethod
    def from_task(cls, task: Any, **options: Any) -> Server:
        """A server for a task-like object: its `.model`, its `.variables` (or a
        snapshot in `.params`) and, unless `sampling=` is given, its `.sampling`."""
        model = getattr(task, "model", None)
        if model is None:
            raise TypeError(f"task: expected an object with .model, got {type(task).__name__}")
        variables = getattr(task, "variables", None)
        if variables is None:
            variables = getattr(task, "params", None)
        if variables is None:
            raise TypeError("task: expected .variables (or .params) holding the weights")
        if "sampling" not in options and getattr(task, "sampling", None) is not None:
            options["sampling"] = task.sampling
        return cls(model, variables, **options)

    @property
    def free_slots(self) -> int:
        with self._lock:
            return sum(r is None for r in self._active)

    @property
    def pending(self) -> int:
        """Requests waiting or being served."""
        with self._lock:
            return len(self._waiting) + sum(r is not None for r in self._active)

    def submit(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        *,
        seed: int | None = None,
        key: Any = None,
        callback: Callable[[Completion], None] | None = None,
    ) -> int:
        """Queue a request; returns its id. The request draws from `key` (a PRNG key),
        or `seed`, or the server's seed folded with the request id.
        `callback(completion)` runs on the stepping thread when it finishes."""
        prompt = check_context("prompt_ids", prompt_ids, self.model.config.vocab_size)
        if not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        if prompt.shape[0] + max_new_tokens > self.capacity:
            raise RequestTooLarge(
                f"prompt_ids: {prompt.shape[0]} prompt ids + max_new_tokens={max_new_tokens} "
                f"exceed the server's capacity of {self.capacity} positions per slot"
            )
        with self._lock:
            request_id = next(self._ids)
            if key is not None:
                key_data = np.asarray(jax.random.key_data(as_key(key)), np.uint32)
            else:
                key_data = _key_data_for(
                    self._seed if seed is None else seed, request_id, seed is None
                )
            self._waiting.append(
                Request(request_id, prompt, int(max_new_tokens), key_data, self.version, callback)
            )
        return request_id

    def cancel(self, request_id: int) -> bool:
        """Stop a request at the next round boundary; True if it was still pending."""
        with self._lock:
            for request in [*self._waiting, *self._active]:
                if request is not None and request.request_id == request_id:
                    request.cancelled = True
                    return True
        return False

    def reload(self, variables: Any, version: int | None = None) -> int:
        """Serve new weights from the next round on; returns the new version
        (`version`, or the current one plus one). Floating leaves are cast to the
        served dtype; the tree must match the served one in structure and shapes."""
        cast = served_variables(variables_of(variables), self.dtype, self.model.config, self._lora)
        signature = tree_signature(cast)
        if signature != self._signature:
            raise ValueError(
                "variables: the new tree does not match the served one in structure, "
                "shapes or dtypes"
            )
        with self._lock:
            self.variables = cast
            self.version = self.version + 1 if version is None else int(version)
            return self.version

    def step(self) -> list[Completion]:
        """One round: admit waiting requests, decode, return the requests that finished."""
        with self._lock:
            finished: list[Completion] = []
            self._drop_cancelled(finished)
            admitted = self._take_waiting()
            try:
                if admitted:
                    self._admit(admitted, finished)
                if self._live.any():
                    self._decode(finished)
            except Exception as error:  # noqa: BLE001 - reported on each request
                self._fail_all(error, finished)
            callbacks = [(self._callbacks.pop(c.request_id, None), c) for c in finished]
        for callback, completion in callbacks:
            if callback is None:
                continue
            try:
                callback(completion)
            except Exception:  # noqa: BLE001 - one bad callback must not lose the others
                _LOG.exception("callback of request %d raised", completion.request_id)
        return finished

    def run(self) -> dict[int, Completion]:
        """Step until nothing is pending; returns every completion by request id."""
        done: dict[int, Completion] = {}
        while self.pending:
            for completion in self.step():
                done[completion.request_id] = completion
        return done

    # -- internals ---------------------------------------------------------------------

    def _take_waiting(self) -> list[tuple[int, Request]]:
        free = [i for i, r in enumerate(self._active) if r is None]
        admitted = []
        while free and self._waiting:
            request = self._waiting.popleft()
            slot = free.pop(0)
            self._active[slot] = request
            if request.callback is not None:
                self._callbacks[request.request_id] = request.callback
            admitted.append((slot, request))
        return admitted

    def _admit(self, admitted: list[tuple[int, Request]], finished: list[Completion]) -> None:
        n = bucket(len(admitted), minimum=1, maximum=self.slots)
        width = bucket(max(r.prompt.shape[0] for _, r in admitted), self.min_bucket, self.capacity)
        prompts = np.zeros((n, width), np.int32)
        lengths = np.ones((n,), np.int32)
        slots = np.full((n,), self.slots, np.int32)  # out of range: dropped
        keys = np.zeros((n, self._key_width), np.uint32)
        for i, (slot, request) in enumerate(admitted):
            prompts[i, width - request.prompt.shape[0] :] = request.prompt
            lengths[i] = request.prompt.shape[0]
            slots[i] = slot
            keys[i] = request.key
        args = (self.variables, self._cache, prompts, lengths, slots, keys)
        program = self.programs.get(
            ("admit", n, width, self._signature),
            lambda: admit_program(self.model, self.sampling, self.capacity),
            args,
            donate_argnums=(1,),
        )
        cache, out, eos = program(*args)
        self._cache = cache
        out, eos = jax.device_get((out, eos))
        for i, (slot, request) in enumerate(admitted):
            support = out.support[i] if out.support is not None else None
            request.record(
                out.ids[i], out.raw_log_probs[i], out.behavior_log_probs[i], support, self.version
            )
            self._tok[slot] = out.ids[i]
            self._count[slot] = 1
            self._prompt_len[slot] = request.prompt.shape[0]
            self._budget[slot] = request.budget
            self._keys[slot] = request.key
            self._live[slot] = not eos[i] and request.budget > 1
            if not self._live[slot]:
                self._finish(slot, "eos" if eos[i] else "length", finished)

    def _decode(self, finished: list[Completion]) -> None:
        # Attend over a bucketed window that covers every live row for the whole call.
        fed = self._prompt_len + self._count - 1
        longest = int(fed[self._live].max()) + self.steps_per_call
        window = bucket(longest, self.min_window, self.capacity)
        args = (
            self.variables,
            self._cache,
            self._tok.copy(),
            self._live.copy(),
            self._count.copy(),
            self._budget.copy(),
            self._keys.copy(),
        )
        program = self.programs.get(
            ("decode", window, self._signature),
            lambda: decode_program(self.model, self.sampling, self.steps_per_call, self._k, window),
            args,
            donate_argnums=(1,),
        )
        cache, outputs = program(*args)
        self._cache = cache
        tok, live, count, eos, ids, raw, beh, made, sup = jax.device_get(outputs)
        was_live = self._live.copy()
        for slot in np.flatnonzero(was_live):
            request = self._active[slot]
            assert request is not None
            for j in np.flatnonzero(made[slot]):
                request.record(
                    ids[slot, j],
                    raw[slot, j],
                    beh[slot, j],
                    sup[slot, j] if self._k else None,
                    self.version,
                )
        self._tok[:] = tok
        self._live[:] = live
        self._count[:] = count
        for slot in np.flatnonzero(was_live & ~live):
            self._finish(int(slot), "eos" if eos[slot] else "length", finished)

    def _finish(
        self, slot: int, reason: str, finished: list[Completion], error: BaseException | None = None
    ) -> None:
        request = self._active[slot]
        assert request is not None
        self._active[slot] = None
        self._live[slot] = False
        finished.append(request.completion(reason, self._k, error))

    def _drop_cancelled(self, finished: list[Completion]) -> None:
        kept: collections.deque[Request] = collections.deque()
        for request in self._waiting:
            if request.cancelled:
                # never admitted, so its callback is not registered yet
                if request.callback is not None:
                    self._callbacks[request.request_id] = request.callback
                finished.append(request.completion("cancelled", self._k))
            else:
                kept.append(request)
        self._waiting = kept
        for slot, active in enumerate(self._active):
            if active is not None and active.cancelled:
                self._finish(slot, "cancelled", finished)

    def _fail_all(self, error: BaseException, finished: list[Completion]) -> None:
        for slot, request in enumerate(self._active):
            if request is not None:
                self._finish(slot, "error", finished, error)
        self._live[:] = False
        self._cache = empty_cache(self.model.config, self.slots, self.capacity)
