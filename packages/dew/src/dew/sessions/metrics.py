"""Host-side diagnostics of one batch of sessions (plain floats for the tracker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dew.sessions.chains import TRUNCATIONS, chains_of, trains
from dew.sessions.records import Session, Status, check_choice


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else 0.0


def session_metrics(
    sessions: Sequence[Session],
    batch: Mapping[str, np.ndarray] | None = None,
    latencies: Sequence[float] | None = None,
    version: int | None = None,
    truncation: str = "mask",
) -> dict[str, float]:
    """Host-side diagnostics of one batch of sessions (plain floats).

    - ``sessions/count``, ``sessions/trained``, ``sessions/status/<name>`` (counts)
    - ``sessions/calls_per_chain``: mean calls per chain over the training sessions
    - ``sessions/masked_share/<name>``: share of all sampled ids that belong to non-training
      sessions of that status
    - ``reward/mean`` and ``reward/<component>`` over the sessions with a reward
    - ``latency/p50``, ``latency/p90``, ``latency/p99``, ``latency/max`` when latencies are given
    - ``version/lag_mean``, ``version/lag_max`` (``version`` minus a session's oldest call
      version) when ``version`` is given
    - ``packing/density`` (share of cells holding ids) and ``packing/rows`` when a batch is given
    """
    check_choice(truncation, TRUNCATIONS, "truncation")
    sessions = list(sessions)
    out: dict[str, float] = {"sessions/count": float(len(sessions))}
    trained = [s for s in sessions if trains(s, truncation)]
    out["sessions/trained"] = float(len(trained))
    for status in Status:
        out[f"sessions/status/{status.value}"] = float(sum(s.status is status for s in sessions))
    chains = [c for i, s in enumerate(sessions) if trains(s, truncation) for c in chains_of(s, i)]
    out["sessions/calls_per_chain"] = float(np.mean([c.n_calls for c in chains])) if chains else 0.0
    total = sum(c.sampled_ids.size for s in sessions for c in s.calls)
    for status in Status:
        dropped = sum(
            c.sampled_ids.size
            for s in sessions
            if s.status is status and not trains(s, truncation)
            for c in s.calls
        )
        out[f"sessions/masked_share/{status.value}"] = float(dropped / total) if total else 0.0
    rewarded = [s for s in sessions if s.reward is not None]
    out["reward/mean"] = float(np.mean([s.reward for s in rewarded])) if rewarded else 0.0
    names = sorted({name for s in sessions for name in s.components})
    for name in names:
        values = [s.components[name] for s in sessions if name in s.components]
        out[f"reward/{name}"] = float(np.mean(values))
    if latencies is not None:
        lat = np.asarray(list(latencies), dtype=np.float64)
        if lat.shape[0] != len(sessions):
            raise ValueError(
                f"latencies: expected one latency per session ({len(sessions)}), got {lat.shape[0]}"
            )
        for q in (50, 90, 99):
            out[f"latency/p{q}"] = _percentile(lat, q)
        out["latency/max"] = float(lat.max()) if lat.size else 0.0
    if version is not None:
        lags = [version - min(c.version for c in s.calls) for s in sessions if s.calls]
        out["version/lag_mean"] = float(np.mean(lags)) if lags else 0.0
        out["version/lag_max"] = float(max(lags)) if lags else 0.0
    if batch is not None:
        segments = np.asarray(batch["text_segment_ids"])
        out["packing/density"] = float((segments > 0).mean()) if segments.size else 0.0
        out["packing/rows"] = float(segments.shape[0])
    return out


__all__ = ["session_metrics"]
