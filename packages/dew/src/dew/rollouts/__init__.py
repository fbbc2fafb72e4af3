"""Rollouts: the collectors the Trainer calls between steps (host side).

Each one is a ``rollout=`` hook of ``dew.trainer.Trainer`` (the ``Rollout`` protocol of
``dew.rollouts.protocol``): it takes the Trainer's batch and variables, samples, scores and
returns a packed batch built from ``dew.sessions``.

- ``protocol``: ``Rollout`` (and ``SteppedRollout``, one with ``at_step``), what the Trainer
  calls.
- ``sampled``: ``SampledRollout``, which samples completions with ``dew.inference``, scores
  them with a reward function and packs them; ``RewardError``, ``default_decode``.
- ``episodes``: ``EpisodeRollout``, multi-turn tool episodes (the environment protocol, one
  action validation, cohorts over processes, the crash-safe ``EpisodeJournal``).
- ``ppo``: ``PPORollout`` and ``episode_targets`` (GAE over packed episodes for PPO).
- ``policy``: ``SubtreePolicy``, a sampler bound to the policy part of a larger tree.

Names resolve lazily: importing the package (or its ``protocol``) imports no collector, and
each name imports only its own module.
"""

from dew.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Rollout": ".protocol",
        "SteppedRollout": ".protocol",
        "default_decode": ".sampled",
        "SingleActionError": ".ppo",
        "episode_targets": ".ppo",
        "SubtreePolicy": ".policy",
    },
)
