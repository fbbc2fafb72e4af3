"""`HarborSource(regrade=HarborRegrade(...))`: every trial with a reward is re-graded by the
stand-in's `harbor trial regrade` (harbor_standin.py: Harbor 0.26.0's command, a separate
verifier environment holding only the recorded artifacts).

The planted exploit: the `planted` task's verifier trusts an `expected.txt` it finds in the
agent's working directory, and its agent (standin.json `exploit`) writes its own answer
there. Run in the agent's environment (a shared-mode verifier) the exploit pays 1.0; the
same verifier in a hardened copy of the task (`environment_mode = "separate"`), which sees
only the recorded `/logs/artifacts/answer.txt`, gives 0.0, so the session is rejected,
counted, and never admitted by the scheduler.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from gateway_fakes import FakeChatVLLM, GatewayProcess
from test_rollout_harbor import STANDIN, make_task

from dew.objectives.rl.sessions import Status, Task
from dew.rollout import Gateway, HarborRegrade, HarborSource, SandboxProxy

#: Trusts a planted expected.txt in its working directory; the true answer is 42 (which
#: the fake engine, answering in lowercase letters, never gives).
TRUSTING = """#!/bin/sh
want=42
[ -f expected.txt ] && want=$(cat expected.txt)
if [ "$(cat "$ARTIFACTS_DIR/answer.txt")" = "$want" ]; then echo 1; else echo 0; fi > "$REWARD_FILE"
"""
#: Grades the recorded answer only (1 for a-m, 0.25 otherwise); SLOW=1 makes it wait.
RECORDED = """#!/bin/sh
[ -n "$SLOW" ] && sleep 60
case "$(cat "$ARTIFACTS_DIR/answer.txt")" in
  [a-m]*) echo 1 > "$REWARD_FILE" ;;
  *) echo 0.25 > "$REWARD_FILE" ;;
esac
"""
SEPARATE = '\n[verifier]\nenvironment_mode = "separate"\n'


def separate_task(root: Path, name: str, plan: dict | None = None, grade: str = RECORDED) -> Path:
    task = make_task(root, name, plan, grade)
    with open(task / "task.toml", "a") as toml:
        toml.write(SEPARATE)
    return task


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    engine = FakeChatVLLM()
    process = GatewayProcess(engine.url, tmp_path_factory.mktemp("gateway"))
    proxy = SandboxProxy(process.url)
    gateway = Gateway(process.url, sandbox_url=proxy.url, timeout=10)
    gateway.stamp(0)
    yield gateway
    gateway.close()
    proxy.close()
    process.close()
    engine.close()


@pytest.fixture
def tasks(tmp_path):
    """The trials' tasks, and their hardened copies (separate-mode verifiers) by name."""
    live, hardened = tmp_path / "tasks", tmp_path / "hardened"
    made = {
        "planted": make_task(live, "planted", {"exploit": True}, TRUSTING),
        "fair": make_task(live, "fair", None, TRUSTING),
        "graded": separate_task(live, "graded"),
    }
    for name, task in made.items():
        shutil.copytree(task, hardened / name)
        if name != "graded":
            with open(hardened / name / "task.toml", "a") as toml:
                toml.write(SEPARATE)
    return made, hardened


def source(gateway, trials: Path, regrade=None, **options) -> HarborSource:
    return HarborSource(gateway, harbor=STANDIN, model="tiny-chat", trials=trials, workers=3,
                        regrade=regrade, **options)  # fmt: skip


def run(harbor: HarborSource, tasks: dict[str, Path]) -> dict:
    futures = {name: harbor.submit(Task(name, str(path)), seed=0) for name, path in tasks.items()}
    return {name: future.result(timeout=90) for name, future in futures.items()}


def test_without_regrade_the_planted_exploit_pays(stack, tasks, tmp_path):
    made, _ = tasks
    with source(stack, tmp_path / "trials") as harbor:
        got = run(harbor, made)
        assert harbor.metrics() == {}
    assert got["planted"].status is Status.COMPLETED and got["planted"].reward == 1.0
    assert got["fair"].reward == 0.0 and got["graded"].reward in (1.0, 0.25)
    (trial,) = [p for p in (tmp_path / "trials").iterdir() if p.is_dir() and
                json.loads((p / "result.json").read_text())["task_name"] == "planted"]  # fmt: skip
    # only what the agent published is recorded: its answer, never the planted file
    recorded = trial / "artifacts" / "logs" / "artifacts"
    assert sorted(p.name for p in recorded.iterdir()) == ["answer.txt"]
    assert recorded.joinpath("answer.txt").read_text() == (trial / "agent/answer.txt").read_text()
    (entry,) = json.loads((trial / "artifacts" / "manifest.json").read_text())
    assert entry["source"] == "/logs/artifacts" and entry["status"] == "ok"


def test_regrade_rejects_the_exploit_and_honest_answers_agree(stack, tasks, tmp_path):
    made, hardened = tasks
    with source(stack, tmp_path / "trials", HarborRegrade(tasks=hardened)) as harbor:
        got = run(harbor, made)
        counts, metrics = harbor.regrade_counts, harbor.metrics()
    planted = got["planted"]
    assert planted.status is Status.INFRA_ERROR and planted.reward is None
    assert planted.detail.startswith(
        "regrade rejected: in-environment reward 1.0, clean sandbox 0.0; seed 0; session dew-"
    )
    assert got["fair"].status is Status.COMPLETED and got["fair"].reward == 0.0
    assert got["graded"].status is Status.COMPLETED and got["graded"].reward in (1.0, 0.25)
    assert counts == {"regraded": 3, "agreed": 2, "rejected": 1, "failed": 0}
    assert metrics == {"regrade/regraded": 3.0, "regrade/agreed": 2.0, "regrade/rejected": 1.0,
                       "regrade/failed": 0.0}  # fmt: skip
    session = planted.detail.rsplit("session ", 1)[1]
    regraded = tmp_path / "trials" / f"{session}-regrade"
    config = json.loads((regraded / "config.json").read_text())
    assert config["source_trial"]["path"] == str((tmp_path / "trials" / session).resolve())
    assert config["task"]["path"] == str(hardened / "planted")
    result = json.loads((regraded / "result.json").read_text())
    assert result["verifier_result"]["rewards"] == {"reward": 0.0}
    assert (regraded / "agent" / "answer.txt").exists()  # the source's agent/ was restored


@pytest.mark.parametrize(
    ("plan", "status", "counts", "detail"),
    [
        (None, Status.INFRA_ERROR, {"regraded": 1, "agreed": 0, "rejected": 0, "failed": 1},
         "regrade failed: HarborRegradeError: harbor trial regrade exited 1 without a "
         "readable"),
        ({"raise": "NonZeroAgentExitCodeError"}, Status.AGENT_ERROR,
         {"regraded": 1, "agreed": 1, "rejected": 0, "failed": 0}, "NonZeroAgentExitCodeError"),
    ],
)  # fmt: skip
def test_regrade_failures_and_carried_agent_errors(stack, tmp_path, plan, status, counts, detail):
    """A shared-mode task cannot be regraded (Harbor's error is in the detail); an agent
    error that Harbor carries into the regrade (it then exits 1) still agrees."""
    if plan is None:
        task = make_task(tmp_path / "tasks", "shared", None, TRUSTING)
    else:
        task = separate_task(tmp_path / "tasks", "failing", plan)
    with source(stack, tmp_path / "trials", HarborRegrade()) as harbor:
        session = run(harbor, {"t": task})["t"]
        assert harbor.regrade_counts == counts
    assert session.status is status and detail in session.detail, session.detail
    if plan is None:
        assert "resolves to a shared-mode verifier" in session.detail and session.reward is None
    else:
        assert session.reward in (1.0, 0.25)


def test_cancel_kills_the_regrade(stack, tmp_path):
    task = separate_task(tmp_path / "tasks", "slow")
    regrade = HarborRegrade(verifier_env={"SLOW": "1"}, environment="docker")
    with source(stack, tmp_path / "trials", regrade) as harbor:
        future = harbor.submit(Task("slow", str(task)), seed=0)
        deadline = time.monotonic() + 60
        while not list((tmp_path / "trials").glob("*-regrade/config.json")):
            assert time.monotonic() < deadline, "the regrade never started"
            time.sleep(0.05)
        (config,) = (tmp_path / "trials").glob("*-regrade/config.json")
        assert json.loads(config.read_text())["verifier"]["env"] == {"SLOW": "1"}
        started = time.monotonic()
        harbor.cancel(future)
        session = future.result(timeout=30)
        assert session.status is Status.CANCELLED and time.monotonic() - started < 15
        assert "cancelled while re-graded" in session.detail
        assert harbor.regrade_counts["regraded"] == 0  # a cancel counts nothing


class NoRescore:
    """The scheduler's objective with nothing to rescore: zero log-probabilities."""

    width = 128

    def __init__(self) -> None:
        self.packed_log_probs = lambda variables, batch: np.zeros(
            np.shape(batch["input_ids"]), np.float32
        )


def test_the_scheduler_never_admits_the_rejected_exploit(stack, tasks, tmp_path):
    """Through `RolloutScheduler`: the exploit is drawn again (rejected every time) until
    its group is abandoned; the honest group trains; the record carries the counts."""
    from dew.data import Dataset
    from dew.data.dataset import Partition
    from dew.rollout import Publication, RolloutScheduler, task_ids

    made, hardened = tasks
    table = {3: str(made["fair"]), 4: str(made["planted"])}
    harbor = source(stack, tmp_path / "trials", HarborRegrade(tasks=hardened), tasks=table)
    records: list = []
    scheduler = RolloutScheduler(NoRescore(), harbor, Publication(lambda variables, version: None),
                                 width=128, rows=4, tasks=task_ids, groups=1, max_lag=0, ahead=0,
                                 max_attempts=2, log=records.append)  # fmt: skip
    batches = [{"task_id": np.array([3, 4], np.int32)}]
    data = Dataset(train=lambda partition, start=0: iter(batches[start:]), batch=2)
    try:
        scheduler.at_step(1, 0)
        scheduler({}, dict(next(scheduler.tasks(data).stream(Partition(), 0))), None)
    finally:
        scheduler.close()
        harbor.close()
    (record,) = records
    assert record.admitted_groups == 1 and record.abandoned == 1
    assert [s.task for s in scheduler.last_sessions] == [3]
    assert record.resubmitted == {"infra_error": 1}  # the exploit's second attempt
    assert record.metrics["regrade/rejected"] == 2.0 and record.metrics["regrade/agreed"] == 1.0


def test_the_standin_regrade_refuses_what_harbor_refuses(tmp_path):
    def regrade(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*STANDIN, "trial", "regrade", *args], capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    task = separate_task(tmp_path / "tasks", "lone")
    done = regrade(str(tmp_path / "nowhere"), "-p", str(task), "--bogus")
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr
    done = regrade(str(tmp_path / "nowhere"), "-p", str(task))
    assert done.returncode == 1 and "has no readable result.json; nothing to regrade" in done.stdout
    source_dir = tmp_path / "trials" / "old"  # a record without an artifact manifest
    source_dir.mkdir(parents=True)
    source_dir.joinpath("result.json").write_text(json.dumps({"task_name": "lone", "config": {}}))
    done = regrade(str(source_dir), "-p", str(task), "--trial-name", "new", "-o",
                   str(tmp_path / "trials"))  # fmt: skip
    result = json.loads((tmp_path / "trials" / "new" / "result.json").read_text())
    assert done.returncode == 1 and result["exception_info"]["exception_type"] == "RegradeError"
    assert "has no artifacts/manifest.json" in result["exception_info"]["exception_message"]
    separate_task(tmp_path / "tasks", "other")  # a directory of tasks: matched by name
    done = regrade(str(source_dir), "-p", str(tmp_path / "tasks"), "--trial-name", "other", "-o",
                   str(tmp_path / "trials"))  # fmt: skip
    assert done.returncode == 1 and (tmp_path / "trials" / "other" / "result.json").exists()
    done = regrade(str(source_dir), "-p", str(tmp_path / "tasks" / "other"))
    assert (
        done.returncode == 1 and "Task name mismatch: source trial ran task 'lone'" in done.stdout
    )


def test_bad_regrade_options_are_refused(stack, tmp_path):
    with pytest.raises(ValueError, match=r"regrade\.tolerance: expected a finite number >= 0"):
        HarborRegrade(tolerance=-1)
    with pytest.raises(FileNotFoundError, match=r"regrade\.tasks: '.*nowhere' is not a directory"):
        HarborRegrade(tasks=tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"regrade\.verifier_env: expected a mapping"):
        HarborRegrade(verifier_env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="regrade: expected a HarborRegrade or None"):
        source(stack, tmp_path, regrade=True)
