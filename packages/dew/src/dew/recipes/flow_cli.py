"""``dew train flow`` (alias ``flow-grpo``): Flow-GRPO from a config, trained by ``dew-flow``.

``dew`` does not import ``dew.flow``. This module adds the kind to ``dew train`` and, when it
runs, loads ``dew-flow``'s trainer by the entry point ``flow`` of the group ``dew.recipes``
(``dew.recipes.plugins.load_plugin``: without the distribution, a one-line error says what to
install) and hands it the config mapping: the file, ``--progress`` and ``--set`` merged.
The sections and keys are ``dew-flow``'s (``dew.flow.recipe_config``); it checks them all
before training and names any mistake by its key.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from dew.recipes.plugins import load_plugin

__all__ = ["FLOW_KINDS", "add_flow_kind", "run_flow"]

#: The kind and its alias.
FLOW_KINDS = ("flow", "flow-grpo")

EXAMPLE = """example:
  dew train flow --config flow.yaml --set run.steps=50 --set objective.beta=0.01

The config's sections (run, model, optimizer, schedule, data, objective) are described in
docs/guides/flow-grpo.md; every key is checked before the first step."""


def add_flow_kind(kinds: Any) -> argparse.ArgumentParser:
    """Add ``flow`` (alias ``flow-grpo``) to ``dew train``'s kinds."""
    parser = kinds.add_parser(
        FLOW_KINDS[0],
        aliases=list(FLOW_KINDS[1:]),
        help="Flow-GRPO on a rectified-flow image model (needs dew-flow)",
        description="Flow-GRPO on a rectified-flow image model, from a config (needs the "
        "dew-flow distribution).",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="a YAML or JSON config; --set overrides its keys")  # fmt: skip
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override one config key, e.g. objective.groups=8 "
                        "(repeatable)")  # fmt: skip
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        default=argparse.SUPPRESS, dest="run.progress",
                        help="draw a progress bar [run.progress]")  # fmt: skip
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


def run_flow(mapping: Mapping[str, Any]) -> int:
    """Train the ``dew train flow`` config ``mapping`` with ``dew-flow``'s trainer."""
    train = load_plugin("flow", "kind", "dew-flow")
    state = train(mapping)
    run_dir = mapping["run"]["run_dir"]
    print(
        f"trained to step {int(state.step)} ({int(state.updates)} updates); run directory {run_dir}"
    )
    return 0
