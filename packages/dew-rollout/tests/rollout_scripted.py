"""A SessionSource that follows a script, for the scheduler tests that must force a status.

It is a real source in the protocol's sense: each submission runs on its own thread, sleeps
its planned time (woken early by ``cancel``), and resolves to a ``Session`` with one call.
The script maps (task id, n) to a ``Plan``, where ``n`` counts that task's submissions in
order (the scheduler submits sample 0, 1, ... of a group first, resubmissions after).
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass

from dew.objectives.rl.sessions import Call, Session, Status


@dataclass(frozen=True)
class Plan:
    status: Status = Status.COMPLETED
    reward: float | None = 1.0
    delay: float = 0.0
    version: int | None = None  # None: the version served at submission
    raise_error: bool = False
    calls: int = 1


class Scripted:
    def __init__(self, script, weights):
        self.script = script
        self.weights = weights
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.submitted: list[tuple] = []  # (task, n, seed)
        self.cancelled: list[tuple] = []  # (task, n)
        self._runs: dict[int, tuple] = {}

    def submit(self, task, *, seed):
        with self.lock:
            n = self.counts[task.id]
            self.counts[task.id] += 1
            self.submitted.append((task.id, n, seed))
        plan = self.script(task.id, n)
        version = self.weights.version if plan.version is None else plan.version
        out: Future = Future()
        stop = threading.Event()
        with self.lock:
            self._runs[id(out)] = (task.id, n, stop)

        def run():
            stop.wait(plan.delay)
            if stop.is_set():
                out.set_result(Session(task=task.id, status=Status.CANCELLED))
                return
            if plan.raise_error:
                out.set_exception(RuntimeError(f"source broke on task {task.id}"))
                return
            calls = tuple(
                Call(
                    prompt_ids=[1, 2, 3 + k],
                    sampled_ids=[4, 5 + n % 7],
                    behavior_log_probs=[-0.5, -0.7],
                    finish_reason="stop" if plan.status is not Status.TRUNCATED else "length",
                    version=version,
                )
                for k in range(plan.calls)
            )
            out.set_result(
                Session(task=task.id, calls=calls, status=plan.status, reward=plan.reward)
            )

        threading.Thread(target=run, daemon=True).start()
        return out

    def cancel(self, future):
        with self.lock:
            entry = self._runs.get(id(future))
            if entry is not None:
                self.cancelled.append(entry[:2])
        if entry is not None:
            entry[2].set()
