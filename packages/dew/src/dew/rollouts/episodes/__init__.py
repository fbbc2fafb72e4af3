"""Multi-turn tool episodes collected inside the trainer.

* the protocol: :class:`Environment`, :class:`Observation` and :class:`EpisodeStatus`,
  :class:`Action`, :class:`Transition`, :class:`Episode`, :class:`EpisodeId`, the verifier
  and ``record`` callback types;
* the one action validation :func:`check_action` and its named errors;
* :class:`EpisodeFailure` / :class:`EpisodeCancelled`;
* :func:`session_of` and :func:`project` (episodes to packed GRPO rows);
* :class:`EpisodeRollout`, the Trainer's ``rollout=`` hook, and :class:`EpisodeJournal`, its
  crash-safe SQLite record of pending and completed turns.
"""

from dew.rollouts.episodes.errors import (
    EmptyContextError,
    EpisodeCancelled,
    EpisodeFailure,
    InvalidAction,
    LikelihoodError,
    MixedOriginError,
    TerminationError,
    TokenIdError,
    TokensAfterEosError,
)
from dew.rollouts.episodes.journal import (
    EpisodeJournal,
    JournalBusy,
    JournalMismatch,
    PolicyMismatch,
)
from dew.rollouts.episodes.projection import project
from dew.rollouts.episodes.protocol import (
    Action,
    Environment,
    EnvironmentFactory,
    Episode,
    EpisodeId,
    EpisodeStatus,
    Observation,
    Record,
    Transition,
    Verifier,
)
from dew.rollouts.episodes.rollout import EpisodeRollout
from dew.rollouts.episodes.session import session_of
from dew.rollouts.episodes.slot import VerifierError
from dew.rollouts.episodes.validation import check_action

__all__ = [
    "Action",
    "EmptyContextError",
    "Environment",
    "EnvironmentFactory",
    "Episode",
    "EpisodeCancelled",
    "EpisodeFailure",
    "EpisodeId",
    "EpisodeJournal",
    "EpisodeRollout",
    "EpisodeStatus",
    "InvalidAction",
    "JournalBusy",
    "JournalMismatch",
    "LikelihoodError",
    "MixedOriginError",
    "Observation",
    "PolicyMismatch",
    "Record",
    "TerminationError",
    "TokenIdError",
    "TokensAfterEosError",
    "Transition",
    "Verifier",
    "VerifierError",
    "check_action",
    "project",
    "session_of",
]
