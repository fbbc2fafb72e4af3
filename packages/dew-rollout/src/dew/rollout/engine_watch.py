"""The watchdog between Dew and an engine it launched: `python engine_watch.py PID GRACE -- CMD`.

`dew.rollout.launch` runs this file by its path (it imports only the standard library,
so it starts in milliseconds and needs nothing of Dew's environment) as the leader of the
engine's process group. It starts `CMD` in that group, with its own stdout and stderr,
and then:

- when `CMD` exits, it exits with the same status (a signal N as 128 + N), so the
  launcher reports the engine's own exit status;
- when its parent is no longer process `PID` (Dew died, even by SIGKILL, and the
  watchdog was re-parented), it sends SIGTERM to the whole group, waits up to `GRACE`
  seconds for `CMD` to exit, then sends SIGKILL to the group (itself included), so no
  engine process outlives Dew;
- SIGTERM and SIGINT sent to it (`dew.processes.stop` signals the whole group) are
  noted, not obeyed: the engine gets the same signal, and the watchdog exits with it.

The parent is polled every 0.2 s rather than watched with `PR_SET_PDEATHSIG`, which
fires when the launching *thread* exits, not the process: a launch from a worker thread
would lose its engine when that thread ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

POLL = 0.2


def _kill_group(child: subprocess.Popen[Any], grace: float) -> None:
    os.killpg(0, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Run the watchdog (module docstring); returns the engine's exit status."""
    if len(argv) < 4 or argv[2] != "--":
        print("usage: engine_watch.py PARENT_PID GRACE -- COMMAND...", file=sys.stderr)
        return 2
    parent, grace = int(argv[0]), float(argv[1])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    child = subprocess.Popen(argv[3:])
    while True:
        code = child.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if os.getppid() != parent:
            _kill_group(child, grace)
        time.sleep(POLL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
