"""tools/ci/container_engine.sh: sourced under `set -euo pipefail`, it keeps the caller alive.

The script installs packages and builds an image when they are missing, which these
tests must not trigger: the first test only runs where an engine already answers (it
then exercises the reuse path), the second runs the script as a user who cannot start
one (the refusal path).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "ci" / "container_engine.sh"

PROBE = f"""
set -euo pipefail
source {SCRIPT}
echo "flags=$-"
[[ -o pipefail ]] && echo "pipefail=on"
echo "host=${{DOCKER_HOST:-unset}} image=${{DEW_SANDBOX_IMAGE:-unset}}"
echo "still running"
"""


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def test_reuses_a_running_engine_and_restores_shell_options(container_image: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root and an engine already started by tools/ci/container_engine.sh")
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DEW_SANDBOX_IMAGE")}
    result = _run(["bash", "-c", PROBE], env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    flags = lines[0].removeprefix("flags=")
    assert "e" in flags and "u" in flags
    assert lines[1] == "pipefail=on"
    assert lines[2] == (
        "host=unix:///run/dew-docker/docker.sock image=dew-sandbox-python:bookworm-stdlib"
    )
    assert lines[3] == "still running"
    assert "reusing the dockerd already answering" in result.stderr


def test_refuses_without_root_exports_nothing_and_keeps_the_caller() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DEW_SANDBOX_IMAGE")}
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv (util-linux) to drop root for this check")
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", "-c", PROBE]
    else:
        argv = ["bash", "-c", PROBE]
    result = _run(argv, env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "e" in lines[0] and "u" in lines[0]
    assert lines[1:] == ["pipefail=on", "host=unset image=unset", "still running"]
    assert "needs root" in result.stderr
    assert "container tests will skip" in result.stderr
