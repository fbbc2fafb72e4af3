"""How ``RolloutScheduler`` turns admitted sessions into a training batch (host side).

A packer is any object with

- ``rows``: the rows (samples) this process's batch holds;
- ``mask``: the name of the batch column marking what the loss trains (``> 0``), read for
  the off-policy gap and an adaptive correction;
- ``unit``: how ``rows_needed`` counts, for error messages (``"rows of width 24"``);
- ``rows_needed(sessions) -> int``: the rows these sessions fill, so admission can cut the
  groups that no longer fit;
- ``pack(sessions, latencies, updates) -> (batch, metrics)``: the batch (with
  ``behavior_log_probs``) and what it measured of it;
- ``rescore(variables, batch) -> old_log_probs``: the batch's likelihoods under the trainer's
  current weights (the proximal policy), the shape of ``behavior_log_probs``.

``TokenPacker`` is the one for sessions of engine calls: ``pack`` into ``[rows, width]``
token rows and ``GRPOObjective.packed_log_probs``. ``dew.flow.FlowPacker`` packs flow
samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from dew.mesh import data_mesh, global_batch
from dew.sessions.metrics import session_metrics
from dew.sessions.packing import chain_lengths, pack, rows_needed
from dew.sessions.records import Session


class TokenPacker:
    """Sessions of engine calls into packed ``[rows, width]`` token rows.

    Args:
      objective: the ``GRPOObjective`` (its ``packed_log_probs`` rescores; its width, if it
        has one, must equal ``width``).
      width, rows: the row width W and the rows N this process packs.
      truncation, estimator, support_capacity, eos_ids: as ``dew.sessions.packing.pack``.
    """

    mask = "response_mask"

    def __init__(
        self,
        objective: Any,
        width: int,
        rows: int,
        truncation: str = "mask",
        estimator: str = "group",
        support_capacity: int | None = None,
        eos_ids: Any = None,
    ) -> None:
        if not callable(getattr(objective, "packed_log_probs", None)):
            raise TypeError("objective: expected a GRPOObjective (no packed_log_probs)")
        if getattr(objective, "width", width) != width:
            raise ValueError(
                f"width: the objective trains rows {objective.width} wide "
                f"(seq_len + 1), got width={width}"
            )
        self.width, self.rows = width, rows
        self.truncation, self.estimator = truncation, estimator
        self.support_capacity, self.eos_ids = support_capacity, eos_ids
        self.unit = f"rows of width {width}"
        self._rescore = jax.jit(objective.packed_log_probs)
        self._mesh: Any = None

    def rows_needed(self, sessions: Sequence[Session]) -> int:
        """Rows the chains of ``sessions`` fill, placed first-fit decreasing."""
        return rows_needed(chain_lengths(sessions, self.width, self.truncation), self.width)

    def pack(
        self, sessions: Sequence[Session], latencies: Sequence[float], updates: int
    ) -> tuple[dict[str, Any], dict[str, float]]:
        """``pack``'s rows and ``session_metrics`` of them."""
        out: dict[str, Any] = pack(sessions, self.width, rows=self.rows,
                                   estimator=self.estimator, truncation=self.truncation,
                                   support_capacity=self.support_capacity,
                                   eos_ids=self.eos_ids)  # fmt: skip
        metrics = session_metrics(sessions, out, latencies=list(latencies) or None,
                                  version=updates, truncation=self.truncation)  # fmt: skip
        return out, metrics

    def rescore(self, variables: Any, batch: dict[str, Any]) -> np.ndarray:
        """``[rows, width]`` log-probs under ``variables``; with several processes every
        process scores its rows over the data mesh and keeps its own."""
        if jax.process_count() == 1:
            return np.asarray(jax.device_get(self._rescore(variables, batch)), np.float32)
        from jax.experimental import multihost_utils

        if self._mesh is None:
            self._mesh = data_mesh()
        scored = self._rescore(variables, global_batch(batch, self._mesh))
        every = np.asarray(multihost_utils.process_allgather(scored, tiled=True), np.float32)
        mine = jax.process_index() * self.rows
        return every[mine : mine + self.rows]


def check_packer(packer: Any) -> None:
    """Raise ``TypeError`` naming the first member a packer lacks."""
    for name in ("rows", "mask", "unit"):
        if not hasattr(packer, name):
            raise TypeError(
                f"packer: expected a packer (TokenPacker, FlowPacker), it has no {name}"
            )
    for name in ("rows_needed", "pack", "rescore"):
        if not callable(getattr(packer, name, None)):
            raise TypeError(
                f"packer: expected a packer (TokenPacker, FlowPacker), it has no {name}()"
            )


__all__ = ["TokenPacker", "check_packer"]
