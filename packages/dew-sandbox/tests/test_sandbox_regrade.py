"""Re-grading tool episodes in a clean sandbox: ``EnvironmentSource(regrade=SandboxRegrader)``.

The worker (``answer_worker.py``, real subprocesses through ``SubprocessEnvironment``) has a
flawed verifier: it trusts an ``expected.txt`` it finds next to the answer. A policy that
plants that file gets 1.0 in the environment; re-graded on a ``ProcessRunner`` fleet, where
only ``answer.txt`` travels, the same verifier code gives 0.0 and the sample is dropped and
counted. The policy is a scripted server (no model): it answers each task from a table.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future

import numpy as np
import pytest

from dew.objectives.rl.sessions import Status, Task
from dew.rollout import EnvironmentSource
from dew.rollout.draw import Draw
from dew.rollout.sources.regrade import Regrade
from dew.sandbox import ProcessRunner, SandboxFleet, SandboxLimits, SubprocessEnvironment
from dew.sandbox.regrade import RegradeError, SandboxRegrader

WORKER = pathlib.Path(__file__).with_name("answer_worker.py")
EOS, SAY, PLANT = 1, 3, 5
LIMITS = SandboxLimits(cpu_seconds=5, deadline_seconds=20)


def digits(number: int) -> list[int]:
    return [4 + int(c) for c in str(number)]


class ScriptedPolicy:
    """A ``RolloutServer`` stand-in: the reply to a context ``[QUESTION, digit]`` is
    ``turns[task % 10]`` followed by EOS, drawn at once."""

    def __init__(self, turns: dict[int, list[int]]) -> None:
        self.turns = turns

    def submit(self, prompt_ids, max_new_tokens, *, seed):
        ids = np.asarray([*self.turns[int(prompt_ids[1]) - 4], EOS], np.int32)
        draw = Draw(np.asarray(prompt_ids, np.int32), ids, np.zeros(len(ids), np.float32),
                    None, eos=True, version=0)  # fmt: skip
        future: Future[Draw] = Future()
        future.set_result(draw)
        return future


#: Task 3 answers honestly (9), task 4 plants a wrong answer (7) and its expected file,
#: task 5 answers wrongly (7) without planting.
TURNS = {3: [SAY, *digits(9)], 4: [PLANT, *digits(7)], 5: [SAY, *digits(7)]}


def outcome(task, episode) -> float:  # the worker's verdict, as ``verifier: outcome`` reads it
    return float(episode.detail)


@pytest.fixture(scope="module")
def fleet():
    with SandboxFleet(ProcessRunner(), limits=LIMITS, workers=2) as fleet:
        yield fleet


def regrader(fleet: SandboxFleet) -> SandboxRegrader:
    inputs = {"verify.py": WORKER.read_text()}  # the task's own verifier, never the policy's
    return SandboxRegrader(fleet, ["python3", "verify.py", "verify"], ["answer.txt"], inputs)


def source(regrade=None) -> EnvironmentSource:
    environment = SubprocessEnvironment([sys.executable, str(WORKER)], LIMITS)
    return EnvironmentSource(ScriptedPolicy(TURNS), lambda task, identity: environment(identity),
                             outcome, max_prompt_tokens=8, max_new_tokens=4, max_turns=2,
                             workers=3, regrade=regrade)  # fmt: skip


def sessions(run: EnvironmentSource) -> dict[int, object]:
    try:
        futures = {task: run.submit(Task(task), seed=task) for task in (3, 4, 5)}
        return {task: future.result(timeout=60) for task, future in futures.items()}
    finally:
        run.close()


def test_without_regrade_the_planted_file_is_rewarded() -> None:
    run = source()
    got = sessions(run)
    assert got[4].status is Status.COMPLETED and got[4].reward == 1.0  # the exploit pays
    assert got[3].reward == 1.0 and got[5].reward == 0.0
    assert run.regrade_counts == {"regraded": 0, "agreed": 0, "rejected": 0, "failed": 0}


def test_regrade_drops_the_exploited_episode_and_counts_it(fleet: SandboxFleet) -> None:
    run = source(regrader(fleet))
    got = sessions(run)
    exploited = got[4]
    assert exploited.status is Status.INFRA_ERROR  # a failed attempt: never admitted
    assert exploited.reward is None
    assert exploited.detail == "regrade rejected: in-environment reward 1.0, clean sandbox 0.0"
    assert len(exploited.calls) == 1  # the session's calls are kept for the record
    # the honest episode passes both ways, and so does an honest failure (0.0 twice)
    assert got[3].status is Status.COMPLETED and got[3].reward == 1.0
    assert got[5].status is Status.COMPLETED and got[5].reward == 0.0
    assert run.regrade_counts == {"regraded": 3, "agreed": 2, "rejected": 1, "failed": 0}


class NoRescore:
    """The scheduler's objective with nothing to rescore: zero log-probabilities."""

    width = 16

    def __init__(self) -> None:
        self.packed_log_probs = lambda variables, batch: np.zeros(
            np.shape(batch["input_ids"]), np.float32
        )


def test_the_scheduler_never_admits_a_rejected_sample_and_records_it(fleet) -> None:
    """Through ``RolloutScheduler``: the exploit is drawn again (the regrader rejects every
    attempt) until its group is abandoned; the honest group trains; the record counts both."""
    from dew.data import Dataset
    from dew.data.dataset import Partition
    from dew.rollout import Publication, RolloutScheduler, task_ids

    run = source(regrader(fleet))
    records: list = []
    scheduler = RolloutScheduler(NoRescore(), run, Publication(lambda variables, version: None),
                                 width=16, rows=2, tasks=task_ids, groups=1, max_lag=0,
                                 ahead=0, max_attempts=2, log=records.append)  # fmt: skip
    batches = [{"task_id": np.array([3, 4], np.int32)}]
    data = Dataset(train=lambda partition, start=0: iter(batches[start:]), batch=2)
    try:
        scheduler.at_step(1, 0)
        scheduler({}, dict(next(scheduler.tasks(data).stream(Partition(), 0))), None)
    finally:
        scheduler.close()
        run.close()
    (record,) = records
    assert record.admitted_groups == 1 and record.abandoned == 1
    assert [s.task for s in scheduler.last_sessions] == [3]
    assert record.resubmitted == {"infra_error": 1}  # the exploit's second attempt
    assert record.metrics["regrade/rejected"] == 2.0 and record.metrics["regrade/agreed"] == 1.0


class Broken:
    def collect(self, task, environment):
        raise OSError("worker directory gone")

    def grade(self, task, artifact):
        raise AssertionError("never reached")


def test_a_regrader_that_raises_fails_the_session() -> None:
    run = source(Broken())
    got = sessions(run)
    assert all(s.status is Status.INFRA_ERROR and s.reward is None for s in got.values())
    assert got[3].detail == "regrade failed: OSError: worker directory gone"
    assert run.regrade_counts == {"regraded": 3, "agreed": 0, "rejected": 0, "failed": 3}


class Open:
    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = str(directory)


def test_collect_reads_regular_files_only(tmp_path: pathlib.Path, fleet: SandboxFleet) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "answer.txt").write_text("9")
    (tmp_path / "secret").write_text("host file")
    os.symlink(tmp_path / "secret", work / "link.txt")
    os.symlink(tmp_path, work / "up")
    grader = SandboxRegrader(fleet, ["python3", "-c", "print(1)"],
                             ["answer.txt", "link.txt", "up/secret", "missing.txt"])  # fmt: skip
    assert grader.collect(Task(3), Open(work)) == {"answer.txt": b"9"}
    small = SandboxRegrader(fleet, ["python3", "-c", "print(1)"], ["answer.txt"], max_bytes=1)
    (work / "answer.txt").write_text("81")
    with pytest.raises(RegradeError, match="artifact 'answer.txt': expected at most 1 bytes"):
        small.collect(Task(9), Open(work))
    with pytest.raises(TypeError, match="environment: expected an open SubprocessSession"):
        grader.collect(Task(3), object())


def test_inputs_win_over_the_artifact_and_failures_raise(fleet: SandboxFleet) -> None:
    grader = SandboxRegrader(fleet, ["python3", "verify.py", "verify"], ["verify.py", "answer.txt"],
                             lambda task: {"verify.py": WORKER.read_text()})  # fmt: skip
    planted = {"verify.py": b"print(1.0)", "answer.txt": b"7"}
    assert grader.grade(Task(4), planted) == 0.0  # the task's verifier ran, not the planted one
    silent = SandboxRegrader(fleet, ["python3", "-c", "print('yes')"], ["answer.txt"])
    with pytest.raises(RegradeError, match="expected a finite number as its last line, got 'yes'"):
        silent.grade(Task(4), {})
    crash = SandboxRegrader(fleet, ["python3", "-c", "raise SystemExit(3)"], ["answer.txt"])
    with pytest.raises(RegradeError, match=r"expected it to complete, got FAILED \(exit 3\)"):
        crash.grade(Task(4), {})


def test_refusals(fleet: SandboxFleet) -> None:
    with pytest.raises(ValueError, match="files: expected a nonempty list of relative paths"):
        SandboxRegrader(fleet, ["true"], "answer.txt")
    with pytest.raises(ValueError, match="Program.files: expected relative paths"):
        SandboxRegrader(fleet, ["true"], ["../answer.txt"])
    with pytest.raises(TypeError, match="regrade: expected an object with collect"):
        Regrade(object())
    with pytest.raises(ValueError, match="regrade_tolerance: expected a finite number >= 0"):
        Regrade(Broken(), tolerance=-1.0)


#: A clean verifier that says where it runs (its pid, written whole) and then takes 30 s.
SLEEPER = """import os, sys, time
open(sys.argv[1] + ".part", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".part", sys.argv[1])
time.sleep(30)
print(1.0)
"""


def alive(pid: int) -> bool:
    """A live process ``pid`` (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_cancel_during_a_regrade_kills_the_verifier_at_once(fleet, request) -> None:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="dew-regrade-pid-"))  # any uid may write
    folder.chmod(0o777)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    pidfile = folder / "pid"
    run = source(SandboxRegrader(fleet, ["python3", "-c", SLEEPER, str(pidfile)], ["answer.txt"]))
    try:
        future = run.submit(Task(3), seed=3)
        deadline = time.monotonic() + 30
        while not pidfile.exists():  # the episode ended and its re-grade is running
            assert time.monotonic() < deadline and not future.done()
            time.sleep(0.02)
        pid = int(pidfile.read_text())
        assert alive(pid)
        start = time.monotonic()
        run.cancel(future)
        session = future.result(timeout=5)
        took = time.monotonic() - start
    finally:
        run.close()
    assert session.status is Status.CANCELLED and session.reward is None
    assert took < 2.0, took
    assert not alive(pid)  # killed and reaped, not waited out
    assert run.regrade_counts == {"regraded": 0, "agreed": 0, "rejected": 0, "failed": 0}


def test_a_cancelled_fleet_run_raises_and_refuses_a_bad_flag(fleet: SandboxFleet) -> None:
    import threading

    from dew.sandbox.launcher import SandboxCancelled
    from dew.sandbox.program import Program

    flag = threading.Event()
    flag.set()
    with pytest.raises(SandboxCancelled):
        fleet.run([Program({}, ["python3", "-c", "import time; time.sleep(30)"])], cancel=flag)
    with pytest.raises(TypeError, match="SandboxFleet.run: cancel: expected None or an object"):
        fleet.run([], cancel=3)


# ---------------------------------------------------------------- the config key


@pytest.mark.parametrize(
    ("rollout", "regrade", "expected"),
    [
        (None, {"command": ["python3", "v.py"], "files": []},  # sync checks the keys too
         "source.regrade.files: expected a nonempty list"),
        ("async", 3, "source.regrade: expected a mapping, got 3"),
        ("async", {"files": ["answer.txt"]},
         "source.regrade.command: expected a nonempty list of strings (an argv), got None"),
        ("async", {"command": ["python3"], "files": ["answer.txt"], "inputs": {"v.py": "/no"}},
         "source.regrade.inputs.v.py: expected a readable file, got '/no'"),
        ("async", {"command": ["python3"], "files": ["a"], "runner": "vm"},
         "source.regrade.runner: expected one of process, container, got 'vm'"),
    ],
)  # fmt: skip
def test_bad_regrade_keys_are_one_line_errors(tmp_path, capsys, rollout, regrade, expected):
    from test_recipe_environment import grpo_config

    from dew.cli import main

    run_dir = tmp_path / "bad"
    config = grpo_config(WORKER, run_dir, 1, regrade=regrade)
    if rollout is not None:
        raw = json.loads(config.read_text())
        raw["rollout"] = {"mode": rollout, "engine": {"kind": "native"}}
        raw["objective"]["behavior_importance"] = 2.0
        config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not run_dir.exists()


#: The clean verifier of the config run: the verdict the worker wrote into its directory,
#: and an audit file (in a folder any uid may write) saying it ran.
VERDICT = """import json, os, sys, uuid
task = json.load(sys.stdin)["task"]
open(os.path.join(sys.argv[1], uuid.uuid4().hex), "w").write(str(task))
print(open("verdict.txt").read() if os.path.exists("verdict.txt") else "0")
"""


def test_an_async_config_regrades_every_scored_episode(tmp_path, capsys, request) -> None:
    from test_recipe_environment import WORKER as TOOL
    from test_recipe_environment import grpo_config

    from dew.cli import main

    line = '            reply = {"context": None, "status": "completed", "detail": detail}\n'
    assert line in TOOL
    worker = tmp_path / "tool_worker.py"
    worker.write_text(
        TOOL.replace(line, f'{line}            open("verdict.txt", "w").write(detail)\n')
    )
    (tmp_path / "verify.py").write_text(VERDICT)
    audit = pathlib.Path(tempfile.mkdtemp(prefix="dew-regrade-audit-"))  # not under 0700 dirs
    audit.chmod(0o777)  # the process runner runs the verifier under a fresh uid
    request.addfinalizer(lambda: shutil.rmtree(audit, ignore_errors=True))
    regrade = {"command": ["python3", "verify.py", str(audit)], "files": ["verdict.txt"],
               "inputs": {"verify.py": "verify.py"}, "workers": 2}  # beside the config  # fmt: skip
    run_dir = tmp_path / "run"
    config = grpo_config(worker, run_dir, 2, regrade=regrade)
    raw = json.loads(config.read_text())
    raw["rollout"] = {"mode": "async", "ahead": 1, "truncation": "score",
                      "engine": {"kind": "native"}}  # fmt: skip
    raw["objective"].update(behavior_importance=2.0, groups=2)
    config.write_text(json.dumps(raw))
    assert main(["train", "grpo", "--config", str(config)]) == 0
    assert "trained to step 2" in capsys.readouterr().out
    episodes = [json.loads(line) for line in open(run_dir / "episodes.jsonl")]
    completed = [e for e in episodes if e["status"] == "completed"]
    assert completed and all(e["reward"] == float(e["detail"]) for e in completed)
    assert len(list(audit.iterdir())) >= len(completed)  # each was graded again
    batches = [json.loads(line) for line in open(run_dir / "rollout.jsonl")]
    assert all(b["admitted_groups"] == 2 and b["resubmitted/infra_error"] == 0 for b in batches)
