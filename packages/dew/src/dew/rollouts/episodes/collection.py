"""Collection steps of ``EpisodeRollout`` that hold no rollout state.

``draw_slots`` opens the ``[B * G]`` slots of one collection with their seeds, ``recover``
restores them from the journal, ``prepare_action`` turns one live slot's generation into the
action of its turn, ``finish_slot`` scores (and re-grades) an ended episode and releases it,
and ``abort_collection`` releases every open environment after a failure and raises the
episode error. The rollout itself (``rollout.py``) keeps the loop, the
environment threads and the packing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.rollouts.episodes.cohort import RemoteFailure
from dew.rollouts.episodes.errors import (
    EpisodeCancelled,
    EpisodeFailure,
    is_cancellation,
)
from dew.rollouts.episodes.journal import (
    EpisodeJournal,
    JournalBusy,
    JournalMismatch,
    attempt_header,
    policy_digest,
)
from dew.rollouts.episodes.protocol import (
    Action,
    EpisodeId,
    EpisodeStatus,
    Record,
    Transition,
    Verifier,
)
from dew.rollouts.episodes.slot import Slot
from dew.rollouts.episodes.validation import check_action
from dew.sampling import Sampling

_SEED_SALT = 0x5EED


def draw_slots(
    tasks: Sequence[int],
    groups: int,
    step: int,
    key: jax.Array,
    origin: Any,
    journal: EpisodeJournal | None,
) -> list[Slot]:
    """This rank's ``len(tasks) * groups`` slots; seeds are drawn for the global positions."""
    rank, ranks = jax.process_index(), jax.process_count()
    n = len(tasks) * groups
    bits = jax.random.bits(jax.random.fold_in(key, _SEED_SALT), (n * ranks,), jnp.uint32)
    seeds = np.asarray(jax.device_get(bits))[rank * n : (rank + 1) * n]
    slots = []
    for row, task in enumerate(tasks):
        for sample in range(groups):
            index = row * groups + sample
            episode_id = EpisodeId(task, step, sample, int(seeds[index]))
            slots.append(Slot(episode_id, rank * len(tasks) + row, origin, index, journal))
    return slots


def recover(
    journal: EpisodeJournal,
    slots: list[Slot],
    tasks: Sequence[int],
    clocks: tuple[int, int],
    key: jax.Array,
    variables: Any,
    sampling: Sampling,
    budgets: list[int],
) -> None:
    """Open this rank's journal, check it against this attempt and restore its slots."""
    journal.open(jax.process_index())
    header = attempt_header(tasks, dataclasses.asdict(sampling), budgets)
    key_hex = np.asarray(jax.device_get(jax.random.key_data(key))).tobytes().hex()
    records = journal.begin(clocks[0], clocks[1], header, key_hex, policy_digest(variables))
    for slot in slots:
        if slot.index in records:
            slot.restore(records[slot.index])


def prepare_action(
    slot: Slot,
    context: Any,
    generation: Any,
    policy_step: int,
    sampling: Sampling,
    max_new_tokens: int,
) -> Action | None:
    """The turn of a live slot: a replayed one (nothing to send), a reused pending draw or
    a fresh action to send, or a budget-truncated one (recorded, never sent)."""
    eos = sampling.eos_ids
    turn = slot.turns
    replayed = slot.replayed()
    if replayed is not None:  # completed before a crash: not sent again
        action = dataclasses.replace(replayed.action, origin=slot.origin)
        checked = check_action(action, eos, episode=slot.id, turn=turn)
        slot.transitions[-1] = Transition(checked, replayed.observation)
        return None
    if slot.pending_action is not None:  # drawn before a crash: reused, not redrawn
        action = dataclasses.replace(slot.pending_action, origin=slot.origin)
        slot.pending_action = None
        return check_action(action, eos, episode=slot.id, turn=turn)
    action = Action(
        context=context,
        tokens=np.asarray(generation.ids),
        raw_log_probs=np.asarray(generation.raw_log_probs),
        behavior_log_probs=np.asarray(generation.behavior_log_probs),
        terminated=bool(generation.eos),
        policy_step=policy_step,
        origin=slot.origin,
    )
    action = check_action(action, eos, episode=slot.id, turn=turn)
    if action.terminated:
        return action
    slot.record_truncated(action, f"response used max_new_tokens={max_new_tokens} without EOS")
    return None


def finish_slot(slot: Slot, verifier: Verifier, record: Record | None, regrade: Any) -> None:
    """End ``slot``'s episode and hand it to ``record``: a journal's recorded ending is kept
    as it was; otherwise the verifier scores it while its environment is open, a completed
    episode's artifact is collected for ``regrade`` (a ``dew.sessions.regrade.Regrade`` or
    None), the environment is released, the episode re-graded (a disagreeing or failed
    re-grade makes it ERROR with no reward: masked, out of its group's baseline) and its
    ending committed to the journal.

    Raises:
      EpisodeCancelled: the environment answered CANCELLED.
    """
    if slot.ending is not None:  # finished and scored before a crash: keep its record
        slot.status, slot.detail, slot.reward = slot.ending
        slot.release()
    else:
        if slot.status is EpisodeStatus.CANCELLED:
            raise EpisodeCancelled(
                f"episode {slot.id}: the environment answered CANCELLED ({slot.detail!r})",
                slot.episode(),
            )
        slot.verify(verifier)
        regraded = regrade is not None and slot.status is EpisodeStatus.COMPLETED
        collected = slot.collect(regrade) if regraded else None  # (artifact, error)
        slot.release()
        if collected is not None:
            slot.regrade(regrade, *collected)
        slot.commit_ending()
    if record is not None:
        record(slot.episode())


def abort_collection(
    slots: list[Slot], current: Slot | None, err: BaseException, record: Record | None
) -> None:
    """Release every open environment under ``err`` and raise the episode error."""
    culprit = None if isinstance(err, RemoteFailure) else current
    for slot in slots:
        if slot.is_open:
            slot.abort(err)
    if isinstance(err, JournalMismatch | JournalBusy):
        raise err  # a refused recovery is a configuration error, not an episode's failure
    if isinstance(err, EpisodeFailure):
        if record is not None and err.episode is not None:
            record(err.episode)
        raise err
    if not isinstance(err, Exception) and not is_cancellation(err):
        raise err  # KeyboardInterrupt, SystemExit: environments released, then re-raised
    cancelled = is_cancellation(err)
    episode = None
    if culprit is not None:
        culprit.end(
            EpisodeStatus.CANCELLED if cancelled else EpisodeStatus.ERROR,
            f"{type(err).__name__}: {err}",
        )
        episode = culprit.episode()
        if record is not None:
            record(episode)
    kind = EpisodeCancelled if cancelled else EpisodeFailure
    where = f"episode {culprit.id}" if culprit is not None else "collection"
    raise kind(f"{where}: aborted by {type(err).__name__}: {err}", episode) from err


__all__ = ["abort_collection", "draw_slots", "finish_slot", "prepare_action", "recover"]
