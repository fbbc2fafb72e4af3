"""``session_of``: an episode as a packable ``Session`` (one ``Call`` per action).

Each action becomes a call whose prompt is the context the policy read and whose sampled ids
are exactly the tokens it drew, with both likelihoods copied, never recomputed. ``pack`` then
merges call ``k + 1`` into call ``k``'s chain only when its context starts with that chain
(context plus sampled ids), so observations appended by the environment sit between sampled
ids without ever being targets.

Status: COMPLETED -> COMPLETED, TRUNCATED -> TRUNCATED (masked by ``pack``'s default
truncation), CANCELLED -> CANCELLED, ERROR -> INFRA_ERROR (no rows, out of every baseline).
A RUNNING episode is refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from dew.rollouts.episodes.protocol import Episode, EpisodeStatus
from dew.rollouts.episodes.validation import check_action
from dew.sessions.records import Call, Session, Status

_STATUS = {
    EpisodeStatus.COMPLETED: Status.COMPLETED,
    EpisodeStatus.TRUNCATED: Status.TRUNCATED,
    EpisodeStatus.CANCELLED: Status.CANCELLED,
    EpisodeStatus.ERROR: Status.INFRA_ERROR,
}


def session_of(episode: Episode, group: int = 0, eos_ids: Iterable[int] | None = None) -> Session:
    """The ``Session`` of a finished episode.

    Args:
      episode: a terminal :class:`Episode`.
      group: the session's group; ``pack`` computes advantages over ``(task, group)``.
      eos_ids: when given, every action is validated against them first.
    """
    if not isinstance(episode, Episode):
        raise TypeError(f"episode: expected an Episode, got {type(episode).__name__}")
    if episode.status is EpisodeStatus.RUNNING:
        raise ValueError(
            f"episode {episode.id}: Episode.status is RUNNING; expected a finished one"
        )
    calls = []
    for turn, action in enumerate(episode.actions):
        if eos_ids is not None:
            action = check_action(action, eos_ids, episode=episode.id, turn=turn)
        calls.append(
            Call(
                prompt_ids=action.context,
                sampled_ids=action.tokens,
                behavior_log_probs=action.behavior_log_probs,
                raw_log_probs=action.raw_log_probs,
                finish_reason="stop" if action.terminated else "length",
                version=int(action.policy_step),
            )
        )
    return Session(
        task=episode.id.task,
        group=group,
        sample=episode.id.sample,
        attempt=episode.id.step,
        calls=tuple(calls),
        status=_STATUS[episode.status],
        reward=episode.reward,
        detail=episode.detail,
    )


__all__ = ["session_of"]
