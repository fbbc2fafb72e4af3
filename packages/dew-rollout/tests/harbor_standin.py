"""A stand-in `harbor` executable: `harbor trial start` and `harbor trial regrade` with
Harbor 0.26.0's options and trial layout, running the agent and the verifier as host
processes in temporary directories instead of containers.

Why a stand-in: a real Harbor trial drives `docker compose` (the machine's private
Docker engine has no compose plugin), builds the task's image from its Dockerfile and
installs the agent inside it, both of which need registries these machines cannot reach.

What it follows (Harbor 0.26.0 wheel):

* `trial start` (`harbor/cli/trials.py::start`): `-p/--path`, `--trial-name`,
  `--trials-dir`, `-a/--agent`, `-m/--model`, `--base-url`, `--allow-agent-host`,
  `--api-key-name`, `--agent-timeout`; any other option is an error, as in Harbor. It exits
  0 after a trial whatever its exception (the CLI prints it and returns).
* `trial regrade` (`harbor/cli/trials.py::regrade`, `harbor/trial/regrade.py`): `SOURCE`
  (a local trial directory), `-p/--task-path` (a task directory, or a directory of them
  matched by the source's task name), `--trial-name`, `-o/--trials-dir`, `-e/--env`
  (recorded only), `--ve/--verifier-env KEY=VALUE`; any other option is an error. A source
  without a readable `result.json`, or a task that does not declare
  `[verifier] environment_mode = "separate"` in `task.toml`, prints `Error: ...` and exits 1
  before any trial exists. The regrade trial checks that the source's
  `artifacts/manifest.json` records the convention directory `/logs/artifacts`, copies the
  source's `agent/` and `artifacts/`, and runs the verifier in a fresh verifier environment
  holding only those recorded artifacts and the task's tests; an agent error of the source
  is carried into the new result. It exits 1 when the new result has an exception.
* The trial directory `<trials-dir>/<trial-name>/` (`harbor/models/trial/paths.py`):
  `config.json`, `agent/`, `verifier/reward.txt`, `artifacts/manifest.json` with the agent's
  `/logs/artifacts` collected under `artifacts/logs/artifacts/`, and `result.json` as a
  `TrialResult` (`harbor/models/trial/result.py`).

How container paths map to host paths. The agent environment is a fresh temporary
directory E: `/app` (the working directory of the agent, and of a shared-mode verifier) is
`E/app`, `/logs/artifacts` is `E/logs/artifacts`; `/logs/agent` and `/logs/verifier` are
the trial's own `agent/` and `verifier/` (Harbor mounts them). After the agent (and a
shared-mode verifier) ran, `E/logs/artifacts` is collected into the trial and E deleted. A
separate-mode verifier, in `start` or `regrade`, runs in another fresh directory V holding
`V/app` (empty), `V/logs/artifacts` (the collected artifacts) and `V/tests` (a copy of
the task's tests), so it never sees the agent's working directory. A shared-mode verifier
runs the task's own `tests/test.sh` in place (so a script may keep state beside the task).

The agent: a chat harness that sends the task's `instruction.md` to `<base-url>/chat/
completions` and keeps the conversation going for `turns` turns; it writes the last answer
to `/logs/agent/answer.txt` and publishes it as `/logs/artifacts/answer.txt`. The verifier:
the task's `tests/test.sh`, run with `REWARD_FILE` (`/logs/verifier/reward.txt`),
`ARTIFACTS_DIR` (its environment's `/logs/artifacts`), the `--ve` variables and, for a
shared-mode verifier only, `ANSWER` (the agent's last answer); its `reward.txt` is the
reward. A task's `standin.json` may ask for a failure: `{"raise": "<Harbor exception
type>"}` (after the agent ran, the verifier still grading it as Harbor's error policy says),
`{"crash": 3}` (exit 3 with no result), `{"sleep": s}` (a slow agent), or an exploit:
`{"exploit": true}` (the agent also writes its answer to `/app/expected.txt`, a file a
careless in-environment verifier may trust).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import uuid
from pathlib import Path

GRADED = {
    "NonZeroAgentExitCodeError",
    "AgentTimeoutError",
    "ContextLengthExceededError",
    "AgentSafetyRefusalError",
}  # Harbor's error policy: should_grade for these; not for environment failures
CONVENTION = "/logs/artifacts"  # the agent's artifact directory in the environment
COLLECTED = "artifacts/logs/artifacts"  # where a trial keeps it (its manifest destination)


class RegradeError(Exception):
    """A recorded trial that cannot be regraded (Harbor's `RegradeError`)."""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def chat(base_url: str, model: str, messages: list[dict[str, str]]) -> tuple[int, dict]:
    body = json.dumps({"model": model, "messages": messages, "max_tokens": 6}).encode()
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer EMPTY"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, {"error": error.read().decode(errors="replace")}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="harbor")
    commands = parser.add_subparsers(dest="group", required=True)
    trial = commands.add_parser("trial").add_subparsers(dest="command", required=True)
    start = trial.add_parser("start")
    start.add_argument("-p", "--path", type=Path, required=True)
    start.add_argument("--trial-name", required=True)
    start.add_argument("--trials-dir", type=Path, default=Path("trials"))
    start.add_argument("-a", "--agent", required=True)
    start.add_argument("-m", "--model", required=True)
    start.add_argument("--base-url", required=True)
    start.add_argument("--allow-agent-host", action="append", default=[])
    start.add_argument("--api-key-name")
    start.add_argument("--agent-timeout", type=float)
    regrade = trial.add_parser("regrade")
    regrade.add_argument("source")
    regrade.add_argument("-p", "--task-path", type=Path, required=True)
    regrade.add_argument("--trial-name")
    regrade.add_argument("-o", "--trials-dir", type=Path, default=Path("trials"))
    regrade.add_argument("-e", "--env")
    regrade.add_argument("--ve", "--verifier-env", action="append", default=[])
    return parser.parse_args(argv)


def task_config(task: Path) -> dict:
    return tomllib.loads((task / "task.toml").read_text())


def task_name(task: Path) -> str:
    """`[task].name` from task.toml, or the directory's name (Harbor's `local_task_name`)."""
    return str(task_config(task).get("task", {}).get("name", task.name))


def separate(task: Path) -> bool:
    return task_config(task).get("verifier", {}).get("environment_mode") == "separate"


def collect(environment: Path, trial_dir: Path) -> None:
    """The environment's `/logs/artifacts` into the trial, with Harbor's manifest entry."""
    published = environment / "logs" / "artifacts"
    target = trial_dir / COLLECTED
    shutil.copytree(published, target, dirs_exist_ok=True)
    entry = {"source": CONVENTION, "destination": COLLECTED, "type": "directory",
             "status": "ok" if any(target.iterdir()) else "empty", "service": "main",
             "exclude": []}  # fmt: skip
    (trial_dir / "artifacts" / "manifest.json").write_text(json.dumps([entry], indent=2))


def verify(task: Path, trial_dir: Path, workspace: Path | None, env: dict[str, str]) -> dict | None:
    """Run the task's verifier; its rewards, or None without a reward file. `workspace`:
    the agent's working directory (a shared-mode verifier), or None (a fresh separate
    verifier environment with only the trial's collected artifacts and the task's tests)."""
    reward_file = trial_dir / "verifier" / "reward.txt"
    reward_file.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="harbor-standin-verifier-") as fresh:
        if workspace is None:
            root = Path(fresh)
            (root / "app").mkdir()
            shutil.copytree(trial_dir / COLLECTED, root / "logs" / "artifacts")
            shutil.copytree(task / "tests", root / "tests")
            script, cwd, artifacts = root / "tests" / "test.sh", root / "app", root
        else:
            script, cwd, artifacts = task / "tests" / "test.sh", workspace, workspace.parent
        env = {**os.environ, **env, "REWARD_FILE": str(reward_file),
               "ARTIFACTS_DIR": str(artifacts / "logs" / "artifacts")}  # fmt: skip
        subprocess.run(["sh", str(script)], env=env, cwd=cwd, check=False)
    if not reward_file.exists():
        return None
    return {"rewards": {"reward": float(reward_file.read_text())}}


def write_result(trial_dir: Path, task: Path, config: dict, fields: dict) -> None:
    """`result.json` as a `TrialResult`; `fields` holds `agent_info`, `verifier_result`,
    `exception` (a (type, message) pair or None) and `started_at`."""
    exception = fields.pop("exception")
    result = {
        "schema_version": 1,
        "task_name": task_name(task),
        "trial_name": trial_dir.name,
        "trial_uri": trial_dir.resolve().as_uri(),
        "task_id": {"path": str(task)},
        "task_checksum": hashlib.sha256((task / "instruction.md").read_bytes()).hexdigest(),
        "config": config,
        "agent_result": None,
        "exception_info": None
        if exception is None
        else {
            "exception_type": exception[0],
            "exception_message": exception[1],
            "exception_traceback": "",
            "occurred_at": now(),
        },
        **fields,
        "finished_at": now(),
    }
    (trial_dir / "result.json").write_text(json.dumps(result, indent=2))


def run_agent(options: argparse.Namespace, task: Path, plan: dict, trial_dir: Path,
              environment: Path) -> tuple[str, tuple[str, str] | None]:  # fmt: skip
    """The chat harness in `environment`: (its last answer, an exception or None)."""
    time.sleep(float(plan.get("sleep", 0)))
    messages = [{"role": "user", "content": (task / "instruction.md").read_text().strip()}]
    answer, exception = "", None
    for turn in range(int(plan.get("turns", 2))):
        status, reply = chat(options.base_url, options.model, messages)
        if status != 200:
            exception = ("InternalServerError", f"the model API answered {status}: {reply}")
            break
        answer = reply["choices"][0]["message"]["content"]
        messages += [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": f"turn {turn + 1}: continue"},
        ]
    (trial_dir / "agent" / "answer.txt").write_text(answer)
    (environment / "logs" / "artifacts" / "answer.txt").write_text(answer)
    if plan.get("exploit"):
        (environment / "app" / "expected.txt").write_text(answer)
    if exception is None and "raise" in plan:
        exception = (plan["raise"], "raised by the stand-in on the task's request")
    return answer, exception


def start(options: argparse.Namespace) -> int:
    task = options.path.resolve()
    plan = (
        json.loads((task / "standin.json").read_text()) if (task / "standin.json").exists() else {}
    )
    trial_dir = options.trials_dir / options.trial_name
    (trial_dir / "agent").mkdir(parents=True)
    (trial_dir / "verifier").mkdir()
    config = {
        "task": {"path": str(task)},
        "trial_name": options.trial_name,
        "trials_dir": str(options.trials_dir),
        "agent": {
            "name": options.agent,
            "model_name": options.model,
            "base_url": options.base_url,
            "extra_allowed_hosts": options.allow_agent_host,
        },
    }
    (trial_dir / "config.json").write_text(json.dumps(config, indent=2))
    if "crash" in plan:
        print("stand-in: crashing before any result", file=sys.stderr)
        return int(plan["crash"])
    started = now()
    with tempfile.TemporaryDirectory(prefix="harbor-standin-env-") as name:
        environment = Path(name)
        (environment / "app").mkdir()
        (environment / "logs" / "artifacts").mkdir(parents=True)
        answer, exception = run_agent(options, task, plan, trial_dir, environment)
        verifier_result = None
        graded = exception is None or exception[0] in GRADED
        if graded and not separate(task):
            workspace = environment / "app"
            verifier_result = verify(task, trial_dir, workspace, {"ANSWER": answer})
        collect(environment, trial_dir)
    if graded and separate(task):
        verifier_result = verify(task, trial_dir, None, {})
    agent_info = {"name": options.agent, "version": "stand-in",
                  "model_info": {"name": options.model, "provider": None}}  # fmt: skip
    write_result(trial_dir, task, config, {"agent_info": agent_info, "started_at": started,
                 "verifier_result": verifier_result, "exception": exception})  # fmt: skip
    print(f"Trial completed! Trial name: {options.trial_name}")
    return 0


def regrade_task(options: argparse.Namespace, source: dict) -> Path:
    """The task directory to regrade with (Harbor's checks before any trial exists)."""
    path = options.task_path.expanduser()
    if not path.is_dir():
        raise ValueError(f"Task path does not exist or is not a directory: {path}")
    wanted = source["task_name"]
    candidates = (
        [path]
        if (path / "task.toml").exists()
        else sorted(c for c in path.iterdir() if (c / "task.toml").exists())
    )
    if len(candidates) > 1:
        candidates = [c for c in candidates if task_name(c) == wanted]
    if len(candidates) != 1:
        raise ValueError(f"No task named '{wanted}' (or several) found under {path}.")
    if task_name(candidates[0]) != wanted:
        raise ValueError(f"Task name mismatch: source trial ran task '{wanted}' but "
                         f"{candidates[0]} provides '{task_name(candidates[0])}'.")  # fmt: skip
    task = candidates[0].resolve()
    if not separate(task):
        raise ValueError(
            f"Task at {task} resolves to a shared-mode verifier, which needs a live agent "
            "environment; regrade re-runs verification against recorded artifacts only."
        )
    return task


def replay(source_dir: Path, trial_dir: Path) -> None:
    """Check the source's artifact record, then copy its `agent/` and `artifacts/`."""
    manifest = source_dir / "artifacts" / "manifest.json"
    if not manifest.exists():
        raise RegradeError(f"Source trial '{source_dir.name}' has no artifacts/manifest.json; "
                           "artifact coverage cannot be verified.")  # fmt: skip
    entries = [e for e in json.loads(manifest.read_text()) if e["source"] == CONVENTION]
    if not entries or entries[-1]["destination"] != COLLECTED:
        raise RegradeError(f"{CONVENTION}: never collected (no manifest entry); the verifier "
                           "would silently grade without it")  # fmt: skip
    if entries[-1]["status"] == "ok" and not (source_dir / COLLECTED).is_dir():
        raise RegradeError(f"{CONVENTION}: collected artifact no longer exists on disk")
    for name in ("agent", "artifacts"):
        if (source_dir / name).is_dir():
            shutil.copytree(source_dir / name, trial_dir / name, dirs_exist_ok=True)
    (trial_dir / COLLECTED).mkdir(parents=True, exist_ok=True)


def regrade(options: argparse.Namespace) -> int:
    source_dir = Path(options.source)
    try:
        source = json.loads((source_dir / "result.json").read_text())
    except (OSError, ValueError):
        print(f"Error: {source_dir} has no readable result.json; nothing to regrade.")
        return 1
    try:
        task = regrade_task(options, source)
    except ValueError as error:
        print(f"Error: {error}")
        return 1
    name = options.trial_name or f"{source['task_name']}__{uuid.uuid4().hex[:7]}"
    trial_dir = options.trials_dir / name
    (trial_dir / "verifier").mkdir(parents=True)
    variables = dict(v.split("=", 1) for v in options.ve)
    config = {"task": {"path": str(task)}, "trial_name": name,
              "trials_dir": str(options.trials_dir), "agent": source["config"].get("agent"),
              "environment": {"type": options.env or "docker"},
              "verifier": {"env": variables},
              "source_trial": {"action": "regrade", "type": "local",
                               "path": str(source_dir.resolve())}}  # fmt: skip
    (trial_dir / "config.json").write_text(json.dumps(config, indent=2))
    started, verifier_result, exception = now(), None, None
    try:
        replay(source_dir, trial_dir)
        verifier_result = verify(task, trial_dir, None, variables)
    except Exception as error:  # noqa: BLE001 - the trial records it, as Harbor's does
        exception = (type(error).__name__, str(error))
    carried = source.get("exception_info")
    if exception is None and carried is not None:  # the source's agent error stays
        exception = (carried["exception_type"], carried.get("exception_message", ""))
    write_result(trial_dir, task, config, {"agent_info": source.get("agent_info"),
                 "started_at": started, "verifier_result": verifier_result,
                 "exception": exception})  # fmt: skip
    if exception is not None:
        print(f"Error: {exception[0]}\nMessage: {exception[1]}")
        return 1
    print(f"Regrade completed!\nRegraded rewards: {(verifier_result or {}).get('rewards')}")
    return 0


def main() -> int:
    options = parse(sys.argv[1:])
    return start(options) if options.command == "start" else regrade(options)


if __name__ == "__main__":
    sys.exit(main())
