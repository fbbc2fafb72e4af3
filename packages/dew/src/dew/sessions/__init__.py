"""Sessions: engine calls, the sessions they make, and how sessions become training rows.

- ``records``: ``Call``, ``Session``, ``Status``, ``Task`` and their validation.
- ``source``: ``SessionSource``, the protocol of anything that turns a ``Task`` into a future
  ``Session`` (``submit(task, seed=)``, ``cancel(future)``).
- ``chains``: which sessions train and how a session's calls join into chains.
- ``advantages``: group-relative advantages of session rewards (``group_advantages``).
- ``packing``: ``pack`` (sessions -> one ``[rows, width]`` GRPO batch), ``rows_needed``,
  ``chain_lengths``.
- ``metrics``: ``session_metrics``, host diagnostics of one batch of sessions.
- ``verl``: ``to_verl``/``from_verl``, sessions to verl ``AgentLoopOutput`` rows and back
  (``verl_rows`` reads and checks one row).

The collectors that make sessions inside the trainer live in ``dew.rollouts``. Names resolve
lazily, so reading the records imports neither JAX nor the inference engine.
"""

from dew.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Call": ".records",
        "Session": ".records",
        "Status": ".records",
        "Task": ".records",
        "SessionSource": ".source",
        "TRUNCATIONS": ".chains",
        "ESTIMATORS": ".advantages",
        "GROUP_EPSILON": ".advantages",
        "group_advantages": ".advantages",
        "on_host_x64": ".advantages",
        "chain_lengths": ".packing",
        "pack": ".packing",
        "rows_needed": ".packing",
        "session_metrics": ".metrics",
        "VerlRowError": ".verl",
        "VerlTrajectory": ".verl",
        "from_verl": ".verl",
        "to_verl": ".verl",
    },
)
