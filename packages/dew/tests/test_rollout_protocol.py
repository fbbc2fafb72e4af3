"""The ``Rollout`` protocol the Trainer's ``rollout=`` hook follows, and Dew's collectors."""

from __future__ import annotations

from dew.rollouts.protocol import Rollout, SteppedRollout


def test_dews_collectors_follow_the_protocol() -> None:
    from dew.objectives.rl import EpisodeRollout, PPORollout, SampledRollout

    for collector in (SampledRollout, EpisodeRollout, PPORollout):
        assert issubclass(collector, Rollout), collector
    for stepped in (EpisodeRollout, PPORollout):
        assert issubclass(stepped, SteppedRollout), stepped
    assert not issubclass(SampledRollout, SteppedRollout)


def test_a_plain_function_is_a_rollout_without_at_step() -> None:
    def rollout(params, batch, key):
        return batch

    assert isinstance(rollout, Rollout)
    assert not isinstance(rollout, SteppedRollout)
