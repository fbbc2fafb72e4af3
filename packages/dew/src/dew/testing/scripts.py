"""Load a Python file that is not on the import path (an example script) as a module.

The examples under ``examples/`` are scripts, not packages, yet their tests call their
functions (``arguments``, ``train``, ``main``) rather than run them in a subprocess, so the
test sees what they return. ``load_script(path)`` is the one way the test suites do that.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """Execute the file at ``path`` as a fresh module and return it.

    Args:
      path: a ``.py`` file.
      name: the module's ``__name__``; the file's stem by default. The module is not added
        to ``sys.modules``, so loading the same file twice gives two independent modules.

    Raises:
      FileNotFoundError: ``path`` is not a file (the message names it).
      ValueError: ``path`` does not end in ``.py``.
      Whatever the script raises while it runs its top level.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"load_script: path {str(path)!r} is not a file")
    if path.suffix != ".py":
        raise ValueError(f"load_script: path must be a .py file, got {str(path)!r}")
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
