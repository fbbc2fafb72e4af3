"""``source.regrade``: tool episodes scored again in a clean sandbox (either rollout mode).

``regraded(verifier, section, where)`` checks the section through ``dew-sandbox``'s
``sandbox_regrader`` entry point (``dew`` never imports ``dew.sandbox``) and returns a
``RegradedVerifier``: the same verifier, carrying in ``regrade`` the regrader that
``dew-rollout``'s ``EnvironmentSource`` (``rollout.mode: async``) and the trainer's own
``EpisodeRollout`` (``sync``) take (``collect(task, environment)``,
``grade(task, artifact, cancel=None)``; see ``dew.sessions.regrade``). Its sandbox fleet starts
only when ``open(stack)`` is called, once the run directory is settled, and closes with that
stack; a regrader used before then raises, which fails the session (never trains it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from dew.recipes.schema import ConfigError


class RegradedVerifier:
    """``verifier(episode)`` unchanged, with the clean-sandbox regrader as ``regrade``."""

    def __init__(self, verifier: Callable[[Any], Any], opener: Any) -> None:
        self.verifier = verifier
        self.opener = opener
        self.opened: Any = None

    def __call__(self, episode: Any) -> Any:
        return self.verifier(episode)

    @property
    def regrade(self) -> RegradedVerifier:
        """The regrader (this object: ``collect`` and ``grade`` go to the open one)."""
        return self

    def open(self, stack: contextlib.ExitStack) -> None:
        """Start the sandbox fleet; ``stack`` closes it."""
        self.opened = stack.enter_context(self.opener)
        stack.callback(setattr, self, "opened", None)

    def _regrader(self) -> Any:
        if self.opened is None:
            raise RuntimeError("source.regrade: the sandbox fleet is not open (the run has not "
                               "started or has ended)")  # fmt: skip
        return self.opened

    def collect(self, task: Any, environment: Any) -> Any:
        return self._regrader().collect(task, environment)

    def grade(self, task: Any, artifact: Any, cancel: Any = None) -> float:
        if cancel is None:
            return float(self._regrader().grade(task, artifact))
        return float(self._regrader().grade(task, artifact, cancel=cancel))


def regraded(
    verifier: Callable[[Any], Any], section: Mapping[str, Any], where: str
) -> RegradedVerifier:
    """``verifier`` with the regrader of ``section`` (the ``source.regrade`` mapping).

    Raises:
      ConfigError: ``dew-sandbox`` missing, or a key it refuses, named ``where.<key>``.
    """
    from dew.recipes.plugins import load_plugin

    factory = load_plugin("sandbox_regrader", where, "dew-sandbox")
    try:
        opener = factory(dict(section))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.{err}") from None
    return RegradedVerifier(verifier, opener)


__all__ = ["RegradedVerifier", "regraded"]
