"""What a recipe config points at: local files (``local_path``) and rewards (``load_reward``,
``make_reward``).

Shared by ``dew chain`` (``dew.recipes.cli``) and ``dew train`` (``dew.recipes.train`` and
``dew.recipes.train_config``), so both read paths and rewards the same way. A reward is named
by a short name Dew ships (``REWARD_NAMES``: ``math``) or as ``module:object``; an object that
is a class is instantiated with the config's ``reward_args`` (keyword arguments, none by
default), a function is used as it is.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

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


def load_reward(spec: Any, where: str) -> Any:
    """What ``spec`` names, a class or a function, not yet instantiated: a name of
    ``REWARD_NAMES`` or ``module:object`` (refused with the reason when it cannot load)."""
    if isinstance(spec, str) and spec in REWARD_NAMES:
        spec = REWARD_NAMES[spec]
    if not isinstance(spec, str) or spec.count(":") != 1:
        names = ", ".join(repr(n) for n in REWARD_NAMES)
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


def make_reward(spec: Any, where: str, args: Any = None) -> Callable[..., float]:
    """The reward ``spec`` names, ready to call as ``reward(data_source, completion,
    ground_truth, extra_info)``.

    A class is instantiated with ``args`` as keyword arguments (a mapping with string keys;
    None: no arguments); a function is returned as it is and takes no ``args``. Every failure
    is a ``ConfigError`` naming ``where`` (or ``where`` + ``_args`` for the arguments): a name
    that does not load, arguments that are no mapping or given to a function, a constructor
    that raises (its exception type and message), an instance that is not callable.
    """
    obj = load_reward(spec, where)
    args_where = f"{where}_args"
    if args is not None and (
        not isinstance(args, Mapping) or not all(isinstance(k, str) for k in args)
    ):
        raise ConfigError(f"{args_where}: expected a mapping of keyword arguments, got {args!r}")
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


__all__ = ["REWARD_NAMES", "load_reward", "local_path", "make_reward"]
