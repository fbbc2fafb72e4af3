"""What ``dew train`` and ``dew chain`` find through entry points instead of imports.

``dew`` never imports the satellite distributions (``tests/test_imports.py`` checks it). A
config that needs one of them (an asynchronous rollout from ``dew-rollout``, the ``code``
reward from ``dew-sandbox``, the ``flow`` kind from ``dew-flow``) reaches it through the
entry-point group ``dew.recipes``: each distribution registers the names it provides, and
installing it is what turns the feature on. ``load_plugin`` loads one by name, or refuses
the config with a one-line ``ConfigError`` naming the key and the distribution to install.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from dew.recipes.schema import ConfigError

GROUP = "dew.recipes"


def load_plugin(name: str, where: str, distribution: str) -> Any:
    """The object registered as ``name`` in the group ``dew.recipes``.

    Args:
      name: the entry point's name (``async_rollout``, ``code_reward``, ``flow``).
      where: the config key that asked for it, named by the error.
      distribution: the distribution that provides it, named by the error.

    Raises:
      ConfigError: nothing installed registers ``name``, or loading it fails.
    """
    for entry in entry_points(group=GROUP, name=name):
        try:
            return entry.load()
        except Exception as err:  # an installed but broken distribution
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
            raise ConfigError(f"{where}: {entry.value} does not load ({reason})") from None
    raise ConfigError(
        f"{where}: needs the {distribution} distribution (pip install {distribution}); "
        f"nothing installed registers {name!r} in the entry-point group {GROUP!r}"
    )


__all__ = ["GROUP", "load_plugin"]
