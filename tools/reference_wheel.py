"""Provenance for the fixture recorders: a reference wheel's sha256, source hashes, atomic writes.

The recorders (``parity_agentic.py``, ``parity_dpo.py``, ``parity_dpo_tokens.py``,
``parity_ppo.py``, ``parity_rl.py``, ``verl_interop_reference.py``) run in the reference
virtualenv, where Dew is not installed, so they cannot use ``dew.files``; they import this
module as a sibling (``python tools/<recorder>.py`` puts ``tools/`` on the path).

Neither the verl nor the TRL wheel records a git revision, so each fixture's sidecar names the
package version and the sha256 of the wheel it came from.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType


def wheel_sha256(package: str, version: str, given: str | None = None) -> str | None:
    """sha256 of ``package==version``'s wheel.

    In order: ``given`` (``--wheel-sha256`` on the recorder's command line); a wheel already in
    ``$DEW_VERL_WHEEL_DIR`` or ``/tmp/verlwheel``; a ``pip download --no-deps`` of the wheel
    into a temporary folder. None when none of these works (offline and no local copy).
    """
    if given:
        return given
    stem = package.replace("-", "_")
    for folder in (os.environ.get("DEW_VERL_WHEEL_DIR"), "/tmp/verlwheel"):
        if folder:
            found = sorted(Path(folder).glob(f"{stem}-{version}-*.whl"))
            if found:
                return hashlib.sha256(found[0].read_bytes()).hexdigest()
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [shutil.which("python3") or "python3", "-m", "pip", "download"]
            + [f"{package}=={version}", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp],
            capture_output=True,
        )
        found = sorted(Path(tmp).glob(f"{stem}-*.whl"))
        if done.returncode != 0 or not found:
            return None
        return hashlib.sha256(found[0].read_bytes()).hexdigest()


def source_sha256(modules: Iterable[ModuleType], root: ModuleType) -> dict[str, str]:
    """sha256 of each module's source file, keyed by its path relative to ``root``'s parent."""
    base = Path(str(root.__file__)).parent.parent
    out = {}
    for module in modules:
        path = Path(str(module.__file__))
        out[path.relative_to(base).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then move it onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600 files; fixtures are committed
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
