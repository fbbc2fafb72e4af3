"""mkdocs hooks for the Dew docs site (listed under ``hooks:`` in ``mkdocs.yml``).

``dew`` is one import namespace over several distributions: ``packages/dew/src/dew/__init__.py``
extends ``__path__`` with ``pkgutil.extend_path`` and the other distributions ship only their
subpackage. griffe (what mkdocstrings reads the sources with) treats an ``__init__.py`` as a
pkgutil-style namespace only when it contains the literal one-liner
``__path__ = __import__("pkgutil").extend_path(__path__, __name__)``; Dew writes the same call
as ``from pkgutil import extend_path`` plus ``__path__ = extend_path(__path__, __name__)``.
Unless griffe sees a namespace it stops at ``packages/dew/src/dew`` and cannot find ``dew.rl``
or ``dew.sandbox``. This hook widens griffe's check to both spellings. If griffe moves the
helper, the hook raises at start-up, so a strict build fails loudly instead of silently
dropping pages.

It also accepts Google-style parameter lines that document several parameters at once
(``epsilon_low, epsilon_high: the clip range``). griffe reads ``"epsilon_low, epsilon_high"``
as one parameter name and warns that it is not in the signature, which would fail the strict
build although nothing is wrong. Only those grouped names are let through; a single documented
name missing from the signature (a stale docstring) still warns and fails the build.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

_GROUPED_PARAMETER = re.compile(
    r"Parameter '\w+(?:, \w+)+' does not appear in the function signature"
)
_EXTEND_PATH = re.compile(r"__path__\s*=\s*(?:__import__\([\"']pkgutil[\"']\)\.)?extend_path\(")


class _GroupedParameters(logging.Filter):
    """Drop griffe's unknown-parameter warning for grouped names such as ``a, b``."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _GROUPED_PARAMETER.search(record.getMessage())


def on_startup(**_: Any) -> None:
    """Teach griffe the ``extend_path`` namespace idiom; let grouped parameter lines pass."""
    griffe_logger = logging.getLogger("mkdocs.plugins.griffe")
    if not any(isinstance(f, _GroupedParameters) for f in griffe_logger.filters):
        griffe_logger.addFilter(_GroupedParameters())
    from griffe._internal import finder

    original = getattr(finder, "_is_pkg_style_namespace", None)
    if original is None:
        raise RuntimeError(
            "tools/mkdocs_hooks.py: griffe._internal.finder._is_pkg_style_namespace is gone; "
            "update the hook for this griffe version"
        )
    if getattr(original, "_dew_hook", False):
        return

    def is_namespace(init_module: Path) -> bool:
        code = init_module.read_text(encoding="utf-8-sig")
        return bool(original(init_module) or _EXTEND_PATH.search(code))

    is_namespace._dew_hook = True  # type: ignore[attr-defined]
    finder._is_pkg_style_namespace = is_namespace
