"""``EnvironmentSource``: multi-turn tool episodes on a ``RolloutServer``, one per thread.

Each ``submit(task, seed=)`` runs one session on a worker thread:

1. ``environment(task, identity)`` makes the environment (``identity`` is an ``EpisodeId``:
   the task id when it is an integer, else 0; step and sample 0, since the scheduler owns
   those; the session's ``seed``); it is entered and reset;
2. each turn sends the current context to the server as its own request (seeded from the
   session seed and the turn), so turns of different sessions share the engine's batch. The
   draw becomes a ``Call`` with the version the engine reports and an ``Action`` for the
   environment (``policy_step`` = that version);
3. a draw that used its budget without EOS, a context longer than ``max_prompt_tokens`` and a
   live episode after ``max_turns`` end the session TRUNCATED (a budget-ended turn is kept
   as a call and never sent to the environment); the environment's terminal status ends it
   otherwise (COMPLETED, TRUNCATED, CANCELLED; ERROR becomes INFRA_ERROR);
4. ``verifier(task, episode)`` scores COMPLETED and TRUNCATED sessions while the environment
   is still open; then the environment exits.

With ``regrade=`` (a regrader, ``dew.rollout.sources.regrade``) a scored session's final
artifact is collected after the verifier, while the environment is still open, and scored
again in a clean sandbox after it exits; a reward the clean sandbox does not reproduce makes
the session INFRA_ERROR (``regrade rejected: ...``, no reward), so it is never admitted, and
``regrade_counts`` counts it.

An environment that raises, a failed draw, a verifier that raises or returns a non-finite
value and a failed exit all make the session INFRA_ERROR (reason in ``detail``).

``cancel(future)`` stops a session at its next turn boundary or in the middle of a draw (the
draw is dropped from the server when it can be); the environment exits under a
``CancelledError`` and the session resolves CANCELLED. A session cancelled while it is
re-graded hands the cancel to the regrader (``grade(..., cancel=)``: a ``SandboxRegrader``
kills its verifier program at once) and resolves CANCELLED; nothing is counted. A thread
stuck inside ``environment.step`` is only reached when that step returns, so environments
bound their own step time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor, wait
from typing import Any

from dew.checks import finite_float, is_integer
from dew.rollout.draw import Draw
from dew.rollout.sources._common import (
    call_of,
    cancel_draw,
    check_callable,
    check_positive,
    check_seed,
    ended,
    resolve,
    turn_seed,
)
from dew.rollout.sources.regrade import COUNTS, Regrade
from dew.rollouts.episodes.protocol import (
    Action,
    Episode,
    EpisodeId,
    EpisodeStatus,
    Observation,
    Transition,
    as_observation,
)
from dew.sessions.records import Call, Session, Status, Task

_STATUS = {
    EpisodeStatus.COMPLETED: Status.COMPLETED,
    EpisodeStatus.TRUNCATED: Status.TRUNCATED,
    EpisodeStatus.CANCELLED: Status.CANCELLED,
    EpisodeStatus.ERROR: Status.INFRA_ERROR,
}


class _Stopped(Exception):
    """The scheduler cancelled this session."""


class _Run:
    """One session in flight: its stop signal and the draw it waits on."""

    def __init__(self, task: Task, seed: int, out: Future[Session]) -> None:
        self.task = task
        self.seed = seed
        self.out = out
        self.stop: Future[bool] = Future()
        self.draw: Future[Draw] | None = None
        self.lock = threading.Lock()

    def check(self) -> None:
        if self.stop.done():
            raise _Stopped()

    def is_set(self) -> bool:
        """Cancelled (a regrader's ``cancel`` flag)."""
        return self.stop.done()


class EnvironmentSource:
    """Run tool episodes against ``server``, one session per sample on a worker thread.

    Args:
      server: a ``RolloutServer``.
      environment: ``(task, identity) -> Environment`` (the tool-episode protocol: a context
        manager with ``reset()`` and ``step(action)``); it reads the task's own payload.
      verifier: ``(task, episode) -> float``.
      max_prompt_tokens: the longest context a turn may read (P).
      max_new_tokens: each turn's response budget (R).
      max_turns: model calls per session (T).
      workers: sessions running at once.
      regrade: a regrader (``collect(task, environment)``, ``grade(task, artifact)``) that
        scores each rewarded session again in a clean sandbox, or None (see
        ``dew.rollout.sources.regrade``); regrade_tolerance: the largest difference of the
        two rewards that still agrees.
    """

    def __init__(
        self,
        server: Any,
        environment: Callable[[Task, EpisodeId], Any],
        verifier: Callable[[Task, Episode], Any],
        *,
        max_prompt_tokens: int,
        max_new_tokens: int,
        max_turns: int,
        workers: int = 8,
        regrade: Any = None,
        regrade_tolerance: float = 1e-6,
    ) -> None:
        if not callable(getattr(server, "submit", None)):
            raise TypeError(f"server: expected a RolloutServer, got {type(server).__name__}")
        self.server = server
        self.environment = check_callable(environment, "environment", "(task, identity)")
        self.verifier = check_callable(verifier, "verifier", "(task, episode) -> float")
        self.max_prompt_tokens = check_positive(max_prompt_tokens, "max_prompt_tokens")
        self.max_new_tokens = check_positive(max_new_tokens, "max_new_tokens")
        self.max_turns = check_positive(max_turns, "max_turns")
        self.regrade = None if regrade is None else Regrade(regrade, regrade_tolerance)
        self._pool = ThreadPoolExecutor(check_positive(workers, "workers"), "dew-environment")
        self._lock = threading.Lock()
        self._live: dict[int, _Run] = {}

    @property
    def regrade_counts(self) -> dict[str, int]:
        """What re-grading decided so far: ``regraded``, ``agreed``, ``rejected`` (the clean
        reward disagreed: the sample was dropped) and ``failed`` (the regrader raised); all
        zero without ``regrade``."""
        return dict.fromkeys(COUNTS, 0) if self.regrade is None else self.regrade.counts

    def metrics(self) -> dict[str, float]:
        """``regrade_counts`` as ``regrade/<name>`` numbers (empty without ``regrade``); a
        ``RolloutScheduler`` joins them to each batch's record."""
        return {} if self.regrade is None else self.regrade.metrics()

    def submit(self, task: Task, *, seed: int) -> Future[Session]:
        """Queue one session of ``task`` seeded by ``seed``; the future resolves to it."""
        if not isinstance(task, Task):
            raise TypeError(f"task: expected a dew Task, got {type(task).__name__}")
        run = _Run(task, check_seed(seed), Future())
        with self._lock:
            self._live[id(run.out)] = run
        self._pool.submit(self._run, run)
        return run.out

    def cancel(self, future: Future[Session]) -> None:
        """Stop the session at its next turn (mid-draw included); it resolves CANCELLED."""
        with self._lock:
            run = self._live.get(id(future))
        if run is None:
            return
        with run.lock:
            if not run.stop.done():
                run.stop.set_result(True)
            draw = run.draw
        cancel_draw(self.server, draw)

    def close(self) -> None:
        """Cancel every session and wait for the worker threads."""
        with self._lock:
            futures = [run.out for run in self._live.values()]
        for future in futures:
            self.cancel(future)
        self._pool.shutdown(wait=True)

    # -- one session ---------------------------------------------------------------------

    def _run(self, run: _Run) -> None:
        try:
            session = self._session(run)
        except BaseException as err:  # noqa: BLE001 - never lose a session to a thread
            session = ended(run.task, Status.INFRA_ERROR, f"{type(err).__name__}: {err}")
        with self._lock:
            self._live.pop(id(run.out), None)
        resolve(run.out, session)

    def _draw(self, run: _Run, context: Any, turn: int) -> Draw:
        with run.lock:
            run.check()
            draw = self.server.submit(context, self.max_new_tokens, seed=turn_seed(run.seed, turn))
            run.draw = draw
        wait([draw, run.stop], return_when=FIRST_COMPLETED)
        run.check()
        return draw.result()

    def _session(self, run: _Run) -> Session:
        task = run.task
        number = int(task.id) if is_integer(task.id) and task.id >= 0 else 0
        identity = EpisodeId(task=number, step=0, sample=0, seed=run.seed)
        calls: list[Call] = []
        transitions: list[Transition] = []
        first: Observation | None = None
        manager: Any = None
        env: Any = None

        def episode(status: EpisodeStatus, detail: str) -> Episode:
            return Episode(identity, first, tuple(transitions), status, detail)

        def infra(detail: str) -> Session:
            return ended(task, Status.INFRA_ERROR, detail, tuple(calls))

        try:
            run.check()
            manager = self.environment(task, identity)
            entered = manager.__enter__()
            env = manager if entered is None else entered
            first = as_observation(env.reset(), "Environment.reset()")
            observation, status, detail = first, first.status, first.detail
            turn = 0
            while not status.terminal:
                context = observation.context
                if turn >= self.max_turns:
                    status, detail = EpisodeStatus.TRUNCATED, f"max_turns={self.max_turns}"
                    break
                if len(context) > self.max_prompt_tokens:
                    status = EpisodeStatus.TRUNCATED
                    detail = f"context of {len(context)} ids > max_prompt_tokens"
                    break
                try:
                    draw = self._draw(run, context, turn)
                except (_Stopped, CancelledError):
                    raise
                except Exception as err:  # noqa: BLE001 - a failed draw
                    self._exit(manager, err)
                    manager = None
                    return infra(f"draw failed: {type(err).__name__}: {err}")
                call = call_of(draw)
                calls.append(call)
                action = Action(call.prompt_ids, call.sampled_ids, call.raw_log_probs,
                                call.behavior_log_probs, bool(draw.eos), int(draw.version))  # fmt: skip
                if not draw.eos:
                    reply = Observation(None, EpisodeStatus.TRUNCATED, "max_new_tokens")
                    transitions.append(Transition(action, reply))
                    status, detail = reply.status, reply.detail
                    break
                run.check()
                observation = as_observation(env.step(action), "Environment.step()")
                transitions.append(Transition(action, observation))
                status, detail = observation.status, observation.detail
                turn += 1
        except (_Stopped, CancelledError) as err:
            self._exit(manager, CancelledError("cancelled by the scheduler"))
            del err
            return ended(task, Status.CANCELLED, "cancelled by the scheduler", tuple(calls))
        except Exception as err:  # noqa: BLE001 - the environment failed
            self._exit(manager, err)
            return infra(f"environment failed: {type(err).__name__}: {err}")

        return self._close(run, manager, env, episode(status, detail), tuple(calls))

    def _close(
        self, run: _Run, manager: Any, env: Any, episode: Episode, calls: tuple[Call, ...]
    ) -> Session:
        """Score a finished ``episode`` while its environment is open (collecting the
        regrader's artifact), exit the environment, then re-grade (a cancel stops it)."""
        task = run.task
        reward, artifact, failure = None, None, None
        if episode.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED):
            try:
                reward = finite_float(self.verifier(task, episode), "verifier")
            except Exception as err:  # noqa: BLE001 - a verifier crash
                self._exit(manager, err)
                return ended(task, Status.INFRA_ERROR,
                             f"verifier failed: {type(err).__name__}: {err}", calls)  # fmt: skip
            if self.regrade is not None:
                try:
                    artifact = self.regrade.collect(task, env)
                except Exception as err:  # noqa: BLE001 - counted as a failed re-grade below
                    failure = err
        try:
            manager.__exit__(None, None, None)
        except Exception as err:  # noqa: BLE001 - a failed release discards the session
            return ended(task, Status.INFRA_ERROR,
                         f"release failed: {type(err).__name__}: {err}", calls)  # fmt: skip
        final = _STATUS[episode.status]
        session = Session(task=task.id, calls=calls, status=final,
                          reward=reward if final in (Status.COMPLETED, Status.TRUNCATED) else None,
                          detail=episode.detail)  # fmt: skip
        if self.regrade is None or session.reward is None:
            return session
        if failure is not None:
            return self.regrade.failed(session, failure)
        try:
            return self.regrade.settle(task, session, artifact, cancel=run)
        except CancelledError:
            return ended(task, Status.CANCELLED, "cancelled by the scheduler", calls)

    @staticmethod
    def _exit(manager: Any, error: BaseException) -> None:
        if manager is None:
            return
        try:
            manager.__exit__(type(error), error, error.__traceback__)
        except BaseException:  # noqa: BLE001 - the session already failed
            pass


__all__ = ["EnvironmentSource"]
