"""GRPO on Harbor tasks: every sample is one Harbor trial whose agent reaches the policy through
a recording gateway, and the trainer learns from the calls the gateway recorded.

What runs where:

* vLLM serves the policy from ``--checkpoint`` (a directory ``SafetensorsReload.write``
  produced), with ``VLLM_SERVER_DEV_MODE=1`` so Dew can reload weights into it;
* rllm-model-gateway runs in front of vLLM on an address only this process reaches
  (``--gateway``), configured with ``sync_traces: true``;
* this script starts a ``SandboxProxy`` on ``--sandbox-host`` (an address the trial
  sandboxes reach), the only door from a sandbox to the gateway, and hands agents
  ``<proxy>/sessions/<session>/v1`` as their base URL;
* ``HarborSource`` runs one ``harbor trial start`` per sample (``--harbor``, Harbor 0.26 in
  its own Python >= 3.12 tool environment), reads the verifier's reward from the trial's
  ``result.json`` and the session's calls from the gateway's traces;
* ``RolloutScheduler`` submits one batch ahead while the trainer updates, admits groups by
  status, packs the calls (the engine's own ids and behavior log-probs, never
  re-tokenised) and pushes new weights after each update through
  ``Publication(SafetensorsReload(...), stamp=gateway.stamp)``, which stamps a version on
  the gateway only after the engine serves it.

Each task is a Harbor task directory under ``--tasks`` (``task.toml``, ``instruction.md``,
``environment/``, ``tests/``); restrict its agent phase to the proxy with Harbor's
``network_mode = "allowlist"`` (the script passes ``--allow-agent-host``).

Run::

    python examples/train_harbor.py --checkpoint /ckpt/policy --engine http://127.0.0.1:8011 \\
        --gateway http://127.0.0.1:9090 --sandbox-host 10.0.0.5 --tasks ./tasks \\
        --harbor "uv tool run harbor" --model hosted_vllm/policy --steps 20 \\
        --harbor-arg=--agent-kwarg \\
        --harbor-arg='model_info={"max_input_tokens": 32768, "max_output_tokens": 4096,
                                  "input_cost_per_token": 0, "output_cost_per_token": 0}'

(terminus-2 refuses a ``hosted_vllm`` model without ``model_info``.)
"""

from __future__ import annotations

import argparse
import itertools
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from dew import Trainer
from dew.data import Dataset
from dew.models import load_pretrained
from dew.objectives.rl import GRPOObjective
from dew.rollout import (
    Gateway,
    HarborSource,
    Publication,
    RolloutScheduler,
    SafetensorsReload,
    SandboxProxy,
    task_ids,
)


def task_table(root: Path) -> dict[int, Path]:
    """Task id -> Harbor task directory, for every directory under `root` with a task.toml."""
    found = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not found:
        raise FileNotFoundError(f"--tasks: no Harbor task directory (with task.toml) in {root}")
    return dict(enumerate(found))


def id_stream(count: int, batch: int) -> Dataset:
    """An endless stream of task-id batches, cycling through the tasks in order."""

    def train(partition: Any, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        ids = itertools.cycle(range(count))
        for _ in range(start * batch):
            next(ids)
        while True:
            yield {"task_id": np.asarray([next(ids) for _ in range(batch)], np.int32)}

    return Dataset(train=train, batch=batch)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--engine", required=True, help="vLLM's root URL (for weight pushes)")
    parser.add_argument("--gateway", required=True, help="rllm-model-gateway's root URL")
    parser.add_argument("--sandbox-host", default="127.0.0.1")
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--harbor", default="harbor", help="the harbor command")
    parser.add_argument("--agent", default="terminus-2")
    parser.add_argument("--model", required=True, help="the model name agents send")
    parser.add_argument("--harbor-arg", action="append", default=[])
    parser.add_argument("--trials", type=Path, default=Path("runs/harbor-trials"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4, help="tasks per batch")
    parser.add_argument("--groups", type=int, default=4, help="trials per task")
    parser.add_argument("--width", type=int, default=4096, help="packed row width")
    parser.add_argument("--chains", type=int, default=2, help="chains a trial may split into")
    parser.add_argument("--workers", type=int, default=8, help="trials at once")
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Any:
    args = parse(argv)
    tasks = task_table(args.tasks)
    pretrained = load_pretrained(args.checkpoint)
    objective = GRPOObjective(
        pretrained.model,
        seq_len=args.width - 1,
        behavior_importance=2.0,  # a batch drawn one update ahead: a TIS cap on the lag
        pretrained=pretrained.variables,
    )
    with SandboxProxy(args.gateway, host=args.sandbox_host) as proxy:
        gateway = Gateway(args.gateway, sandbox_url=proxy.url)
        reload = SafetensorsReload(pretrained, args.checkpoint, [args.engine], "vllm")
        publication = Publication(reload, version=0, stamp=gateway.stamp)
        source = HarborSource(
            gateway,
            harbor=shlex.split(args.harbor),
            model=args.model,
            trials=args.trials,
            agent=args.agent,
            args=args.harbor_arg,
            workers=args.workers,
            tasks=tasks,
        )
        try:
            scheduler = RolloutScheduler(
                objective,
                source,
                publication,
                width=args.width,
                rows=args.batch * args.groups * args.chains,
                tasks=task_ids,
                groups=args.groups,
                ahead=1,
                max_lag=1,
                truncation="mask",
                seed=args.seed,
                log=lambda record: print(record),
            )
            trainer = Trainer(
                objective,
                optax.adam(args.learning_rate),
                key=jax.random.key(args.seed),
                rollout=scheduler,
            )
            data = scheduler.tasks(id_stream(len(tasks), args.batch))
            return trainer.fit(data, steps=args.steps)
        finally:
            source.close()
            reload.close()
            gateway.close()


if __name__ == "__main__":
    main()
