"""Flow-GRPO on a small DiT: learn coloured shapes by flow matching, then reward red pixels.

Run from a checkout::

    uv run python examples/flow_grpo.py --run-dir /tmp/flow-grpo

It generates 16x16 shapes in code, trains ``DiffusionObjective`` on them, measures the mean
share of red pixels on held-out labels, runs Flow-GRPO (``FlowGRPOObjective`` and
``FlowRollout``) with that share as the reward on the other labels, measures again, and writes
``grid.png`` (held-out samples before and after) and ``summary.json``. ``--short`` runs the
cut-down version the tests use. The program itself is ``dew.flow.quickstart`` (so that
``dew quickstart --flow`` runs the same code from an installed wheel).
"""

import sys

from dew.flow.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
