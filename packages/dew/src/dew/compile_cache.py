"""JAX's persistent compilation cache, set up once for Dew's runs.

A compiled XLA program is written to disk the first time it is built and read back by later
processes that build the same program, so a second ``dew train`` of one config skips most
of its compile time. Dew turns the cache on at its entry points: the ``dew`` command line,
``dew.recipes.train.run_train`` and the ``Trainer`` (which only fills in the default when no
entry point decided before it).

``configure(enabled=None, directory=None)`` decides, in this order:

* off when ``enabled`` is False, or when it is None and ``DEW_COMPILE_CACHE`` is ``0``,
  ``false``, ``no`` or ``off`` (``1``, ``true``, ``yes``, ``on`` or unset: on). Off sets
  ``jax_enable_compilation_cache`` to False, so no entry is read or written in this process,
  a cache directory configured through JAX included;
* on, the directory is ``directory`` when given, else the one already configured through
  JAX (``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``), which Dew then leaves untouched,
  thresholds included; else ``DEW_COMPILE_CACHE_DIR``; else ``$XDG_CACHE_HOME/dew/jax``
  (``~/.cache/dew/jax`` when ``XDG_CACHE_HOME`` is unset or relative).

A directory Dew picks gets one sub-directory per host CPU kind (``cpu-`` and 12 hex digits
of the CPU model and flags): JAX's cache key names the platform (``cpu``) but not the host's
instruction set, and a program compiled for AVX-512 or AMX must never be loaded by, nor give
other numbers on, a machine without them (a home directory shared by the nodes of a
cluster). On a directory it picks, Dew also lowers JAX's thresholds so that small CPU
programs are cached too: ``jax_persistent_cache_min_compile_time_secs`` from 1 s to 0 and
``jax_persistent_cache_min_entry_size_bytes`` to -1 (no size floor), each only while it
holds JAX's default.

Call it before the first compilation: JAX opens its cache once per process, at the first
program it compiles with a directory set. A directory that cannot be made gives a warning
and a run without the cache, never a failed run. The cache is trusted code: do not point it
at a directory that others may write.
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from pathlib import Path
from typing import Any

ENV_SWITCH = "DEW_COMPILE_CACHE"
ENV_DIRECTORY = "DEW_COMPILE_CACHE_DIR"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")
#: JAX's own defaults of the two thresholds; a value other than these was set by the user.
_JAX_MIN_SECONDS = 1.0
_JAX_MIN_BYTES = 0

_decided = False
_disabled_here = False


def switch_from_env() -> bool | None:
    """``DEW_COMPILE_CACHE`` as a bool, or None when it is unset or empty."""
    text = os.environ.get(ENV_SWITCH, "").strip().lower()
    if not text:
        return None
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ValueError(f"{ENV_SWITCH}: expected one of {', '.join(_ON + _OFF)}, got {text!r}")


def machine_tag() -> str:
    """``cpu-`` and 12 hex digits naming this host's CPU kind (model name and flags from
    ``/proc/cpuinfo``; the platform's machine and processor names elsewhere)."""
    parts = [platform.machine(), platform.processor()]
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        if key in ("model name", "flags", "Features", "CPU part"):
            parts.append(line.split(":", 1)[1].strip())
        if key in ("flags", "Features"):
            break
    return "cpu-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def default_directory() -> Path:
    """``$XDG_CACHE_HOME/dew/jax``, or ``~/.cache/dew/jax`` (without the machine tag)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "dew" / "jax"


def _flag(name: str) -> Any:
    """The current value of one of JAX's configuration flags."""
    import jax

    return getattr(jax.config, name)


def active_directory() -> str | None:
    """The directory JAX caches compiled programs in now, or None when it caches none."""

    if not _flag("jax_enable_compilation_cache"):
        return None
    return _flag("jax_compilation_cache_dir") or None


def configure(
    enabled: bool | None = None, directory: str | os.PathLike[str] | None = None
) -> str | None:
    """Turn the persistent compilation cache on or off for this process (see the module
    docstring for the order of the sources). Returns the directory JAX caches in, or None
    when caching is off. ``enabled`` must be a bool or None; ``directory`` a path or None."""
    global _decided, _disabled_here
    import jax

    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected True, False or None, got {enabled!r}")
    on = enabled if enabled is not None else switch_from_env()
    _decided = True
    if on is False:
        jax.config.update("jax_enable_compilation_cache", False)
        _disabled_here = True
        return None
    if _disabled_here:  # an earlier call of this process turned it off
        jax.config.update("jax_enable_compilation_cache", True)
        _disabled_here = False
    if directory is None and _flag("jax_compilation_cache_dir"):
        return active_directory()  # the user's own cache: left as configured
    chosen = directory if directory is not None else os.environ.get(ENV_DIRECTORY) or None
    root = Path(chosen).expanduser().resolve() if chosen is not None else default_directory()
    path = root / machine_tag()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(
            f"compile cache: cannot make {path} ({err}); compiling without it", stacklevel=2
        )
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    if _flag("jax_persistent_cache_min_compile_time_secs") == _JAX_MIN_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if _flag("jax_persistent_cache_min_entry_size_bytes") == _JAX_MIN_BYTES:
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return active_directory()


def configure_default() -> str | None:
    """``configure()`` unless an earlier call of this process already decided (what the
    ``Trainer`` calls, so that an entry point's choice stands). Returns ``active_directory()``."""
    if _decided:
        return active_directory()
    return configure()


__all__ = [
    "ENV_DIRECTORY",
    "ENV_SWITCH",
    "active_directory",
    "configure",
    "configure_default",
    "default_directory",
    "machine_tag",
    "switch_from_env",
]
