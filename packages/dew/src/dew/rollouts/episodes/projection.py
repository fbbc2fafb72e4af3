"""Project a cohort of finished episodes into one packed GRPO batch.

``project(episodes, groups, width, rows)`` turns each episode into a session with
``session_of`` and packs them with ``pack`` (truncation ``"mask"``: truncated and errored
episodes take no rows and no part in their group's baseline). Every column is
``[rows, width]`` (``old_log_probs`` always present, zero where nothing trains); ``rewards``
``[E]`` holds each episode's reward (0 where it has none) for
the loss's ``reward/mean`` metric.

All episodes must come from one collection binding: records carrying different origin tokens
raise :class:`~dew.rollouts.episodes.errors.MixedOriginError`, even when their
clocks agree. Episodes without an origin (built by hand) are accepted alongside one origin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dew.rollouts.episodes.errors import MixedOriginError
from dew.rollouts.episodes.protocol import Episode
from dew.rollouts.episodes.session import session_of
from dew.sessions.packing import pack


def check_one_origin(episodes: Sequence[Episode]) -> None:
    """Refuse episodes (or actions) of two separately bound policies."""
    seen: list[Any] = []
    where: list[str] = []
    for index, episode in enumerate(episodes):
        origins = [episode.origin, *(a.origin for a in episode.actions)]
        for turn, origin in enumerate(origins):
            if origin is None or any(origin is o for o in seen):
                continue
            seen.append(origin)
            where.append(f"episodes[{index}]" + ("" if turn == 0 else f".actions[{turn - 1}]"))
            if len(seen) > 1:
                raise MixedOriginError(
                    f"episodes: {where[0]} and {where[1]} come from two separate policy "
                    "bindings; project the batches of each collection on their own"
                )


def project(
    episodes: Sequence[Episode],
    groups: Sequence[int],
    *,
    width: int,
    rows: int,
    estimator: str = "group",
    eos_ids: Iterable[int] | None = None,
) -> dict[str, Any]:
    """Pack ``episodes`` (``groups[i]`` is episode ``i``'s advantage group) into
    ``[rows, width]`` columns plus ``rewards`` ``[len(episodes)]``."""
    episodes = list(episodes)
    if len(groups) != len(episodes):
        raise ValueError(f"groups: expected one per episode ({len(episodes)}), got {len(groups)}")
    check_one_origin(episodes)
    eos = tuple(eos_ids) if eos_ids is not None else None
    sessions = [session_of(e, group=int(g), eos_ids=eos) for e, g in zip(episodes, groups)]
    out: dict[str, Any] = pack(
        sessions,
        width,
        rows=rows,
        estimator=estimator,
        truncation="mask",
        eos_ids=eos or None,
    )
    # every action carries raw likelihoods; keep the column even when nothing trains, so
    # every batch (and every rank's share of one) has the same columns
    out.setdefault("old_log_probs", np.zeros_like(out["behavior_log_probs"]))
    out["rewards"] = np.asarray(
        [0.0 if e.reward is None else e.reward for e in episodes], np.float32
    )
    return out


__all__ = ["check_one_origin", "project"]
