"""What a recipe config points at: local files (``local_path``) and rewards (``load_reward``).

Shared by ``dew chain`` (``dew.recipes.cli``) and ``dew train`` (``dew.recipes.train`` and
``dew.recipes.train_config``), so both read paths and ``module:function`` rewards the same way.
"""

from __future__ import annotations

import importlib
import os
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


def load_reward(spec: Any, where: str) -> Any:
    """The callable ``module:function`` names (refused with the reason when it cannot load)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"{where}: expected 'module:function', got {spec!r}")
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


__all__ = ["load_reward", "local_path"]
