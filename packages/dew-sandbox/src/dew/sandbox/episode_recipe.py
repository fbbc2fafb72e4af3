"""The worker of ``source: {kind: environment}`` in ``dew train grpo`` configs.

``dew`` may not import ``dew.sandbox``: it finds ``subprocess_environment`` below by its entry
point (group ``dew.recipes``, name ``subprocess_environment``; see ``pyproject.toml``) and
hands it the worker keys of the config's ``source`` section::

    source:
      kind: environment
      command: [/usr/bin/python3, /abs/worker.py]       # the worker's argv
      limits: {cpu_seconds: 30, deadline_seconds: 600}   # SandboxLimits' fields
      env: {LEVEL: hard}                                 # extra environment variables

``subprocess_environment(args)`` checks every key at once and returns a
``SubprocessEnvironment``, the environment factory of the run's episodes; nothing starts
until an episode enters its session. Errors are ``ValueError`` whose message starts with the
key inside ``args`` (``limits.cpu_seconds: expected ...``), so the caller can prefix the
config's own path (``source.``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dew.sandbox.recipe import _limits, _mapping, _strings, _unknown
from dew.sandbox.subprocess_environment import SubprocessEnvironment

__all__ = ["ENVIRONMENT_KEYS", "subprocess_environment"]

#: The keys ``args`` may hold.
ENVIRONMENT_KEYS = ("command", "limits", "env")


def subprocess_environment(args: Mapping[str, Any] | None) -> SubprocessEnvironment:
    """A ``SubprocessEnvironment`` made from ``args`` (the keys of ``ENVIRONMENT_KEYS``:
    ``command`` required, ``limits`` defaulting to ``SandboxLimits()``, ``env`` to none).

    Raises:
      ValueError: an unknown key, a command that is no nonempty list of strings, a limit
        ``SandboxLimits`` refuses, an ``env`` that is no mapping of strings to strings; the
        message starts with the key inside ``args``.
    """
    given = _mapping(args, "source")
    _unknown(given, ENVIRONMENT_KEYS, "")
    command = _strings(given.get("command"), "command", "a nonempty list of strings")
    env = _mapping(given.get("env"), "env")
    for name, value in env.items():
        if not isinstance(value, str):
            raise ValueError(f"env.{name}: expected a string, got {value!r}")
    return SubprocessEnvironment(list(command), _limits(given.get("limits")), env=dict(env))
