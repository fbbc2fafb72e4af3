"""A stand-in `harbor` executable: `harbor trial start` with Harbor 0.26.0's options and
result layout, running the agent and the verifier as host processes instead of in
containers.

Why a stand-in: a real Harbor trial drives `docker compose` (the machine's private
Docker engine has no compose plugin), builds the task's image from its Dockerfile and
installs the agent inside it, both of which need registries these machines cannot reach.

What it follows (Harbor 0.26.0 wheel): the options of `harbor/cli/trials.py::start` it
accepts (`-p/--path`, `--trial-name`, `--trials-dir`, `-a/--agent`, `-m/--model`,
`--base-url`, `--allow-agent-host`, `--api-key-name`, `--agent-timeout`; any other option
is an error, as in Harbor); the trial directory `<trials-dir>/<trial-name>/` with
`config.json`, `agent/`, `verifier/reward.txt` and `result.json`
(`harbor/models/trial/paths.py`); `result.json` as `TrialResult`
(`harbor/models/trial/result.py`: `task_name`, `trial_name`, `trial_uri`, `task_id`,
`task_checksum`, `config`, `agent_info`, `verifier_result.rewards`, `exception_info` with
`exception_type`, `exception_message`, `exception_traceback`, `occurred_at`); the exit
code 0 after a trial whatever its exception (the CLI prints it and returns).

The agent: a chat harness that sends the task's `instruction.md` to `<base-url>/chat/
completions` and keeps the conversation going for `turns` turns, writing the last answer
to `agent/answer.txt`. The verifier: the task's `tests/test.sh`, run with `ANSWER` and
`REWARD_FILE` in its environment, whose `reward.txt` is the reward. A task's
`standin.json` may ask for a failure: `{"raise": "<Harbor exception type>"}` (after the
agent ran, the verifier still grading it as Harbor's error policy says), `{"crash": 3}`
(exit 3 with no result), `{"sleep": s}` (a slow agent).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

GRADED = {
    "NonZeroAgentExitCodeError",
    "AgentTimeoutError",
    "ContextLengthExceededError",
    "AgentSafetyRefusalError",
}  # Harbor's error policy: should_grade for these; not for environment failures


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


def main() -> int:
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
    options = parser.parse_args()

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
    exception = None
    time.sleep(float(plan.get("sleep", 0)))
    messages = [{"role": "user", "content": (task / "instruction.md").read_text().strip()}]
    answer = ""
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
    if exception is None and "raise" in plan:
        exception = (plan["raise"], "raised by the stand-in on the task's request")
    verifier_result = None
    if exception is None or exception[0] in GRADED:
        reward_file = trial_dir / "verifier" / "reward.txt"
        env = {**os.environ, "ANSWER": answer, "REWARD_FILE": str(reward_file)}
        subprocess.run(["sh", str(task / "tests" / "test.sh")], env=env, check=False)
        if reward_file.exists():
            verifier_result = {"rewards": {"reward": float(reward_file.read_text())}}
    checksum = hashlib.sha256((task / "instruction.md").read_bytes()).hexdigest()
    result = {
        "schema_version": 1,
        "task_name": task.name,
        "trial_name": options.trial_name,
        "trial_uri": trial_dir.resolve().as_uri(),
        "task_id": {"path": str(task)},
        "task_checksum": checksum,
        "config": config,
        "agent_info": {
            "name": options.agent,
            "version": "stand-in",
            "model_info": {"name": options.model, "provider": None},
        },
        "agent_result": None,
        "verifier_result": verifier_result,
        "exception_info": None
        if exception is None
        else {
            "exception_type": exception[0],
            "exception_message": exception[1],
            "exception_traceback": "",
            "occurred_at": now(),
        },
        "started_at": started,
        "finished_at": now(),
    }
    (trial_dir / "result.json").write_text(json.dumps(result, indent=2))
    print(f"Trial completed! Trial name: {options.trial_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
