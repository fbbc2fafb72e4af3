"""Session sources on a ``RolloutServer`` (each a ``SessionSource``: ``submit(task, seed=)``
returns a future ``Session``, ``cancel(future)`` stops one).

- ``PromptSource``: one completion per sample, scored by a reward on a thread pool
  (``prompt_task`` builds its tasks);
- ``EnvironmentSource``: multi-turn tool episodes, one session per worker thread, each turn
  its own engine request.
"""

from dew.rollout.sources.environment import EnvironmentSource
from dew.rollout.sources.prompt import PromptSource, prompt_task

__all__ = ["EnvironmentSource", "PromptSource", "prompt_task"]
