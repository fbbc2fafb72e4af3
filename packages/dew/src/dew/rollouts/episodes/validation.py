"""The one validation every action goes through: live, imported or restored from a journal.

:func:`check_action` returns a normalised copy (int64 ids, float64 likelihoods, plain bool and
int) or raises a named :class:`~dew.rollouts.episodes.errors.InvalidAction`:

- ``EmptyContextError``: the context holds no ids;
- ``TokenIdError``: an id that is not a nonnegative integer (``True``/``False`` and
  ``np.bool_`` are refused although Python counts them as integers), or no sampled id at all;
- ``LikelihoodError``: ``raw_log_probs`` or ``behavior_log_probs`` not one finite value per
  sampled id;
- ``TokensAfterEosError``: an EOS id before the last position;
- ``TerminationError``: ``terminated`` is not a bool, or disagrees with whether the last id
  is EOS (with no EOS configured, no turn can terminate).

The upper bound of the ids (the vocabulary) is left to the caller, which knows the model.
:func:`check_collaborators` checks what ``EpisodeRollout`` is built with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from dew.checks import is_integer
from dew.inference.canvas.config import refuse_canvas
from dew.rollouts.episodes.errors import (
    EmptyContextError,
    InvalidAction,
    LikelihoodError,
    TerminationError,
    TokenIdError,
    TokensAfterEosError,
)
from dew.rollouts.episodes.protocol import Action
from dew.sampling import Sampling
from dew.sessions.records import token_ids


def _ids(value: Any, name: str, episode: Any, turn: int | None) -> np.ndarray:
    try:
        return token_ids(value, name)
    except (TypeError, ValueError) as err:
        message = str(err).split(": ", 1)[-1]
        field = str(err).split(": ", 1)[0]
        raise TokenIdError(field, message, episode, turn) from None


def _likelihoods(value: Any, name: str, n: int, episode: Any, turn: int | None) -> np.ndarray:
    if value is None:
        raise LikelihoodError(name, f"expected {n} log-probabilities, got None", episode, turn)
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise LikelihoodError(name, f"expected numbers, got {value!r}", episode, turn) from None
    if array.ndim != 1 or array.shape[0] != n:
        raise LikelihoodError(
            name,
            f"expected one log-probability per sampled id ({n}), got shape {array.shape}",
            episode,
            turn,
        )
    finite = np.isfinite(array)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise LikelihoodError(
            f"{name}[{bad}]", f"expected a finite log-probability, got {array[bad]}", episode, turn
        )
    return array


def check_action(
    action: Action,
    eos_ids: Iterable[int],
    *,
    episode: Any = None,
    turn: int | None = None,
) -> Action:
    """Validate one action against the configured EOS ids; return its normalised copy."""
    if not isinstance(action, Action):
        raise TypeError(f"action: expected an Action, got {type(action).__name__}")
    eos = {int(i) for i in eos_ids}
    context = _ids(action.context, "context", episode, turn)
    if context.size == 0:
        raise EmptyContextError("context", "expected at least one id, got none", episode, turn)
    tokens = _ids(action.tokens, "tokens", episode, turn)
    if tokens.size == 0:
        raise TokenIdError("tokens", "expected at least one sampled id, got none", episode, turn)
    raw = _likelihoods(action.raw_log_probs, "raw_log_probs", tokens.size, episode, turn)
    behavior = _likelihoods(
        action.behavior_log_probs, "behavior_log_probs", tokens.size, episode, turn
    )
    hits = np.isin(tokens, np.asarray(sorted(eos), dtype=np.int64)) if eos else np.zeros(0, bool)
    if eos and hits[:-1].any():
        first = int(np.argmax(hits))
        raise TokensAfterEosError(
            f"tokens[{first}]",
            f"EOS id {tokens[first]} is followed by {tokens.size - first - 1} more ids",
            episode,
            turn,
        )
    if not isinstance(action.terminated, bool | np.bool_):
        raise TerminationError(
            "terminated", f"expected a bool, got {action.terminated!r}", episode, turn
        )
    ends_on_eos = bool(eos) and bool(hits[-1])
    if bool(action.terminated) != ends_on_eos:
        if action.terminated:
            message = (
                f"True, but the last sampled id {tokens[-1]} is not an EOS id "
                f"({sorted(eos) or 'none configured'})"
            )
        else:
            message = f"False, but the last sampled id {tokens[-1]} is an EOS id"
        raise TerminationError("terminated", message, episode, turn)
    step = action.policy_step
    if not is_integer(step) or step < 0:
        raise InvalidAction(
            "policy_step", f"expected a nonnegative integer, got {step!r}", episode, turn
        )
    return replace(
        action,
        context=context,
        tokens=tokens,
        raw_log_probs=raw,
        behavior_log_probs=behavior,
        terminated=bool(action.terminated),
        policy_step=int(step),
    )


def check_collaborators(
    policy: Any, environment_factory: Any, verifier: Any, record: Any, sampling: Any
) -> None:
    """What ``EpisodeRollout`` is built with, refused by name: a policy with ``bind`` and
    ``__call__`` (a canvas generator raises ``NotAutoregressive``: it gives no per-token
    likelihoods), callable factory and verifier, ``record`` None or callable, a ``Sampling``."""
    refuse_canvas("policy", policy, "EpisodeRollout")
    refuse_canvas("sampling", sampling, "EpisodeRollout")
    for name in ("bind", "__call__"):
        if not callable(getattr(policy, name, None)):
            raise TypeError(f"policy: expected bind() and __call__, it has no {name!r}")
    if not callable(environment_factory):
        raise TypeError(
            f"environment_factory: expected a callable, got {type(environment_factory)}"
        )
    if not callable(verifier):
        raise TypeError(f"verifier: expected a callable, got {type(verifier).__name__}")
    if record is not None and not callable(record):
        raise TypeError(f"record: expected None or a callable, got {type(record).__name__}")
    if not isinstance(sampling, Sampling):
        raise TypeError(f"sampling: expected a dew.sampling.Sampling, got {type(sampling)}")


__all__ = ["check_action", "token_ids"]
