"""ContainerRunner: each program in a fresh, network-less container (docker SDK).

Every program gets its own container, created from ``image`` with:

* ``network_mode="none"`` (a loopback device only), a read-only root filesystem, the job
  directory bind-mounted read-only at ``/work`` (the working directory), stdin from a
  second read-only mount, and a small writable tmpfs at ``/tmp`` (also ``HOME``);
* all capabilities dropped, ``no-new-privileges``, the unprivileged user ``65534:65534``;
* a memory limit (swap included), a pids limit, CPU shares and one CPU at most, and
  ulimits for CPU seconds, file size and core dumps;
* the engine's small init (``init=True``) as PID 1, so RLIMIT_CPU signals and zombie
  reaping behave as they do outside (a namespace's PID 1 ignores default-action signals);
* logging disabled (output is read from an attach stream opened before the start and
  capped by the runner, so a flood never reaches the daemon's disk).

At the wall deadline (or past the output cap, or on cancel) the container is killed by
name; it is removed with force in every case, and :meth:`ContainerRunner.close` removes
anything still carrying this runner's label. A watchdog process (``dew.sandbox._reaper``)
does the same if the Python process dies without closing the runner, even by SIGKILL,
and removes the job directories it left (their names carry the runner's session).

Exit codes: the init reports a program killed by signal N as ``128 + N``; such codes
are read back as ``-N`` (so a program that itself exits with 137 reads as SIGKILL).
The engine must see this machine's files (a local socket, not a remote host): the job
directory and stdin reach the container as bind mounts.

Reference behaviour: Docker Engine API >= 1.41 (Debian bookworm's docker.io 20.10),
docker SDK 7.x; Podman's Docker-compatible socket works the same way.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import docker
import docker.errors
from docker.types import LogConfig, Ulimit

from dew.sandbox._reaper import LABEL
from dew.sandbox.launcher import SandboxCancelled, new_marker, sandbox_environment
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.outcome import Outcome, Verdict
from dew.sandbox.program import Program
from dew.sandbox.runner import CancelFlag, job_directory

__all__ = ["ContainerRunner", "engine_unavailable_reason"]

RUNNER_LABEL = LABEL
_STDIN_TRAMPOLINE = 'exec "$@" < /dew-io/stdin'
_RUNTIMES = ("docker", "podman")


def _client(base_url: str | None) -> docker.DockerClient:
    # Each running program holds one connection for its attach stream and briefly
    # another for wait/kill, so the pool is sized for a few dozen workers.
    if base_url is not None:
        return docker.DockerClient(base_url=base_url, version="auto", timeout=60, max_pool_size=64)
    return docker.from_env(version="auto", timeout=60, max_pool_size=64)


def engine_unavailable_reason(image: str | None = None, base_url: str | None = None) -> str | None:
    """None when an engine answers (and holds ``image``, if given); otherwise why not."""
    host = base_url or os.environ.get("DOCKER_HOST")
    if not host:
        return "no container engine: DOCKER_HOST is unset"
    try:
        client = _client(base_url)
    except docker.errors.DockerException as error:
        return f"no container engine: DOCKER_HOST={host} unreachable: {error}"
    try:
        client.ping()
        if image is not None:
            client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"container engine at {host} has no image {image!r}"
    except (docker.errors.DockerException, OSError) as error:
        return f"no container engine: DOCKER_HOST={host} unreachable: {error}"
    finally:
        client.close()
    return None


def _signal_code(status: int) -> int:
    return -(status - 128) if 128 < status < 160 else status


class ContainerRunner:
    """Runs each program in a fresh container through the docker SDK.

    Args:
        image: an image with the program's interpreter (for Python programs, ``python3``
            on ``/usr/local/bin:/usr/bin:/bin``) and ``/bin/sh``.
        runtime: ``"docker"``, or ``"podman"`` for Podman's Docker-compatible socket;
            both are reached through ``DOCKER_HOST`` (or ``base_url``).
        base_url: engine address; default ``DOCKER_HOST``.
        user: ``uid:gid`` the program runs as inside the container.
        oci_runtime: an OCI runtime name the engine knows (``runsc`` for gVisor); None
            keeps the engine's default.
        cpus: CPU cap of one container (``nano_cpus``).

    Raises:
        ValueError: ``runtime`` is not one of the two names, or ``image`` is missing.
        docker.errors.DockerException: the engine is unreachable.
    """

    def __init__(
        self,
        image: str,
        runtime: str = "docker",
        *,
        base_url: str | None = None,
        user: str = "65534:65534",
        oci_runtime: str | None = None,
        cpus: float = 1.0,
    ) -> None:
        if runtime not in _RUNTIMES:
            raise ValueError(
                f"ContainerRunner.runtime: expected one of {_RUNTIMES}, got {runtime!r}"
            )
        if not isinstance(image, str) or not image:
            raise ValueError(f"ContainerRunner.image: expected an image name, got {image!r}")
        if not cpus > 0:
            raise ValueError(f"ContainerRunner.cpus: expected a positive number, got {cpus!r}")
        self.image = image
        self.runtime = runtime
        self.user = user
        self.oci_runtime = oci_runtime
        self.cpus = cpus
        self.session = secrets.token_hex(6)
        self._client = _client(base_url)
        self._base_url = base_url
        self._closed = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._count = 0
        self._lock = threading.Lock()
        try:
            self._client.images.get(image)
        except docker.errors.ImageNotFound:
            self._client.close()
            raise ValueError(
                f"ContainerRunner.image: the engine has no image {image!r} "
                "(tools/ci/container_engine.sh builds dew-sandbox-python:bookworm-stdlib)"
            ) from None
        self._watchdog = self._start_watchdog()

    def _start_watchdog(self) -> subprocess.Popen[bytes]:
        # A separate process holding the read end of a pipe: when this process exits or
        # is killed, the pipe closes and the watchdog removes this runner's containers.
        argv = [sys.executable, "-m", "dew.sandbox._reaper", self.session, tempfile.gettempdir()]
        if self._base_url is not None:
            argv.append(self._base_url)
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    def _next_name(self) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("ContainerRunner.run: the runner is closed")
            self._count += 1
            return f"dew-sandbox-{self.session}-{self._count}"

    def _create(self, name: str, program: Program, limits: SandboxLimits, job: str, io: str) -> Any:
        cpu_soft, cpu_hard = limits.cpu_rlimit
        env = sandbox_environment("/tmp", new_marker())
        return self._client.api.create_container(
            self.image,
            command=["/bin/sh", "-c", _STDIN_TRAMPOLINE, "sh", *program.argv],
            name=name,
            user=self.user,
            working_dir="/work",
            environment=env,
            network_disabled=True,
            labels={RUNNER_LABEL: self.session},
            host_config=self._client.api.create_host_config(
                binds={job: {"bind": "/work", "mode": "ro"}, io: {"bind": "/dew-io", "mode": "ro"}},
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_bytes},mode=1777"},
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                mem_limit=limits.memory_bytes,
                memswap_limit=limits.memory_bytes,
                pids_limit=limits.processes,
                cpu_shares=limits.cpu_shares,
                nano_cpus=int(self.cpus * 1e9),
                ulimits=[
                    Ulimit(name="cpu", soft=cpu_soft, hard=cpu_hard),
                    Ulimit(name="core", soft=0, hard=0),
                    Ulimit(name="fsize", soft=limits.file_bytes, hard=limits.file_bytes),
                ],
                init=True,
                log_config=LogConfig(type="none"),
                runtime=self.oci_runtime,
            ),
        )

    def run(
        self, program: Program, limits: SandboxLimits, cancel: CancelFlag | None = None
    ) -> Outcome:
        """Run ``program`` in a fresh container under ``limits``."""
        name = self._next_name()
        io = tempfile.mkdtemp(prefix=f"dew-sandbox-io-{self.session}-")
        try:
            with open(os.path.join(io, "stdin"), "wb") as f:
                f.write(program.stdin_bytes)
            os.chmod(os.path.join(io, "stdin"), 0o644)
            os.chmod(io, 0o755)
            with job_directory(program, prefix=f"dew-sandbox-{self.session}-") as job:
                try:
                    return self._run_container(name, program, limits, job, io, cancel)
                finally:
                    self._remove(name)
        finally:
            shutil.rmtree(io, ignore_errors=True)

    def _run_container(
        self,
        name: str,
        program: Program,
        limits: SandboxLimits,
        job: str,
        io: str,
        cancel: CancelFlag | None,
    ) -> Outcome:
        api = self._client.api
        self._create(name, program, limits, job, io)
        stream = api.attach(name, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        out, err = bytearray(), bytearray()
        state = {"total": 0, "over_cap": False}
        cap = limits.output_bytes

        def read() -> None:
            try:
                for chunk_out, chunk_err in stream:
                    for buffer, chunk in ((out, chunk_out), (err, chunk_err)):
                        if not chunk:
                            continue
                        room = cap - state["total"]
                        buffer += chunk[: max(room, 0)]
                        state["total"] += len(chunk)
                    if state["total"] > cap and not state["over_cap"]:
                        state["over_cap"] = True
                        # Kill from another thread and keep draining: the engine waits
                        # for the attach stream to be read before the kill completes.
                        threading.Thread(target=self._kill, args=(name,), daemon=True).start()
            except (OSError, ValueError):
                pass  # the stream is closed under us when the container is killed

        reader = threading.Thread(target=read, name=f"{name}-output", daemon=True)
        reader.start()
        try:
            started = time.monotonic()
            try:
                api.start(name)
            except docker.errors.APIError as error:
                message = f"sandbox: could not start the program: {error.explanation or error}\n"
                return Outcome(
                    Verdict.FAILED, None, b"", message.encode(), time.monotonic() - started
                )
            # The clock starts once the engine reports the container running: creating
            # and starting it is the engine's time, not the program's (a 3 MB argv keeps
            # the engine busy for over a second).
            started = time.monotonic()
            deadline = started + limits.deadline_seconds
            timed_out = cancelled = False
            status: int | None = None
            # Same deadline/cancel checks as launcher.launch's loop, kept inline: this one waits
            # on the engine and a reader thread, that one on a selector over pipes and a pidfd.
            while status is None:
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                if cancel is not None and cancel.is_set():
                    cancelled = True
                    break
                if state["over_cap"]:
                    break
                if reader.is_alive():
                    # The attach stream ends when the container stops: no polling needed.
                    reader.join(timeout=min(0.05, deadline - now))
                    continue
                try:  # the stream ended early (the program closed its outputs): ask
                    result = api.wait(name, timeout=max(0.1, min(1.0, deadline - now)))
                    status = int(result["StatusCode"])
                except OSError:  # the SDK's read timeout (a requests error, an OSError)
                    continue
            if status is None:
                self._kill(name)
                with contextlib.suppress(docker.errors.DockerException):
                    status = int(api.wait(name, timeout=30)["StatusCode"])
            reader.join(timeout=5.0)
            seconds = time.monotonic() - started
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        if cancelled:
            raise SandboxCancelled("the program was cancelled")
        code = _signal_code(status) if status is not None else None
        verdict = _verdict(code, timed_out, bool(state["over_cap"]))
        return Outcome(verdict, code, bytes(out), bytes(err), seconds)

    def _kill(self, name: str) -> None:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            self._client.api.kill(name, signal="SIGKILL")

    def _remove(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self._client.api.remove_container(name, force=True)

    def leftover_containers(self) -> list[str]:
        """Names of containers this runner created that still exist (should be none)."""
        found = self._client.api.containers(
            all=True, filters={"label": f"{RUNNER_LABEL}={self.session}"}
        )
        return [c["Names"][0].lstrip("/") for c in found]

    def close(self) -> None:
        """Remove every container still carrying this runner's label; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            for name in self.leftover_containers():
                self._remove(name)
        finally:
            self._client.close()
            watchdog, self._watchdog = self._watchdog, None
            if watchdog is not None:
                assert watchdog.stdin is not None
                watchdog.stdin.close()  # nothing is left, so it exits at once
                try:
                    watchdog.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    watchdog.kill()
                    watchdog.wait()

    def __repr__(self) -> str:
        return f"ContainerRunner({self.image!r}, runtime={self.runtime!r})"


def _verdict(code: int | None, timed_out: bool, over_cap: bool) -> Verdict:
    if over_cap:
        return Verdict.OUTPUT_LIMIT
    if timed_out:
        return Verdict.TIMEOUT
    if code is None:
        return Verdict.FAILED
    if code == -24:  # SIGXCPU: the CPU-seconds ulimit
        return Verdict.TIMEOUT
    if code < 0:
        return Verdict.CRASHED
    return Verdict.COMPLETED if code == 0 else Verdict.FAILED
