"""What a recipe config points at: local files (``local_path``) and rewards (``load_reward``,
``make_reward``).

Shared by ``dew chain`` (``dew.recipes.cli``) and ``dew train`` (``dew.recipes.train`` and
``dew.recipes.train_config``), so both read paths and rewards the same way. A reward is named
by a short name Dew ships (``REWARD_NAMES``: ``math``), as ``module:object``, or as ``code``
(``CODE_REWARD``); an object that is a class is instantiated with the config's
``reward_args`` (keyword arguments, none by default), a function is used as it is.

``code`` runs completions as programs in ``dew-sandbox``'s fleet, found through the
entry-point group ``dew.recipes`` (name ``code_reward``; ``dew.recipes.plugins``) since
``dew`` does not import ``dew.sandbox``. Its ``reward_args`` go to that factory, which checks
them (``runner``, ``workers``, ``limits``, ...); the fleet it starts lives in the caller's
``contextlib.ExitStack``, so it is closed when the run ends, normally or not.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dew.recipes.plugins import load_plugin
from dew.recipes.schema import ConfigError

_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".npy", ".bin", ".yaml", ".yml", ".txt")


def local_path(value: Any, base: Path, where: str) -> Any:
    """``value`` resolved against ``base`` when it names a local file or directory.

    A value that looks like a local path (a file suffix, a leading ``.``, ``/`` or ``~``, more
    than one ``/``, or a parent directory that exists here) but does not exist is reported as
    a missing file; anything else is left alone (a Hub id such as ``org/name``).
    """
    if not isinstance(value, str):
        return value
    candidate = Path(os.path.expanduser(value))
    if not candidate.is_absolute():
        candidate = base / candidate
    if candidate.exists():
        return str(candidate)
    looks_local = (
        value.endswith(_FILE_SUFFIXES)
        or value.startswith((".", "/", "~"))
        or value.count("/") > 1
        or (os.sep != "/" and os.sep in value)
        or ("/" in value and candidate.parent != base and candidate.parent.is_dir())
    )
    if looks_local:
        raise ConfigError(f"{where}: no such file or directory {str(candidate)!r}")
    return value


#: Rewards a config may name by a word instead of ``module:object``.
REWARD_NAMES = {"math": "dew.rewards:MathReward"}
#: The reward that runs completions as programs in ``dew-sandbox``'s fleet.
CODE_REWARD = "code"


def _code_factory(where: str) -> Any:
    """``dew-sandbox``'s ``code_reward(args) -> context manager`` (a ConfigError naming
    ``where`` when the distribution is missing)."""
    return load_plugin("code_reward", where, "dew-sandbox")


def load_reward(spec: Any, where: str) -> Any:
    """What ``spec`` names, a class or a function, not yet instantiated: a name of
    ``REWARD_NAMES``, ``module:object`` (refused with the reason when it cannot load), or
    ``code`` (the sandbox's factory, whose ``needs`` names the prompt fields it reads)."""
    if spec == CODE_REWARD:
        return _code_factory(where)
    if isinstance(spec, str) and spec in REWARD_NAMES:
        spec = REWARD_NAMES[spec]
    if not isinstance(spec, str) or spec.count(":") != 1:
        names = ", ".join(repr(n) for n in [*REWARD_NAMES, CODE_REWARD])
        raise ConfigError(f"{where}: expected {names} or 'module:object', got {spec!r}")
    module, name = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ConfigError(f"{where}: cannot import module {module!r} ({err})") from None
    except AttributeError:
        raise ConfigError(f"{where}: module {module!r} has no attribute {name!r}") from None
    if not callable(fn):
        raise ConfigError(f"{where}: {spec!r} is not callable")
    return fn


def _code_reward(
    where: str, args: Mapping[str, Any] | None, stack: contextlib.ExitStack | None
) -> Callable[..., float]:
    """The ``code`` reward: ``args`` checked by the sandbox's factory (its ``ValueError``
    starts with the key inside ``reward_args``), then its fleet started inside ``stack``."""
    factory = _code_factory(where)
    if stack is None:
        raise ConfigError(
            f"{where}: {CODE_REWARD!r} runs a sandbox fleet that only dew train and dew chain "
            "keep open for a whole run"
        )
    try:
        context = factory(args)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}_args.{err}") from None
    try:
        return stack.enter_context(context)  # type: ignore[no-any-return]
    except Exception as err:  # e.g. a container engine that does not answer
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        message = f"{where}_args.runner: the sandbox fleet did not start ({reason})"
        raise ConfigError(message) from None


def make_reward(
    spec: Any, where: str, args: Any = None, stack: contextlib.ExitStack | None = None
) -> Callable[..., float]:
    """The reward ``spec`` names, ready to call as ``reward(data_source, completion,
    ground_truth, extra_info)``.

    A class is instantiated with ``args`` as keyword arguments (a mapping with string keys;
    None: no arguments); a function is returned as it is and takes no ``args``. ``code``
    hands ``args`` to the sandbox's factory and starts its fleet in ``stack``, which the
    caller closes when its run ends (required for ``code``, unused otherwise). Every failure
    is a ``ConfigError`` naming ``where`` (or ``where`` + ``_args`` for the arguments): a name
    that does not load, arguments that are no mapping or given to a function, a constructor
    that raises (its exception type and message), an instance that is not callable.
    """
    args_where = f"{where}_args"
    if args is not None and (
        not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args)
    ):
        raise ConfigError(f"{args_where}: expected a mapping of keyword arguments, got {args!r}")
    if spec == CODE_REWARD:
        return _code_reward(where, args, stack)
    obj = load_reward(spec, where)
    if not inspect.isclass(obj):
        if args:
            raise ConfigError(f"{args_where}: {spec!r} is a function, only a class takes arguments")
        return obj  # type: ignore[no-any-return]
    kwargs = dict(args or {})
    try:
        reward = obj(**kwargs)
    except Exception as err:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise ConfigError(f"{where}: {obj.__name__}({shown}) failed ({reason})") from None
    if not callable(reward):
        raise ConfigError(f"{where}: an instance of {obj.__name__} is not callable")
    return reward  # type: ignore[no-any-return]


__all__ = ["CODE_REWARD", "REWARD_NAMES", "load_reward", "local_path", "make_reward"]
