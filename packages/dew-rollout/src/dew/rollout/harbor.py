"""`HarborSource`: each sample one Harbor trial, its calls read back from a recording gateway.

A `SessionSource` (`submit(task, seed=) -> Future[Session]`, `cancel(future)`). For each
submission it mints a session id, runs

    harbor trial start -p <task dir> --trial-name <session> --trials-dir <trials>
        -a <agent> -m <model> --base-url <gateway.base_url(session)>
        --allow-agent-host <sandbox host> <args...>

(the CLI of Harbor 0.26.0, `harbor/cli/trials.py`), so the agent reaches the policy only
through the gateway at `/sessions/<session>/v1`, by way of the sandbox proxy. When the
process exits it reads `<trials>/<session>/result.json` (Harbor's `TrialResult`,
`harbor/models/trial/result.py`): the verifier's `rewards` give the reward (the `reward`
entry, or the only entry; all entries become the components) and `exception_info`
gives the status, by Harbor's own error classes (`harbor/models/trial/error_policy.py`):

* no exception: COMPLETED;
* the agent ran out of time, context or output budget (`AgentTimeoutError`,
  `ContextLengthExceededError`, `ContextWindowExceededError`, `OutputLengthExceededError`,
  `OutputTokenExceededError`): TRUNCATED, with the verifier's reward when it ran;
* the agent itself failed but was graded (`NonZeroAgentExitCodeError`,
  `AgentSafetyRefusalError`, `ContentPolicyViolationError`): AGENT_ERROR with its reward;
* anything else (the environment, model API errors such as the gateway's 500 when no
  worker is healthy, verifier failures, a crash without a result): INFRA_ERROR.

A COMPLETED or AGENT_ERROR trial without a reward, or one whose traces are missing or
malformed, is an INFRA_ERROR: nothing about it can be trained on. The session's traces
are deleted from the gateway once read. `cancel` kills the trial's process group (or its
re-grade's) and the session comes back CANCELLED. Harbor 0.26.0 gives a trial no seed: its
`TrialConfig` (`harbor/models/trial/config.py`) has no seed field and `harbor trial start`
no seed option (a seed reaches only what an agent forwards to its own model calls, per agent).
So `seed` is recorded in the session's detail only; a resubmitted trial does not replay
the same tokens.

With `regrade=HarborRegrade(...)` every trial that came back with a reward is re-graded by
`harbor trial regrade` against its recorded artifacts in a separate verifier environment;
a clean reward that disagrees, or a regrade that fails, makes the session INFRA_ERROR
(`regrade rejected: ...`, `regrade failed: ...`), so the scheduler never trains it, and
`metrics()` counts `regrade/regraded`, `agreed`, `rejected` and `failed` for each
scheduler record (`dew.rollout.harbor_regrade` says what Harbor needs from the task).

Before the first trial `Gateway.ready(ready_timeout)` must pass; its failure raises from
that submission's future (the gateway is broken, not one trial).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dew.rollout.errors import EngineError
from dew.rollout.gateway import Gateway
from dew.rollout.harbor_regrade import HarborRegrade, HarborRegrader, Recorded, RegradeCancelled
from dew.rollout.harbor_trial import AGENT_ERRORS, TRUNCATIONS, Trial, reward_of, status_of
from dew.rollout.sources.regrade import COUNTS, Regrade
from dew.sessions.records import Call, Session, Status, Task


def task_directory(task: Task, tasks: Mapping[Any, Any] | None = None) -> Path:
    """The Harbor task directory of `task`: `tasks[task.id]` when a table is given, else
    `task.data` (the path, or a mapping with `"path"`)."""
    if tasks is not None:
        if task.id not in tasks:
            raise KeyError(f"tasks: no Harbor task directory for task id {task.id!r}")
        data = tasks[task.id]
    else:
        data = task.data
    if isinstance(data, Mapping):
        data = data.get("path")
    if not isinstance(data, str | os.PathLike) or not str(data):
        raise TypeError(
            f"Task.data: expected a Harbor task directory (a path, or a mapping with 'path'), "
            f"got {task.data!r}"
        )
    path = Path(data)
    if not path.is_dir():
        raise FileNotFoundError(f"Task.data: {str(path)!r} is not a directory")
    return path


class HarborSource:
    """Runs each sample as one Harbor trial whose agent reaches the policy through `gateway`.

    harbor: the Harbor command (a path, or an argv prefix such as
      `["uv", "tool", "run", "harbor"]`); Harbor 0.26 wants Python >= 3.12, so it usually
      lives in its own tool environment.
    model: the model name the agent asks for (as the engine serves it, with any provider
      prefix the agent needs, e.g. `hosted_vllm/<name>` for litellm-based agents).
    trials: the directory trials are written under (`<trials>/<session>/`).
    agent: Harbor's agent name or import path.
    args: further `harbor trial start` options (timeouts, `--api-key-name`, `--env`, ...).
    workers: trials run at once. timeout: seconds before a trial is killed (INFRA_ERROR).
    ready_timeout: how long the first submission waits for `gateway.ready`.
    tasks: task id -> Harbor task directory (for integer `task_id` datasets); without it
      each `Task.data` names its directory.
    regrade: a `HarborRegrade` to re-grade every trial with a reward by `harbor trial
      regrade` in a separate verifier environment (`dew.rollout.harbor_regrade`; the task
      must declare a separate-mode verifier); None: trials are not re-graded.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        harbor: str | Sequence[str] = "harbor",
        model: str,
        trials: str | os.PathLike[str],
        agent: str = "terminus-2",
        args: Sequence[str] = (),
        workers: int = 4,
        timeout: float | None = None,
        ready_timeout: float = 600.0,
        env: Mapping[str, str] | None = None,
        tasks: Mapping[Any, Any] | None = None,
        regrade: HarborRegrade | None = None,
    ) -> None:
        if not isinstance(gateway, Gateway):
            raise TypeError(f"gateway: expected a dew.rollout.Gateway, got {type(gateway)}")
        self.command = [harbor] if isinstance(harbor, str) else [str(a) for a in harbor]
        if not self.command or not all(self.command):
            raise ValueError(f"harbor: expected a command, got {harbor!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected the served model's name, got {model!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected a positive int, got {workers!r}")
        self.gateway = gateway
        self.model = model
        self.agent = agent
        self.args = [str(a) for a in args]
        self.trials = Path(trials)
        self.trials.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout
        self.ready_timeout = ready_timeout
        self.env = dict(env or {})
        self.tasks = dict(tasks) if tasks is not None else None
        if regrade is not None and not isinstance(regrade, HarborRegrade):
            raise TypeError(f"regrade: expected a HarborRegrade or None, got {regrade!r}")
        self.regrade: Regrade | None = None
        if regrade is not None:
            regrader = HarborRegrader(regrade, self.command, self.trials, self.env)
            self.regrade = Regrade(regrader, regrade.tolerance)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="dew-harbor")
        self._lock = threading.Lock()
        self._ready = False
        self._ready_lock = threading.Lock()
        self._running: dict[Future[Session], Trial] = {}

    def submit(self, task: Task, *, seed: int) -> Future[Session]:
        """Start one trial of `task` (its `data` names the Harbor task directory)."""
        directory = task_directory(task, self.tasks)
        trial = Trial(f"dew-{uuid.uuid4().hex[:20]}", task, directory, int(seed))
        future = self._pool.submit(self._run, trial)
        with self._lock:
            self._running[future] = trial
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: Future[Session]) -> None:
        with self._lock:
            self._running.pop(future, None)

    def cancel(self, future: Future[Session]) -> None:
        """Kill the trial behind `future` (its whole process group); it comes back
        CANCELLED. A trial not yet started never starts."""
        with self._lock:
            trial = self._running.get(future)
        if trial is None or future.cancel():
            return
        trial.stop()

    def _ensure_ready(self, trial: Trial) -> None:
        # its own lock: submit and cancel must not wait on a slow gateway
        with self._ready_lock:
            if self._ready or trial.cancelled:
                return
            try:
                self.gateway.ready(self.ready_timeout)
            except EngineError:
                if trial.cancelled:
                    return
                raise
            self._ready = True

    def argv(self, session: str, directory: Path) -> list[str]:
        """The `harbor trial start` command line of one trial."""
        sandbox_host = urllib.parse.urlsplit(self.gateway.sandbox_url).hostname or ""
        return [
            *self.command, "trial", "start", "-p", str(directory),
            "--trial-name", session, "--trials-dir", str(self.trials),
            "-a", self.agent, "-m", self.model,
            "--base-url", self.gateway.base_url(session),
            "--allow-agent-host", sandbox_host, *self.args,
        ]  # fmt: skip

    def _run(self, trial: Trial) -> Session:
        self._ensure_ready(trial)
        log = self.trials / f"{trial.session}.log"
        trial.start(self.argv(trial.session, trial.directory), log, self.env)
        code = trial.wait(self.timeout)
        detail = f"seed {trial.seed}; session {trial.session}"
        if trial.cancelled:
            self._drop(trial.session)
            return Session(task=trial.task.id, status=Status.CANCELLED, detail=detail)
        result_path = self.trials / trial.session / "result.json"
        result: Any = None
        problem = ""
        if code is None:
            problem = f"the trial ran past {self.timeout} s and was killed"
        elif result_path.exists():
            try:
                result = json.loads(result_path.read_text())
            except (OSError, ValueError) as error:
                problem = f"{result_path}: unreadable ({error})"
            if result is not None and not isinstance(result, Mapping):
                problem, result = f"{result_path}: expected a JSON object", None
        else:
            tail = log.read_text(errors="replace")[-400:]
            problem = f"harbor exited {code} without {result_path}: {tail!r}"
        if result is None:
            self._drop(trial.session)
            return Session(
                task=trial.task.id, status=Status.INFRA_ERROR, detail=f"{problem}; {detail}"
            )
        status, reward, components, why = status_of(result)
        calls: list[Call] = []
        if status is not Status.INFRA_ERROR:
            try:
                calls = self.gateway.calls(trial.session)
            except EngineError as error:
                status, reward, components, why = Status.INFRA_ERROR, None, {}, str(error)
            if status is not Status.INFRA_ERROR and not calls:
                status, reward, components = Status.INFRA_ERROR, None, {}
                why = "the gateway recorded no call for this session"
        self._drop(trial.session)
        session = Session(
            task=trial.task.id,
            calls=calls if status is not Status.INFRA_ERROR else (),
            status=status,
            reward=reward,
            components=components,
            detail=f"{why}; {detail}" if why else detail,
        )
        return self._regraded(trial, session, result)

    def _regraded(self, trial: Trial, session: Session, result: Mapping[str, Any]) -> Session:
        """`session` as re-grading settles it (unchanged without `regrade` or a reward)."""
        if self.regrade is None or session.reward is None:
            return session
        info = result.get("exception_info")
        kind = info.get("exception_type") if isinstance(info, Mapping) else None
        recorded = Recorded(trial, kind)
        where = f"seed {trial.seed}; session {trial.session}"
        try:
            artifact = self.regrade.collect(trial.task, recorded)
            settled = self.regrade.settle(trial.task, session, artifact)
        except RegradeCancelled:
            return Session(task=trial.task.id, status=Status.CANCELLED,
                           detail=f"cancelled while re-graded; {where}")  # fmt: skip
        if settled is session:
            return session
        return dataclasses.replace(settled, detail=f"{settled.detail}; {where}")

    @property
    def regrade_counts(self) -> dict[str, int]:
        """What re-grading decided so far: `regraded`, `agreed`, `rejected` (the clean
        reward disagreed) and `failed` (no clean reward); all zero without `regrade`."""
        return dict.fromkeys(COUNTS, 0) if self.regrade is None else self.regrade.counts

    def metrics(self) -> dict[str, float]:
        """`regrade_counts` as `regrade/<name>` numbers (empty without `regrade`); a
        `RolloutScheduler` joins them to each batch's record."""
        if self.regrade is None:
            return {}
        return {f"regrade/{name}": float(n) for name, n in self.regrade_counts.items()}

    def _drop(self, session: str) -> None:
        try:
            self.gateway.delete(session)
        except EngineError:
            pass  # best effort: the traces are not needed any more

    def close(self) -> None:
        """Kill running trials and stop the worker threads."""
        with self._lock:
            trials = list(self._running.values())
        for trial in trials:
            trial.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> HarborSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AGENT_ERRORS", "TRUNCATIONS", "HarborRegrade", "HarborSource", "reward_of",
           "status_of", "task_directory"]  # fmt: skip
