"""Real multi-process JAX runs on one CPU host, for tests.

The launcher side (the test):

- ``ProcessGroup(script, *args, processes=N)`` starts ``N`` ranks of the Python ``script``,
  each as ``python script *args --processes N --process-id I --port P`` (the three flags only
  when ``N > 1``; ``P`` is one free port on 127.0.0.1 shared by the ranks), in the
  environment of ``cpu_env`` (``JAX_PLATFORMS=cpu``, no ``XLA_FLAGS``). Each rank starts a
  process group of its own (``dew.processes.start``), and its stdout and stderr go to
  temporary files, so a rank that prints a lot never blocks on a full pipe while another
  waits for it in a collective.
- ``wait(timeout, expect=0)`` waits for every rank and returns one ``Finished(rank,
  returncode, stdout, stderr)`` per rank. As soon as one rank exits with a code other than
  ``expect`` (an int for all ranks, a list per rank, None for any code), or when ``timeout``
  seconds pass, every rank's process group is killed with SIGKILL and ``ProcessGroupError``
  is raised naming each rank's code and the last ``tail`` characters of its stdout and
  stderr. Leaving the ``with`` block kills whatever still runs.
- ``run_processes(script, *args, processes=N, timeout=, expect=)`` does both at once.

The worker side (the script): ``process_arguments(parser)`` adds ``--processes``,
``--process-id`` and ``--port``; ``join_cpu(devices, processes, process_id, port)`` gives JAX
``devices`` CPU devices in this process and, with several processes, joins the others through
``jax.distributed`` on ``127.0.0.1:port`` with gloo CPU collectives. Call it before anything
touches a JAX device.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from dew.processes import start, stop

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (read from Linux's ``/proc``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def cpu_env(
    extra: Mapping[str, str] | None = None, pythonpath: Sequence[str | os.PathLike[str]] = ()
) -> dict[str, str]:
    """This process's environment for a CPU-only JAX child.

    ``JAX_PLATFORMS=cpu``, ``XLA_FLAGS`` removed (a forced device count of the parent would
    fight the child's own), ``pythonpath`` put in front of ``PYTHONPATH``, then ``extra``.
    """
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    if pythonpath:
        paths = [os.fspath(p) for p in pythonpath]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


@dataclasses.dataclass(frozen=True)
class Finished:
    """What one rank left: its exit code (negative: the signal that ended it) and output."""

    rank: int
    returncode: int
    stdout: str
    stderr: str


class ProcessGroupError(AssertionError):
    """Ranks that exited with an unexpected code or ran past the timeout (all were killed)."""


def _expected(expect: int | Sequence[int] | None, processes: int) -> list[int | None]:
    if expect is None or isinstance(expect, int):
        return [expect] * processes
    codes: list[int | None] = list(expect)
    if len(codes) != processes:
        raise ValueError(f"expect: expected one code per rank ({processes}), got {len(codes)}")
    return codes


class ProcessGroup:
    """The ranks of one worker script, started at once (see the module docstring).

    Args:
      script: the Python file each rank runs (with this interpreter).
      args: its arguments, each passed through ``str``.
      processes: how many ranks; with more than one, each gets ``--processes``,
        ``--process-id`` and ``--port`` after ``args``.
      env: variables added to ``cpu_env``'s environment.
      pythonpath: folders put in front of ``PYTHONPATH`` (helper modules of a test folder).
      tail: how many characters of each rank's stdout and stderr an error shows.
    """

    def __init__(
        self,
        script: str | os.PathLike[str],
        *args: Any,
        processes: int = 1,
        env: Mapping[str, str] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        tail: int = 3000,
    ) -> None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes: expected an integer >= 1, got {processes!r}")
        self.processes, self.tail = processes, int(tail)
        self.port = free_port() if processes > 1 else None
        base = [sys.executable, os.fspath(script), *map(str, args)]
        self.commands = [base + self._place(rank) for rank in range(processes)]
        environment = cpu_env(env, pythonpath)
        self._files: list[tuple[IO[bytes], IO[bytes]]] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for command in self.commands:
                out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                self._files.append((out, err))
                self.procs.append(start(command, env=environment, log=out, error_log=err))
        except BaseException:
            self.close()
            raise

    def _place(self, rank: int) -> list[str]:
        if self.port is None:
            return []
        return ["--processes", str(self.processes), "--process-id", str(rank),
                "--port", str(self.port)]  # fmt: skip

    def running(self) -> bool:
        """Whether every rank is still running."""
        return all(p.poll() is None for p in self.procs)

    def kill(self) -> None:
        """SIGKILL every rank's process group (the rank and whatever it started) and reap."""
        for proc in self.procs:
            stop(proc, grace=0)

    def close(self) -> None:
        """Kill what still runs and drop the output files."""
        self.kill()
        for out, err in self._files:
            out.close()
            err.close()
        self._files = []

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _output(self, rank: int) -> tuple[str, str]:
        texts = []
        for handle in self._files[rank]:
            handle.seek(0)
            texts.append(handle.read().decode("utf-8", errors="replace"))
        return texts[0], texts[1]

    def _report(self, problem: str, codes: list[int | None]) -> str:
        parts = [problem]
        for rank, proc in enumerate(self.procs):
            out, err = self._output(rank)
            want = "" if codes[rank] is None else f", expected {codes[rank]}"
            parts.append(f"--- rank {rank}: exit code {proc.returncode}{want}; "
                         f"{' '.join(self.commands[rank])}")  # fmt: skip
            parts.append(f"--- rank {rank} stdout (last {self.tail} characters):\n"
                         f"{out[-self.tail :]}")  # fmt: skip
            parts.append(f"--- rank {rank} stderr (last {self.tail} characters):\n"
                         f"{err[-self.tail :]}")  # fmt: skip
        return "\n".join(parts)

    def wait(
        self, timeout: float = 300.0, expect: int | Sequence[int] | None = 0
    ) -> list[Finished]:
        """Every rank's ``Finished``, once all have exited with the ``expect``ed codes.

        Raises:
          ProcessGroupError: a rank exited with another code, or ``timeout`` seconds passed;
            every rank was killed first.
        """
        codes = _expected(expect, self.processes)
        deadline = time.monotonic() + float(timeout)
        while True:
            states = [p.poll() for p in self.procs]
            wrong = [
                rank
                for rank, code in enumerate(states)
                if code is not None and codes[rank] is not None and code != codes[rank]
            ]
            if wrong:
                self.kill()
                ranks = ", ".join(map(str, wrong))
                raise ProcessGroupError(self._report(f"rank(s) {ranks} exited early", codes))
            if all(code is not None for code in states):
                break
            if time.monotonic() >= deadline:
                self.kill()
                raise ProcessGroupError(
                    self._report(f"timed out after {timeout:g}s; every rank was killed", codes)
                )
            time.sleep(0.05)
        self.kill()  # reap, and end anything a rank left behind in its group
        return [
            Finished(rank, int(proc.returncode), *self._output(rank))
            for rank, proc in enumerate(self.procs)
        ]


def run_processes(
    script: str | os.PathLike[str],
    *args: Any,
    processes: int = 1,
    timeout: float = 300.0,
    expect: int | Sequence[int] | None = 0,
    env: Mapping[str, str] | None = None,
    pythonpath: Sequence[str | os.PathLike[str]] = (),
    tail: int = 3000,
) -> list[Finished]:
    """Start ``processes`` ranks of ``script`` and wait for them (``ProcessGroup.wait``)."""
    group = ProcessGroup(script, *args, processes=processes, env=env, pythonpath=pythonpath,
                         tail=tail)  # fmt: skip
    with group:
        return group.wait(timeout, expect)


def process_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--processes``, ``--process-id`` and ``--port`` a ``ProcessGroup`` passes."""
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    return parser


def join_cpu(devices: int, processes: int = 1, process_id: int = 0, port: int = 0) -> None:
    """Give JAX ``devices`` CPU devices here and join the other processes (when several).

    With ``processes > 1`` this is ``jax.distributed.initialize`` on ``127.0.0.1:port`` with
    gloo collectives, so arrays sharded over every process's devices work on CPU.
    """
    import jax

    jax.config.update("jax_num_cpu_devices", int(devices))
    if processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            coordinator_address=f"{HOST}:{port}",
            num_processes=int(processes),
            process_id=int(process_id),
        )


__all__ = [
    "Finished",
    "alive",
    "ProcessGroup",
    "ProcessGroupError",
    "cpu_env",
    "free_port",
    "join_cpu",
    "process_arguments",
    "run_processes",
]
