"""Lazy package exports: a package names what it exports and where each name lives, and the
module behind a name is imported the first time the name is read.

Dew's packages export classes whose modules import JAX, the inference engine or an optional
dependency. Importing such a package eagerly would make ``import dew.rl`` or reading a
session record as slow as importing everything. Each package instead writes one table::

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {
        "Trainer": "dew.trainer",        # getattr(import_module("dew.trainer"), "Trainer")
        "models": "dew.models",          # the module itself: its last part is the name
        "pack": ".packing",              # relative to the package
    })

A name equal to the last part of its module path stands for the module itself. A name that
is not in the table raises ``AttributeError`` as Python's own lookup does, naming the
package. ``__all__`` is the table's names, sorted; ``__dir__`` adds them to the module's own
attributes. This module imports nothing of ``dew``, so every package may use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` exporting ``table``'s names.

    Args:
      package: the package's ``__name__``.
      table: exported name -> absolute module path, or one starting with ``.`` resolved
        against ``package``.

    Raises:
      ValueError: a module path is empty.
    """
    homes: dict[str, str] = {}
    for name, module in table.items():
        if not module or module == ".":
            raise ValueError(f"{package}: the module of {name!r} is empty")
        homes[name] = package + module if module.startswith(".") else module

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if name == module.rsplit(".", 1)[-1]:
            return importlib.import_module(module)
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__, sorted(homes)


__all__ = ["lazy_exports"]
