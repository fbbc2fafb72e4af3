"""Named errors of tool episodes: aborted episodes and refused actions.

``EpisodeFailure`` ends a collection when an environment, the policy call or the verifier
raised; ``EpisodeCancelled`` (a subclass) when the work was cancelled, by
``asyncio.CancelledError`` or ``concurrent.futures.CancelledError`` alike (the original object
is the ``__cause__``), or when an environment itself answered CANCELLED (no cause then). Both
carry the partial :class:`~dew.rollouts.episodes.protocol.Episode`.

``InvalidAction`` and its subclasses refuse a malformed action; each names the episode, the
turn and the field.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

CANCELLATIONS: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    concurrent.futures.CancelledError,
)


def is_cancellation(error: BaseException) -> bool:
    """True for an asyncio or concurrent.futures cancellation."""
    return isinstance(error, CANCELLATIONS)


class EpisodeFailure(RuntimeError):
    """An episode (and with it its whole group) was aborted before any update.

    Attributes:
      episode: the partial episode, its status ERROR or CANCELLED.
    """

    def __init__(self, message: str, episode: Any) -> None:
        super().__init__(message)
        self.episode = episode


class EpisodeCancelled(EpisodeFailure):
    """An episode was cancelled; ``__cause__`` is the original cancellation, if any."""


class InvalidAction(ValueError):
    """A model turn failed validation.

    Attributes:
      episode: the ``EpisodeId`` (or ``None`` when validated outside an episode).
      turn: the 0-based turn of the action in its episode (or ``None``).
      field: the refused field, e.g. ``"tokens[3]"``.
    """

    def __init__(self, field: str, message: str, episode: Any = None, turn: int | None = None):
        where = []
        if episode is not None:
            where.append(f"episode {episode}")
        if turn is not None:
            where.append(f"turn {turn}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(f"{prefix}Action.{field}: {message}")
        self.episode = episode
        self.turn = turn
        self.field = field


class EmptyContextError(InvalidAction):
    """The action's context holds no ids."""


class TokenIdError(InvalidAction):
    """A context or sampled id is not a nonnegative integer (booleans are refused)."""


class LikelihoodError(InvalidAction):
    """Raw or behavior likelihoods are missing, misaligned with the tokens or not finite."""


class TerminationError(InvalidAction):
    """``terminated`` disagrees with whether the last sampled id is an EOS id."""


class TokensAfterEosError(InvalidAction):
    """An EOS id is followed by more sampled ids."""


class MixedOriginError(ValueError):
    """Records of two separately bound policies were projected into one batch."""


__all__ = [
    "CANCELLATIONS",
    "EmptyContextError",
    "EpisodeCancelled",
    "EpisodeFailure",
    "InvalidAction",
    "LikelihoodError",
    "MixedOriginError",
    "TerminationError",
    "TokenIdError",
    "TokensAfterEosError",
    "is_cancellation",
]
