"""The RL rollouts refuse a canvas generator (or a ``Canvas`` given as their sampling): it
gives no per-token autoregressive likelihoods, which GRPO's ratios need."""

from __future__ import annotations

import pytest

from dew.inference.canvas import Canvas, CanvasGeneration, NotAutoregressive
from dew.objectives.rl import EpisodeRollout, SampledRollout
from dew.sampling import Sampling
from dew.testing import tiny_decoder


def test_rl_rollouts_refuse_a_canvas_generator() -> None:
    canvas = Canvas(11, 11, 4)
    generator = CanvasGeneration(tiny_decoder(12, 16), canvas=canvas)
    message = "gives no per-token autoregressive likelihoods"
    with pytest.raises(NotAutoregressive, match=f"sampling: SampledRollout needs .*{message}"):
        SampledRollout(object(), lambda *a: 0.0, 2, 4, sampling=canvas)  # type: ignore[arg-type]
    with pytest.raises(NotAutoregressive, match=f"policy: EpisodeRollout needs .*{message}"):
        EpisodeRollout(generator, None, None, 8, 4, 1, 2, Sampling())  # type: ignore[arg-type]
    with pytest.raises(NotAutoregressive, match=f"sampling: EpisodeRollout needs .*{message}"):
        EpisodeRollout(object(), None, None, 8, 4, 1, 2, canvas)  # type: ignore[arg-type]
