"""`Draw`, the result of one rollout request, and `RolloutServer`, the interface every
rollout backend implements.

A backend takes token-id prompts and returns, for each, the ids it sampled with their
likelihoods and the policy version that produced them. Versions are plain ints chosen by
the trainer; a draw's `version` is the oldest weights version that may have produced any
of its tokens, so a trainer measuring staleness never under-counts it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Draw:
    """One finished rollout request.

    prompt_ids: int32 `[P]`, the prompt as sent. ids: int32 `[n]`, the ids the backend
    sampled (the EOS id included when it ended the draw). behavior_log_probs: float32
    `[n]`, log-likelihood of each id under the distribution it was sampled from.
    raw_log_probs: float32 `[n]` under the unmodified policy, or None when the backend does
    not report it (remote engines). eos: True when an EOS id ended the draw, False when the
    budget did. version: the oldest weights version that may have produced any token.
    support: int32 `[n, K]` ids the sampler kept for each drawn token, -1 padded, or None.
    routed_experts: the engine's per-token expert routing (`[n_tokens, layers, top_k]`
    ints, as the engine reported it) or None.
    """

    prompt_ids: np.ndarray
    ids: np.ndarray
    behavior_log_probs: np.ndarray
    raw_log_probs: np.ndarray | None
    eos: bool
    version: int
    support: np.ndarray | None = None
    routed_experts: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.ids.shape[0]
        if self.behavior_log_probs.shape != (n,):
            raise ValueError(
                f"behavior_log_probs: expected shape ({n},) like ids, "
                f"got {self.behavior_log_probs.shape}"
            )
        if self.raw_log_probs is not None and self.raw_log_probs.shape != (n,):
            raise ValueError(
                f"raw_log_probs: expected shape ({n},) like ids, got {self.raw_log_probs.shape}"
            )
        if self.support is not None and (self.support.ndim != 2 or self.support.shape[0] != n):
            raise ValueError(f"support: expected shape ({n}, K), got {self.support.shape}")


@runtime_checkable
class RolloutServer(Protocol):
    """What the trainer needs from a rollout backend.

    `submit` queues a request and returns at once; the future resolves to a `Draw` or
    raises the backend's named error. `load(variables, version)` publishes new weights;
    requests already running keep going across it. `version` is the version now served.
    """

    @property
    def version(self) -> int: ...

    def submit(
        self,
        prompt_ids: Sequence[int] | np.ndarray,
        max_new_tokens: int,
        *,
        seed: int | None = None,
    ) -> Future[Draw]: ...

    def load(self, variables: Any, version: int) -> None: ...

    def close(self) -> None: ...


def check_prompt(prompt_ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """The prompt as int32 `[P]`, refusing an empty, non-1-D or negative one by name."""
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1 or prompt.shape[0] == 0:
        raise ValueError(
            f"prompt_ids: expected a non-empty 1-D list of ids, got shape {prompt.shape}"
        )
    if not np.issubdtype(prompt.dtype, np.integer):
        raise TypeError(f"prompt_ids: expected integer ids, got dtype {prompt.dtype}")
    if (prompt < 0).any():
        raise ValueError(f"prompt_ids: expected ids >= 0, got {int(prompt.min())}")
    return prompt.astype(np.int32)


def check_budget(max_new_tokens: Any) -> int:
    """`max_new_tokens` as a positive int, refused by name otherwise."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
        raise TypeError(f"max_new_tokens: expected an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    return int(max_new_tokens)
