"""The modules of ``RolloutScheduler`` (public as ``dew.rollout.RolloutScheduler``):
asynchronous GRPO rollouts from any ``SessionSource``.

- ``scheduler``: ``RolloutScheduler``, the Trainer's ``rollout=`` hook (submission ahead of
  the trainer, pushes, packing, proximal rescoring);
- ``admission``: how finished rollouts become complete groups (statuses, retries, staleness,
  timeouts, oversampling, ``admit``, cut groups);
- ``tasks``: ``task_ids`` and ``prompt_tasks`` (batch -> tasks) and the wrapped task stream;
- ``staleness``: ``AdaptiveAhead`` (``ahead`` chosen from the waiting share and the
  off-policy gap) and those measurements; ``checks``: the argument checks;
- ``work``: the rollouts of one batch in flight; ``journal``: ``WeightJournal`` for exact
  resume; ``record``: ``SchedulerRecord``. The terminal progress bar is ``dew.progress``'s.
"""
