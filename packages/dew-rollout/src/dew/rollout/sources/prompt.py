"""``PromptSource``: one completion per sample from a ``RolloutServer``, scored as it lands.

``submit(task, seed=)`` sends the task's prompt to the server with ``seed``; when the draw
finishes, a thread pool decodes it (EOS left out) and calls
``reward(data_source, completion, ground_truth, extra_info)``, so verification overlaps
generation and the trainer's update. The session has one ``Call``:

- EOS ended the draw: COMPLETED with the reward;
- the budget ended it: TRUNCATED, still scored (``truncation="score"`` trains on it);
- the draw failed, or the reward raised or returned something not finite: INFRA_ERROR with the
  reason in ``detail`` and no reward.

``cancel(future)`` resolves the session as CANCELLED at once and asks the server to drop the
draw (``NativeRolloutServer.cancel``); a remote draw finishes and is thrown away.

A task's ``data`` is a mapping with ``prompt_ids`` (1-D ids, ``[P]``) and the optional strings
``data_source``, ``ground_truth`` and ``extra_info`` (empty when missing); ``prompt_task``
builds one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dew.checks import finite_float
from dew.rollout.draw import Draw
from dew.rollout.sources._common import (
    call_of,
    cancel_draw,
    check_callable,
    check_positive,
    check_seed,
    ended,
    resolve,
)
from dew.rollouts.sampled import default_decode
from dew.sessions.records import Session, Status, Task, token_ids

TEXT_FIELDS = ("data_source", "ground_truth", "extra_info")


def prompt_task(
    task_id: Hashable,
    prompt_ids: Any,
    data_source: str = "",
    ground_truth: str = "",
    extra_info: str = "",
) -> Task:
    """A ``Task`` a ``PromptSource`` reads: the prompt ids and the reward's three strings."""
    ids = token_ids(prompt_ids, "prompt_ids", allow_empty=False)
    data = {"prompt_ids": ids.astype(np.int32), "data_source": data_source,
            "ground_truth": ground_truth, "extra_info": extra_info}  # fmt: skip
    return Task(task_id, data)


def _payload(task: Task) -> tuple[np.ndarray, tuple[str, str, str]]:
    if not isinstance(task, Task):
        raise TypeError(f"task: expected a dew Task, got {type(task).__name__}")
    data = task.data
    if not isinstance(data, Mapping) or "prompt_ids" not in data:
        raise TypeError(
            f"task {task.id!r}: Task.data: expected a mapping with 'prompt_ids' "
            f"(see prompt_task), got {type(data).__name__}"
        )
    ids = token_ids(data["prompt_ids"], f"task {task.id!r}: prompt_ids", allow_empty=False)
    texts = []
    for name in TEXT_FIELDS:
        value = data.get(name, "")
        if not isinstance(value, str):
            raise TypeError(f"task {task.id!r}: {name}: expected a string, got {value!r}")
        texts.append(value)
    return ids.astype(np.int32), (texts[0], texts[1], texts[2])


class PromptSource:
    """Draw one completion per sample from ``server`` and score it on a thread pool.

    Args:
      server: a ``RolloutServer`` (``NativeRolloutServer``, ``OpenAIRolloutServer``, ...).
      reward: ``reward(data_source, completion, ground_truth, extra_info) -> float``
        (``MathReward``, ``CodeReward`` or any such callable); called on the pool's threads.
      decode: ids (EOS left out) -> the completion text; default: ids separated by spaces.
      max_new_tokens: the response budget R.
      workers: threads scoring completions.
    """

    def __init__(
        self,
        server: Any,
        reward: Callable[[str, str, str, str], Any],
        *,
        max_new_tokens: int,
        decode: Callable[[Any], str] | None = None,
        workers: int = 4,
    ) -> None:
        if not callable(getattr(server, "submit", None)):
            raise TypeError(f"server: expected a RolloutServer, got {type(server).__name__}")
        self.server = server
        self.reward = check_callable(reward, "reward", "(data_source, completion, truth, info)")
        self.decode = (
            default_decode if decode is None else check_callable(decode, "decode", "(ids) -> str")
        )
        self.max_new_tokens = check_positive(max_new_tokens, "max_new_tokens")
        self._pool = ThreadPoolExecutor(check_positive(workers, "workers"), "dew-prompt-reward")
        self._lock = threading.Lock()
        self._live: dict[int, tuple[Task, Future[Draw]]] = {}

    def submit(self, task: Task, *, seed: int) -> Future[Session]:
        """Start one draw of ``task``'s prompt seeded by ``seed``; the future resolves to its
        scored ``Session``."""
        prompt, texts = _payload(task)
        seed = check_seed(seed)
        out: Future[Session] = Future()
        draw = self.server.submit(prompt, self.max_new_tokens, seed=seed)
        with self._lock:
            self._live[id(out)] = (task, draw)
        draw.add_done_callback(lambda done: self._drawn(task, texts, out, done))
        return out

    def cancel(self, future: Future[Session]) -> None:
        """Resolve ``future`` as CANCELLED now and drop its draw when the server can."""
        with self._lock:
            entry = self._live.pop(id(future), None)
        if entry is None:
            return
        task, draw = entry
        if resolve(future, ended(task, Status.CANCELLED, "cancelled by the scheduler")):
            cancel_draw(self.server, draw)

    def close(self) -> None:
        """Stop the scoring threads (pending scores still finish)."""
        self._pool.shutdown(wait=True)

    # -- internals ---------------------------------------------------------------------

    def _drawn(
        self, task: Task, texts: tuple[str, str, str], out: Future[Session], done: Future[Draw]
    ) -> None:
        if out.done():
            self._forget(out)
            return
        try:
            draw = done.result()
        except CancelledError:
            self._finish(out, ended(task, Status.CANCELLED, "the draw was cancelled"))
            return
        except Exception as err:  # noqa: BLE001 - a failed draw is an infrastructure failure
            detail = f"draw failed: {type(err).__name__}: {err}"
            self._finish(out, ended(task, Status.INFRA_ERROR, detail))
            return
        try:
            self._pool.submit(self._score, task, texts, out, draw)
        except RuntimeError as err:  # the pool was shut down
            self._finish(out, ended(task, Status.INFRA_ERROR, f"scoring refused: {err}"))

    def _score(
        self, task: Task, texts: tuple[str, str, str], out: Future[Session], draw: Draw
    ) -> None:
        if out.done():
            self._forget(out)
            return
        call = call_of(draw)
        ids = draw.ids[:-1] if draw.eos else draw.ids
        try:
            completion = self.decode(ids)
            value = self.reward(texts[0], completion, texts[1], texts[2])
            reward = finite_float(value, "reward")
        except Exception as err:  # noqa: BLE001 - a failed reward is an infrastructure failure
            detail = f"reward failed: {type(err).__name__}: {err}"
            self._finish(out, ended(task, Status.INFRA_ERROR, detail, (call,)))
            return
        status = Status.COMPLETED if draw.eos else Status.TRUNCATED
        session = Session(task=task.id, calls=(call,), status=status, reward=reward)
        self._finish(out, session)

    def _finish(self, out: Future[Session], session: Session) -> None:
        self._forget(out)
        resolve(out, session)

    def _forget(self, out: Future[Session]) -> None:
        with self._lock:
            self._live.pop(id(out), None)


__all__ = ["PromptSource", "prompt_task"]
