"""RL objectives: the losses (DPO, GRPO, PPO with its ``ValueHead``).

The batches they train on come from the collectors in ``dew.rollouts``, built from the session
records of ``dew.sessions``. Their public names (``SampledRollout``, ``RewardError``,
``EpisodeRollout`` and the episode errors, ``PPORollout``, the ``sessions`` module) are also
found here, and so is the ``verl`` interop module (``to_verl``, ``from_verl``): this is the
path the RL objectives and their batches are imported from. Names resolve lazily so
importing one objective does not import every other one (nor the inference engine).
"""

from dew.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "DPOObjective": "dew.objectives.rl.dpo",
        "EpisodeCancelled": "dew.rollouts.episodes.errors",
        "EpisodeFailure": "dew.rollouts.episodes.errors",
        "EpisodeJournal": "dew.rollouts.episodes.journal",
        "EpisodeRollout": "dew.rollouts.episodes.rollout",
        "GRPOObjective": "dew.objectives.rl.grpo",
        "JournalBusy": "dew.rollouts.episodes.journal",
        "JournalMismatch": "dew.rollouts.episodes.journal",
        "PolicyMismatch": "dew.rollouts.episodes.journal",
        "PPOObjective": "dew.objectives.rl.ppo",
        "PPORollout": "dew.rollouts.ppo",
        "packed_log_probs": "dew.objectives.rl.grpo",
        "policy_loss_from_log_probs": "dew.objectives.rl.grpo",
        "RewardError": "dew.rollouts.sampled",
        "SampledRollout": "dew.rollouts.sampled",
        "ValueHead": "dew.objectives.rl.value_head",
        "sessions": "dew.objectives.rl.sessions",
        "verl": "dew.objectives.rl.verl",
    },
)
