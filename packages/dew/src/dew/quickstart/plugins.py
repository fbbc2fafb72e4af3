"""Rewards the quickstart finds through entry points instead of imports.

``dew`` never imports the satellite distributions (``tests/test_imports.py`` checks it), so the
``--code`` stage cannot name ``dew.sandbox``. Instead ``dew-sandbox`` registers, in the entry-point
group ``dew.quickstart``, a ``code_reward`` factory: a context manager that starts a sandbox fleet
and yields a reward with the usual ``reward(data_source, completion, ground_truth, extra_info)``
signature, closing the fleet on exit. Installing ``dew-sandbox`` is what turns ``--code`` on.
Likewise ``dew-flow`` registers ``flow``, the image example ``dew quickstart --flow`` runs.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

GROUP = "dew.quickstart"
CODE_REWARD = "code_reward"
FLOW = "flow"


def load_code_reward() -> Any:
    """The ``code_reward`` factory registered by ``dew-sandbox``.

    Raises:
      SystemExit: no installed distribution registers it, with how to get one.
    """
    found = entry_points(group=GROUP, name=CODE_REWARD)
    for entry in found:
        return entry.load()
    raise SystemExit(
        f"dew quickstart --code: no '{CODE_REWARD}' entry point in group '{GROUP}'; "
        "install the dew-sandbox distribution (pip install dew-sandbox), which provides it"
    )


def load_flow() -> Any:
    """The ``flow`` runner registered by ``dew-flow``: ``run(run_dir, seed, steps, progress)``.

    Raises:
      SystemExit: no installed distribution registers it, with how to get one.
    """
    for entry in entry_points(group=GROUP, name=FLOW):
        return entry.load()
    raise SystemExit(
        f"dew quickstart --flow: no '{FLOW}' entry point in group '{GROUP}'; "
        "install the dew-flow distribution (pip install dew-flow), which provides it"
    )
