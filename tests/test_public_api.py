"""The public API: every public package states its names in ``__all__``, each name has one
public path, and every name is on an API page of the docs.

A public package is any package under ``dew`` whose dotted name has no part starting with
``_`` (``dew.testing`` and ``dew.quickstart`` are tools, not API). The one exception to "one
path" is the top-level ``dew``, whose shortcuts ``dew.Trainer`` and ``dew.Dataset`` are the
paths the user guides import from while ``dew.trainer`` and ``dew.data`` keep the names
beside their neighbours.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re
from collections import defaultdict
from typing import Any

import pytest

import dew

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOT_API = ("dew.testing", "dew.quickstart")
#: Names exported twice on purpose: the top-level shortcuts and the packages they stand for.
SHORTCUTS = {"dew.Trainer": "dew.trainer.Trainer", "dew.Dataset": "dew.data.Dataset"}


def public_packages() -> list[str]:
    names = ["dew"]
    for info in pkgutil.walk_packages(dew.__path__, "dew."):
        parts = info.name.split(".")
        if not info.ispkg or any(p.startswith("_") for p in parts):
            continue
        if info.name.startswith(NOT_API):
            continue
        names.append(info.name)
    return sorted(names)


PACKAGES = public_packages()


def exports() -> dict[str, Any]:
    """``{"package.name": object}`` over every public package's ``__all__``."""
    out = {}
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", ()):
            out[f"{package}.{name}"] = getattr(module, name)
    return out


def test_the_walk_finds_the_packages() -> None:
    for package in ("dew", "dew.rl", "dew.sessions", "dew.rollouts", "dew.objectives.rl",
                    "dew.rollout", "dew.sandbox", "dew.flow"):  # fmt: skip
        assert package in PACKAGES
    assert not any(p.startswith(NOT_API) for p in PACKAGES)


def test_every_public_package_has_all_and_every_name_resolves() -> None:
    missing = [p for p in PACKAGES if not hasattr(importlib.import_module(p), "__all__")]
    # Packages that only group modules (their names are public elsewhere) may omit __all__.
    grouping = {"dew.rollout.scheduler", "dew.rollout.sources"}
    assert set(missing) <= grouping, missing
    assert exports()  # resolving every name raised nothing


def test_each_name_has_one_public_path() -> None:
    paths: dict[int, list[str]] = defaultdict(list)
    for path, obj in exports().items():
        if inspect.ismodule(obj) or isinstance(obj, (str, int, float, tuple, frozenset)):
            continue  # modules and constants are compared by their names, below
        paths[id(obj)].append(path)
    twice = [sorted(p) for p in paths.values() if len(p) > 1]
    allowed = [sorted([short, long]) for short, long in SHORTCUTS.items()]
    assert sorted(twice) == sorted(allowed)


def test_a_second_public_path_is_caught() -> None:
    """The check above sees a duplicate: two packages exporting the same class."""
    from dew.sessions import Session

    planted = {"dew.sessions.Session": Session, "dew.rollouts.Session": Session}
    paths: dict[int, list[str]] = defaultdict(list)
    for path, obj in planted.items():
        paths[id(obj)].append(path)
    assert [len(p) for p in paths.values()] == [2]


def documented_targets() -> list[Any]:
    """The objects and modules named by a ``::: path`` directive on an API page."""
    targets = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for path in re.findall(r"^::: *([\w.]+)", page.read_text(), re.M):
            parts = path.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj: Any = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                targets.append(obj)
                break
            else:
                pytest.fail(f"{page.name}: ::: {path} does not resolve")
    return targets


def undocumented(names: dict[str, Any], targets: list[Any]) -> list[str]:
    modules = [t for t in targets if inspect.ismodule(t)]
    ids = {id(t) for t in targets}

    def documented(name: str, obj: Any) -> bool:
        if id(obj) in ids:
            return True
        if inspect.ismodule(obj):  # a facade module: documented when its names are
            inner = {f"{obj.__name__}.{n}": getattr(obj, n) for n in getattr(obj, "__all__", ())}
            return bool(inner) and not undocumented(inner, targets)
        short = name.rsplit(".", 1)[1]
        return any(getattr(m, short, None) is obj for m in modules)

    return [name for name, obj in names.items() if not documented(name, obj)]


def test_every_public_name_is_on_an_api_page() -> None:
    assert undocumented(exports(), documented_targets()) == []


def test_an_undocumented_name_is_caught() -> None:
    class Planted:
        """Nobody wrote a page for this."""

    assert undocumented({"dew.rl.Planted": Planted}, documented_targets()) == ["dew.rl.Planted"]
