"""dew.sandbox reads the standard library, the docker SDK and itself, nothing else.

The distribution installs without ``dew`` and without JAX, so no source file of it may import
another part of the ``dew`` namespace or a third-party package other than ``docker``. Each
file is parsed with ``ast`` (nothing is imported); the checker is also run on planted
violations so that one that accepts everything fails.
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

SOURCES = pathlib.Path(__file__).resolve().parents[1] / "src" / "dew" / "sandbox"
ALLOWED_THIRD_PARTY = {"docker"}


def imported(source: str) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for every import; relative imports stay in dew.sandbox."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "dew.sandbox"))
                continue
            module = node.module or ""
            if module == "dew":  # `from dew import models` imports dew.models
                found.extend((node.lineno, f"dew.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, module))
    return found


def foreign_imports(source: str) -> list[str]:
    """The imports of ``source`` that leave the standard library, docker and dew.sandbox."""
    bad = []
    for line, name in imported(source):
        top = name.split(".")[0]
        if top == "__future__" or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
            continue
        if name == "dew.sandbox" or name.startswith("dew.sandbox."):
            continue
        bad.append(f"line {line}: {name}")
    return bad


def test_there_are_sources_to_check() -> None:
    names = {path.name for path in SOURCES.glob("*.py")}
    assert {"__init__.py", "quickstart.py", "fleet.py", "reward.py"} <= names


def test_no_source_imports_dew_jax_or_another_package() -> None:
    bad = {
        path.name: found
        for path in sorted(SOURCES.rglob("*.py"))
        if (found := foreign_imports(path.read_text()))
    }
    assert not bad, f"dew.sandbox must import only the stdlib, docker and itself: {bad}"


@pytest.mark.parametrize(
    "source",
    [
        "import dew.models\n",
        "from dew import trainer\n",
        "from dew.quickstart.plugins import GROUP\n",
        "import jax.numpy as jnp\n",
        "def f():\n    import numpy\n",
        "import dew\n",
    ],
)
def test_planted_foreign_import_is_caught(source: str) -> None:
    assert foreign_imports(source)


def test_allowed_imports_pass() -> None:
    source = (
        "from __future__ import annotations\nimport os, json\nimport docker.errors\n"
        "from docker.types import Ulimit\nfrom dew.sandbox.limits import SandboxLimits\n"
        "from . import outcome\nfrom dew import sandbox\n"
    )
    assert foreign_imports(source) == []
