"""The modules of the session sources on a ``RolloutServer``, public from ``dew.rollout``.

Each source is a ``SessionSource``: ``submit(task, seed=)`` returns a future ``Session`` and
``cancel(future)`` stops one.

- ``PromptSource``: one completion per sample, scored by a reward on a thread pool
  (``prompt_task`` builds its tasks);
- ``EnvironmentSource``: multi-turn tool episodes, one session per worker thread, each turn
  its own engine request; with ``regrade=`` each rewarded session is scored again in a
  clean sandbox (``regrade``) and dropped when the rewards differ.
"""
