"""pytest plugin for the test sessions' xdist runs (noxfile.py loads it with ``-p`` next to
``--dist loadfile``).

It changes two things about how ``--dist loadfile`` hands test files to the workers:

* a few files form one work unit (``GROUPS``), which one worker runs one file after another:
  files that share a session-scoped fixture costing minutes (a started vLLM engine, built
  once per worker);
* the work units are handed out longest first: those in ``SECONDS`` by their measured time,
  then the rest in xdist's own order (most tests first). xdist's default order handed the
  one-test files that start an engine or a whole training run out last, where one worker
  ran them while the other had nothing left to do.

(``--dist loadgroup`` with ``xdist_group`` marks would express the groups in the test files,
but pytest-xdist 3.8 groups by rewriting ``item._nodeid``, which pytest 9.2 no longer reads,
so every marked test became its own work unit.)

Without this plugin (a plain ``pytest -n 2 --dist loadfile``) every test still runs; files
are only handed out in xdist's order and a shared engine may start on both workers.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: Files that run on one worker, one after another, by path from the repository root.
GROUPS: dict[str, str] = {
    # The users of dew-rollout's session-scoped `vllm_engine` fixture (conftest.py): the
    # engine starts once, in collection order, as in a one-process run.
    "packages/dew-rollout/tests/test_rollout_vllm_chat.py": "vllm-engine",
    "packages/dew-rollout/tests/test_rollout_vllm_engine.py": "vllm-engine",
    "packages/dew-rollout/tests/test_rollout_vllm_gateway.py": "vllm-engine",
    "packages/dew-rollout/tests/test_rollout_vllm_lora.py": "vllm-engine",
    "packages/dew-rollout/tests/test_rollout_vllm_scheduler.py": "vllm-engine",
}

#: Work units of a minute or more, by file path or group name: their summed test times (the
#: ``slowest durations`` of a CI run on two cores; a group: its files), rounded.
SECONDS: dict[str, float] = {
    "packages/dew/tests/test_cli.py": 460,
    "packages/dew/tests/test_trainer_processes.py": 70,
    "packages/dew/tests/test_quickstart.py": 230,
    "packages/dew/tests/test_chain_lora.py": 60,
    "packages/dew/tests/test_train_ppo.py": 60,
    "packages/dew/tests/test_lora_serving.py": 60,
    "packages/dew/tests/test_lora_diffusion.py": 60,
    "packages/dew/tests/test_lora_ppo_cli.py": 60,
    "packages/dew/tests/test_two_copy_spans.py": 100,
    "packages/dew-flow/tests/test_flow_example.py": 130,
    "packages/dew-flow/tests/test_flow_grpo.py": 85,
    "packages/dew-flow/tests/test_flow_train_command.py": 60,
    "packages/dew-flow/tests/test_flow_processes.py": 50,
    "packages/dew-rollout/tests/test_recipe_vllm.py": 220,
    "vllm-engine": 220,
    "packages/dew-rollout/tests/test_recipe_async.py": 155,
    "packages/dew-rollout/tests/test_recipe_harbor_launch.py": 95,
    "packages/dew-rollout/tests/test_rollout_scheduler_processes.py": 95,
    "tests/test_tool_episodes_example.py": 360,
    "tests/test_docs.py": 240,
    "tests/test_episode_pool.py": 70,
    "tests/test_ppo_pool.py": 60,
    "tests/test_rlvr_example.py": 100,
}


def unit(nodeid: str) -> str:
    """The work unit of a test: its group, or its file."""
    path = nodeid.split("::", 1)[0]
    return GROUPS.get(path, path)


class LongestFirst(LoadScopeScheduling):
    """``--dist loadfile`` with ``unit`` as the scope and the longest units first."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self.ordered:  # the first assignment: the queue holds every unit
            self.ordered = True
            units = sorted(  # stable: ties keep the collection order
                self.workqueue.items(), key=lambda kv: (-SECONDS.get(kv[0], 0.0), -len(kv[1]))
            )
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    if config.getvalue("dist") != "loadfile":
        return None
    return LongestFirst(config, log)
