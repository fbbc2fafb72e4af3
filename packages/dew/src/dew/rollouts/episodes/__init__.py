"""Multi-turn tool episodes collected inside the trainer.

* the protocol: :class:`Environment`, :class:`Observation` and :class:`EpisodeStatus`,
  :class:`Action`, :class:`Transition`, :class:`Episode`, :class:`EpisodeId`, the verifier
  and ``record`` callback types;
* the one action validation :func:`check_action` and its named errors;
* :func:`session_of` and :func:`project` (episodes to packed GRPO rows);
* the modules behind ``EpisodeRollout`` (``rollout``: the Trainer's ``rollout=`` hook),
  ``EpisodeJournal`` (``journal``: its crash-safe SQLite record of pending and completed
  turns) and ``EpisodeFailure``/``EpisodeCancelled`` (``errors``), whose public path is
  ``dew.objectives.rl``.
"""

from dew.rollouts.episodes.errors import (
    EmptyContextError,
    InvalidAction,
    LikelihoodError,
    MixedOriginError,
    TerminationError,
    TokenIdError,
    TokensAfterEosError,
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
from dew.rollouts.episodes.session import session_of
from dew.rollouts.episodes.slot import VerifierError
from dew.rollouts.episodes.validation import check_action

__all__ = [
    "Action",
    "EmptyContextError",
    "Environment",
    "EnvironmentFactory",
    "Episode",
    "EpisodeId",
    "EpisodeStatus",
    "InvalidAction",
    "LikelihoodError",
    "MixedOriginError",
    "Observation",
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
