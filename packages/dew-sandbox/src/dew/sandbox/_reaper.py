"""Watchdog process of a ContainerRunner: removes its containers once the runner is gone.

Run as ``python -m dew.sandbox._reaper SESSION TEMP_ROOT [BASE_URL]`` with a pipe on
stdin. It blocks reading stdin; end of file means the runner closed the pipe
(``close()``) or its process died (the kernel closes the pipe even on SIGKILL). Either
way it then force-removes every container labelled ``dew.sandbox.runner=SESSION``,
deletes the runner's job directories left in TEMP_ROOT (``dew-sandbox-SESSION-*`` and
``dew-sandbox-io-SESSION-*``), and exits.
It runs in its own session, so a signal to the runner's process group spares it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys

import docker
import docker.errors

LABEL = "dew.sandbox.runner"


def remove_labelled(session: str, base_url: str | None) -> int:
    """Force-remove the session's containers; returns how many were removed."""
    if base_url:
        client = docker.DockerClient(base_url=base_url, version="auto", timeout=60)
    else:
        client = docker.from_env(version="auto", timeout=60)
    removed = 0
    try:
        found = client.api.containers(all=True, filters={"label": f"{LABEL}={session}"})
        for container in found:
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container["Id"], force=True)
                removed += 1
    finally:
        client.close()
    return removed


def remove_directories(session: str, temp_root: str) -> None:
    """Delete the job and stdin directories of ``session`` under ``temp_root``."""
    for pattern in (f"dew-sandbox-{session}-*", f"dew-sandbox-io-{session}-*"):
        for path in glob.glob(os.path.join(glob.escape(temp_root), pattern)):
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    session, temp_root = argv[0], argv[1]
    base_url = argv[2] if len(argv) > 2 else None
    while sys.stdin.buffer.read(1 << 16):
        pass
    try:
        remove_labelled(session, base_url)
    finally:
        remove_directories(session, temp_root)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
