"""The hostile suite through both runners: verdicts, host effects, survivors, escapes.

Each runner runs every case of ``sandbox_hostile_cases.CASES`` on a two-worker fleet.
An *escape* is a case whose verdict is not the expected one, whose host-side check
fails (file written outside, secret read, host port reached from a container, a slow
exit), or that left a process alive. The count is printed and must be 0; afterwards no
process carrying the suite's mark (or running under a sandbox uid) and no container of
the runner may exist.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Iterator

import pytest
from sandbox_helpers import processes_with, sandbox_temp_dirs
from sandbox_hostile_cases import CASES, LIMITS, HostContext

from dew.sandbox import ContainerRunner, ProcessRunner, SandboxFleet
from dew.sandbox.process_runner import DEFAULT_UID_BASE


@pytest.fixture
def host(tmp_path) -> Iterator[HostContext]:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    secret_value = "secret-" + secrets.token_hex(8)
    secret = tmp_path / "secret.txt"
    secret.write_text(secret_value)
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield HostContext(
            mark="dew-hostile-" + secrets.token_hex(6),
            outside_dir=str(outside),
            secret_path=str(secret),
            secret=secret_value,
            port=listener.getsockname()[1],
        )
    finally:
        listener.close()


def _sandbox_uid_processes() -> list[int]:
    # Any live process whose uid lies in the process runner's sandbox range.
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uid = int(fields["Uid"].split()[0])
        if (
            DEFAULT_UID_BASE <= uid < DEFAULT_UID_BASE + (1 << 24)
            and fields["State"].split()[0] != "Z"
        ):
            found.append(int(name))
    return found


def _run_suite(runner, kind: str, host: HostContext) -> None:
    before_dirs = sandbox_temp_dirs()
    with SandboxFleet(runner, limits=LIMITS, workers=2) as fleet:
        solo = [case for case in CASES if case.solo]
        rest = [case for case in CASES if not case.solo]
        by_name = {}
        for case in solo:
            by_name.update(zip([case.name], fleet.run([case.program(host)]), strict=True))
        by_name.update(
            zip([c.name for c in rest], fleet.run([c.program(host) for c in rest]), strict=True)
        )
        outcomes = [by_name[case.name] for case in CASES]
    escapes = []
    lines = [f"\nhostile suite, {kind} runner ({len(CASES)} programs):"]
    for case, outcome in zip(CASES, outcomes, strict=True):
        problems = []
        if outcome.verdict not in case.expected[kind]:
            wanted = "/".join(sorted(v.name for v in case.expected[kind]))
            problems.append(
                f"verdict {outcome.verdict.name} (exit {outcome.exit_code}), expected {wanted}; "
                f"stderr {outcome.stderr[-160:]!r}"
            )
        if case.check is not None:
            problem = case.check(outcome, host, kind)
            if problem:
                problems.append(problem)
        survivors = processes_with(f"{host.mark}-{case.name}")
        if survivors:
            problems.append(f"survivors {survivors}")
        status = "ESCAPE " + "; ".join(problems) if problems else "ok"
        lines.append(
            f"  {case.name:28s} {outcome.verdict.name:12s} {outcome.seconds:6.2f}s  {status}"
        )
        if problems:
            escapes.append(case.name)
    leftover_processes = processes_with(host.mark)
    leftover_uids = _sandbox_uid_processes()
    leftover_dirs = sandbox_temp_dirs() - before_dirs
    lines.append(
        f"  escapes: {len(escapes)}  leftover processes: {len(leftover_processes)}  "
        f"sandbox-uid processes: {len(leftover_uids)}  leftover job dirs: {len(leftover_dirs)}"
    )
    sys.stdout.write("\n".join(lines) + "\n")
    for pid, _ in leftover_processes:  # do not leave anything behind even on failure
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert escapes == [], "\n".join(lines)
    assert leftover_processes == [] and leftover_uids == [] and leftover_dirs == set()


def test_hostile_suite_process_runner(host: HostContext, capsys) -> None:
    if os.geteuid() != 0:
        pytest.skip(
            "the process-runner hostile suite needs root: without a sandbox uid the hostile "
            "programs run as the test's own user and could signal the test runner itself"
        )
    runner = ProcessRunner()
    assert runner.own_users
    with capsys.disabled():
        _run_suite(runner, "process", host)


def test_hostile_suite_container_runner(container_image: str, host: HostContext, capsys) -> None:
    runner = ContainerRunner(container_image)
    with capsys.disabled():
        _run_suite(runner, "container", host)
    # close() ran inside the fleet; nothing of this runner is left in the engine.
    import docker

    client = docker.from_env(version="auto")
    try:
        left = client.containers.list(
            all=True, filters={"label": f"dew.sandbox.runner={runner.session}"}
        )
        assert left == []
    finally:
        client.close()
