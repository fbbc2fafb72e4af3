"""The ``code`` reward of ``dew train grpo`` and ``dew chain`` configs.

``dew`` may not import ``dew.sandbox``: it finds ``code_reward`` below by its entry point
(group ``dew.recipes``, name ``code_reward``; see ``pyproject.toml``) when a config says
``reward: code``, and hands it the config's ``reward_args``::

    objective:
      reward: code
      reward_args:
        runner: process          # or container
        workers: 4               # programs running at once
        limits: {cpu_seconds: 2, deadline_seconds: 5}   # SandboxLimits' fields
        container: {image: dew-sandbox-python:bookworm-stdlib}  # ContainerRunner's arguments
        all_or_nothing: false    # CodeReward's scoring

``code_reward(args)`` checks every argument at once and returns a context manager; only
entering it starts the fleet (and, for ``container``, reaches the engine), and leaving it,
normally or by an exception, closes the fleet. Errors are ``ValueError`` whose message starts
with the key inside ``reward_args`` (``limits.cpu_seconds: expected ...``), so the caller can
prefix the config's own path (``objective.reward_args.``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from dew.sandbox.container_runner import ContainerRunner
from dew.sandbox.limits import SandboxLimits
from dew.sandbox.process_runner import ProcessRunner
from dew.sandbox.quickstart import sandboxed_code_reward
from dew.sandbox.reward import CodeReward
from dew.sandbox.runner import Runner

__all__ = ["KEYS", "RUNNERS", "code_reward"]

#: The keys ``reward_args`` may hold.
KEYS = ("runner", "workers", "limits", "container", "all_or_nothing")
#: The runner names ``reward_args.runner`` takes.
RUNNERS = ("process", "container")
_LIMIT_KEYS = tuple(field.name for field in dataclasses.fields(SandboxLimits))
_CONTAINER_KEYS = tuple(inspect.signature(ContainerRunner).parameters)
_DEFAULT_WORKERS = 2


def _names(keys: tuple[str, ...]) -> str:
    return ", ".join(keys)


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{key}: expected a mapping of keys, got {value!r}")
    return value


def _strings(value: Any, key: str, what: str) -> list[str]:
    """``value`` as a nonempty list of nonempty strings, else ``ValueError`` naming ``key``
    and ``what`` was expected."""
    if (
        isinstance(value, str | bytes)
        or not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(part, str) and part for part in value)
    ):
        raise ValueError(f"{key}: expected {what}, got {value!r}")
    return list(value)


def _unknown(given: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    for name in given:
        if name not in known:
            raise ValueError(f"{prefix}{name}: unknown key; expected one of {_names(known)}")


def _limits(value: Any) -> SandboxLimits:
    given = _mapping(value, "limits")
    _unknown(given, _LIMIT_KEYS, "limits.")
    try:
        return SandboxLimits(**given)
    except (TypeError, ValueError) as err:  # "SandboxLimits.<field>: expected ..., got ..."
        raise ValueError(str(err).replace("SandboxLimits.", "limits.", 1)) from None


def _container(value: Any) -> dict[str, Any]:
    """ContainerRunner's keyword arguments, checked without reaching the engine."""
    given = dict(_mapping(value, "container"))
    _unknown(given, _CONTAINER_KEYS, "container.")
    image = given.get("image")
    if not isinstance(image, str) or not image:
        raise ValueError(f"container.image: expected an image name, got {image!r}")
    runtime = given.get("runtime", "docker")
    if runtime not in ("docker", "podman"):
        raise ValueError(f"container.runtime: expected 'docker' or 'podman', got {runtime!r}")
    cpus = given.get("cpus", 1.0)
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not cpus > 0:
        raise ValueError(f"container.cpus: expected a positive number, got {cpus!r}")
    for name in ("base_url", "user", "oci_runtime"):
        if given.get(name) is not None and not isinstance(given[name], str):
            raise ValueError(f"container.{name}: expected a string, got {given[name]!r}")
    return given


def _runner(args: Mapping[str, Any]) -> Callable[[], Runner]:
    """What makes the runner when the fleet starts."""
    runner = args.get("runner", "process")
    if runner not in RUNNERS:
        raise ValueError(f"runner: expected one of {_names(RUNNERS)}, got {runner!r}")
    if runner == "process":
        if args.get("container") is not None:
            raise ValueError("container: given with runner 'process'; it needs runner 'container'")
        return ProcessRunner
    return functools.partial(ContainerRunner, **_container(args.get("container")))


def code_reward(
    args: Mapping[str, Any] | None = None,
) -> contextlib.AbstractContextManager[CodeReward]:
    """A context manager yielding a ``CodeReward`` on a ``SandboxFleet`` made from ``args``
    (``reward_args``: the keys of ``KEYS``, all optional; see the module docstring).

    Defaults: runner ``process``, 2 workers, ``SandboxLimits()``, fractional scores.

    Raises:
      ValueError: an unknown key, a runner not in ``RUNNERS``, a worker count that is no
        integer >= 1, a limit ``SandboxLimits`` refuses, container arguments that cannot
        work; the message starts with the key inside ``args``.
    """
    given = _mapping(args, "reward_args")
    _unknown(given, KEYS, "")
    make_runner = _runner(given)
    workers = given.get("workers", _DEFAULT_WORKERS)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
    limits = _limits(given.get("limits"))
    all_or_nothing = given.get("all_or_nothing", False)
    if not isinstance(all_or_nothing, bool):
        raise ValueError(f"all_or_nothing: expected true or false, got {all_or_nothing!r}")
    return sandboxed_code_reward(make_runner, limits, workers, all_or_nothing=all_or_nothing)


# The prompt fields the reward cannot score without: dew refuses prompts that lack them
# before training starts, as it does for any reward with ``needs``.
code_reward.needs = ("ground_truth",)  # type: ignore[attr-defined]
