"""What the continuous-batching ``Server`` takes in and hands back: requests and completions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


class RequestTooLarge(ValueError):
    """A request whose prompt and budget cannot fit in one cache slot."""


@dataclasses.dataclass
class Completion:
    """A finished request.

    ids: int32 `[n]` sampled ids (EOS included when it ended the request).
    raw_log_probs, behavior_log_probs: float32 `[n]`. versions: int64 `[n]`,
    the weights version that produced each id. finish_reason: "eos",
    "length", "cancelled" or "error" (then `error` holds the exception).
    submitted_version: the weights version when the request was submitted.
    support: int32 `[n, K]` kept ids per draw when the Sampling returns them.
    """

    request_id: int
    prompt_ids: np.ndarray
    ids: np.ndarray
    raw_log_probs: np.ndarray
    behavior_log_probs: np.ndarray
    versions: np.ndarray
    finish_reason: str
    submitted_version: int
    error: BaseException | None = None
    support: np.ndarray | None = None

    @property
    def eos(self) -> bool:
        return self.finish_reason == "eos"


@dataclasses.dataclass
class Request:
    """A request while it is served: its prompt, budget, key and what it has drawn so far."""

    request_id: int
    prompt: np.ndarray
    budget: int
    key: np.ndarray  # raw uint32 key data
    submitted_version: int
    callback: Callable[[Completion], None] | None
    ids: list[int] = dataclasses.field(default_factory=list)
    raw: list[float] = dataclasses.field(default_factory=list)
    behavior: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    support: list[np.ndarray] = dataclasses.field(default_factory=list)
    cancelled: bool = False

    def record(self, token: Any, raw: Any, behavior: Any, support: Any, version: int) -> None:
        """Append one draw: its id, raw and behaviour log-probs, the weights ``version`` that
        drew it, and its kept-id support row ``[K]`` (``None`` when the sampling keeps none)."""
        self.ids.append(int(token))
        self.raw.append(float(raw))
        self.behavior.append(float(behavior))
        self.versions.append(version)
        if support is not None:
            self.support.append(np.asarray(support))

    def completion(
        self, reason: str, support_width: int, error: BaseException | None = None
    ) -> Completion:
        """The request as a finished ``Completion`` with ``finish_reason=reason``.

        ``support_width`` is ``K``, the kept ids per draw: 0 gives ``support=None``; otherwise
        ``support`` is int32 ``[n, K]``, ``[0, K]`` for a request that drew nothing (one
        cancelled before admission).
        """
        support = None
        if support_width:
            support = (
                np.stack(self.support).astype(np.int32)
                if self.support
                else np.zeros((0, support_width), np.int32)
            )
        return Completion(
            request_id=self.request_id,
            prompt_ids=self.prompt,
            ids=np.asarray(self.ids, np.int32),
            raw_log_probs=np.asarray(self.raw, np.float32),
            behavior_log_probs=np.asarray(self.behavior, np.float32),
            versions=np.asarray(self.versions, np.int64),
            finish_reason=reason,
            submitted_version=self.submitted_version,
            error=error,
            support=support,
        )


__all__ = ["Completion", "Request", "RequestTooLarge"]
