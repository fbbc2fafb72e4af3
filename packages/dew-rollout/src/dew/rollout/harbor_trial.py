"""One Harbor trial on the host: its `harbor` process, and what its `result.json` says.

`Trial` holds the process of a trial (`harbor trial start`, then, when the source re-grades,
`harbor trial regrade`) and its cancellation. `reward_of` and `status_of` read a
`TrialResult` (`harbor/models/trial/result.py`) as `dew.rollout.harbor` describes.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dew import processes
from dew.sessions.records import Status, Task

TRUNCATIONS = frozenset(
    {
        "AgentTimeoutError",
        "ContextLengthExceededError",
        "ContextWindowExceededError",
        "OutputLengthExceededError",
        "OutputTokenExceededError",
    }
)
AGENT_ERRORS = frozenset(
    {"NonZeroAgentExitCodeError", "AgentSafetyRefusalError", "ContentPolicyViolationError"}
)


def reward_of(result: Mapping[str, Any]) -> tuple[float | None, dict[str, float], str]:
    """(reward, components, problem) from a TrialResult's `verifier_result`."""
    verifier = result.get("verifier_result")
    rewards = verifier.get("rewards") if isinstance(verifier, Mapping) else None
    if not rewards:
        return None, {}, "the verifier gave no reward"
    if not isinstance(rewards, Mapping):
        return None, {}, f"verifier_result.rewards: expected a mapping, got {rewards!r:.100}"
    components: dict[str, float] = {}
    for name, value in rewards.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, {}, f"verifier_result.rewards[{name!r}]: expected a number, got {value!r}"
        if not math.isfinite(value):
            return None, {}, f"verifier_result.rewards[{name!r}]: expected finite, got {value}"
        components[str(name)] = float(value)
    if "reward" in components:
        return components["reward"], components, ""
    if len(components) == 1:
        return next(iter(components.values())), components, ""
    names = ", ".join(sorted(components))
    return None, components, f"verifier_result.rewards: no 'reward' among several ({names})"


def status_of(result: Mapping[str, Any]) -> tuple[Status, float | None, dict[str, float], str]:
    """(status, reward, components, detail) for one TrialResult."""
    reward, components, problem = reward_of(result)
    info = result.get("exception_info")
    kind = info.get("exception_type") if isinstance(info, Mapping) else None
    message = str(info.get("exception_message", ""))[:300] if isinstance(info, Mapping) else ""
    if info is not None and not isinstance(kind, str):
        return Status.INFRA_ERROR, None, {}, f"exception_info without a type: {info!r:.200}"
    if kind is None:
        if reward is None:
            return Status.INFRA_ERROR, None, {}, problem
        return Status.COMPLETED, reward, components, ""
    detail = f"{kind}: {message}".rstrip(": ")
    if kind in TRUNCATIONS:
        return Status.TRUNCATED, reward, components if reward is not None else {}, detail
    if kind in AGENT_ERRORS:
        if reward is None:
            return Status.INFRA_ERROR, None, {}, f"{detail}; {problem}"
        return Status.AGENT_ERROR, reward, components, detail
    return Status.INFRA_ERROR, None, {}, detail


class Trial:
    """One trial's `harbor` process (`trial start`, then any `trial regrade`) and its
    cancellation state: `stop` kills whichever runs and keeps a later one from starting."""

    def __init__(self, session: str, task: Task, directory: Path, seed: int) -> None:
        self.session = session
        self.task = task
        self.directory = directory
        self.seed = seed
        self.cancelled = False
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self, argv: list[str], log: Path, env: Mapping[str, str]) -> None:
        with self._lock:
            if self.cancelled:
                return
            self._process = processes.start(argv, env={**os.environ, **env}, log=log)

    def wait(self, timeout: float | None) -> int | None:
        """The exit code, or None when the trial ran past `timeout` and was killed."""
        process = self._process
        if process is None:
            return -1
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            return None

    def stop(self) -> None:
        with self._lock:
            self.cancelled = True
        self._kill()

    def _kill(self) -> None:
        process = self._process
        if process is not None:
            processes.stop(process, grace=10)


__all__ = ["AGENT_ERRORS", "TRUNCATIONS", "Trial", "reward_of", "status_of"]
