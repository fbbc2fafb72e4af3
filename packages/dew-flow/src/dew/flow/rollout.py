"""FlowRollout: the Trainer's ``rollout=`` hook for Flow-GRPO.

Each step the Trainer hands over this process's source rows (the condition fields; an image
field, if present, is ignored) and the live variables. The rollout

1. repeats every source row ``groups`` times, contiguously (row ``r`` gives samples
   ``r * G .. r * G + G - 1``), and samples one SDE trajectory of ``steps`` time points per
   sample, the noise drawn from a key folded with the sample's global index (so a row's
   trajectory does not depend on how rows are spread over processes);
2. decodes the final states to pixels in ``[-1, 1]`` and scores them with
   ``reward(images [N, H, W, C], batch) -> [N]``, ``batch`` being the repeated source rows as
   numpy arrays. With several processes the images are gathered and the reward runs on
   process 0 only; the float64 scores travel back as bytes;
3. normalises each group: ``(r - mean) / (std + 1e-4)`` with the population std, in float64,
   then casts the advantages to float32 (the arithmetic is ``dew.rl.group_advantage`` with
   ``ddof=0``, run on the host CPU under ``jax.enable_x64`` whatever the global x64 setting);
4. picks the first ``train_steps`` stochastic transitions (all of them for ``None``) and writes
   a fixed-shape batch; a sample whose advantage is exactly 0 (a group of equal rewards) stays
   in it with its ``transition_mask`` cleared.

``rewards`` stays float64 in the returned batch (the Trainer's device copy narrows it when
JAX's x64 mode is off); ``last_rewards`` and ``last_timings`` (``sampling``, ``rewards``,
``batch``) keep the latest call's values.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import dew.rl as rl
from dew.flow.draws import check_flow_parts, compiled_draw, score, trained_transitions
from dew.sessions import on_host_x64

Reward = Callable[[np.ndarray, dict[str, np.ndarray]], Any]
STD_EPS = 1e-4


def group_advantages(rewards: np.ndarray, groups: int) -> np.ndarray:
    """``[N]`` float64 advantages of contiguous groups: ``(r - mean) / (std + 1e-4)``.

    Flow-GRPO's per-prompt normalisation (``flow_grpo/stat_tracking.py``): ``std`` is the
    population standard deviation of the group (``ddof=0``) and a group of equal rewards
    gets zeros. ``rewards`` is ``[N]`` with ``N`` a multiple of ``groups``. The arithmetic is
    ``dew.rl.group_advantage(..., eps=1e-4, ddof=0)``, run by ``dew.sessions.on_host_x64``
    (this process's CPU device, x64 for the call only), so the result is float64 even when
    the rest of the program computes in float32.
    """
    values = np.asarray(rewards, np.float64).reshape(-1)
    return on_host_x64(_population_advantage, values, group=groups).astype(np.float64)


_population_advantage = jax.jit(
    functools.partial(rl.group_advantage, eps=STD_EPS, ddof=0), static_argnames="group"
)


class FlowRollout:
    """Sample, score and normalise Flow-GRPO groups.

    Args:
      objective: the ``FlowGRPOObjective`` being trained.
      reward: ``reward(images, batch) -> [N]`` finite numbers; images are float32
        ``[N, H, W, C]`` in ``[-1, 1]``.
      groups: samples per source row, at least 2.
      steps: time points of the sampler (both ends), ``>= 2``.
      train_steps: how many of the first stochastic transitions enter the loss; ``None``: all.
      rescore: recompute ``old_log_probs`` with the objective's own forward pass (then a TIS
        cap can be used); otherwise the sampler's densities stand in (bypass mode).
    """

    def __init__(
        self,
        objective: Any,
        reward: Reward,
        groups: int,
        steps: int,
        train_steps: int | None = None,
        rescore: bool = False,
    ) -> None:
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 2:
            raise ValueError(
                f"groups: expected an integer >= 2 (a group of one has no baseline), got {groups!r}"
            )
        check_flow_parts(objective, reward)
        self.objective = objective
        self.reward = reward
        self.groups = groups
        self.steps = steps
        self.train_steps = train_steps
        self.selected = trained_transitions(objective.process, steps, train_steps)
        self.rescore = bool(rescore)
        self._sample = compiled_draw(objective, steps, self.selected)
        self._rescorer = jax.jit(objective.log_densities)
        self.last_rewards: np.ndarray | None = None
        self.last_timings: dict[str, float] = {}

    def _rewards(self, images: np.ndarray, repeated: dict[str, np.ndarray]) -> np.ndarray:
        """Score on process 0 with every process's images; each process gets its own rows."""
        count = jax.process_count()
        if count == 1:
            return score(self.reward, images, repeated)
        everything = multihost_utils.process_allgather({"images": images, **repeated}, tiled=True)
        n = images.shape[0]
        if jax.process_index() == 0:
            scores = score(
                self.reward,
                np.asarray(everything.pop("images")),
                {k: np.asarray(v) for k, v in everything.items()},
            )
        else:
            scores = np.zeros(n * count, np.float64)
        raw = np.frombuffer(scores.astype(np.float64).tobytes(), np.uint8)
        raw = np.asarray(multihost_utils.broadcast_one_to_all(raw))
        scores = np.frombuffer(raw.astype(np.uint8).tobytes(), np.float64)
        start = jax.process_index() * n
        return scores[start : start + n].copy()

    def __call__(
        self, variables: Mapping[str, Any], batch: Mapping[str, Any], key: jax.Array
    ) -> dict[str, Any]:
        """One rollout: the Flow-GRPO batch for this process's rows."""
        obj = self.objective
        obj.inputs.check(batch, target=False)
        timings: dict[str, float] = {}
        rows = obj.inputs.rows(batch)
        source = {f.name: np.asarray(batch[f.name]) for f in obj.inputs.conditions}
        repeated = {name: np.repeat(v, self.groups, axis=0) for name, v in source.items()}
        n = rows * self.groups
        offset = jax.process_index() * n
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(offset, offset + n))
        start = time.perf_counter()
        host_vars = jax.device_get(variables)
        out = jax.device_get(self._sample(host_vars, obj.fields(repeated), keys))
        timings["sampling"] = time.perf_counter() - start

        start = time.perf_counter()
        images = np.asarray(out.pop("images"), np.float32)
        rewards = self._rewards(images, repeated)
        timings["rewards"] = time.perf_counter() - start

        start = time.perf_counter()
        advantages = group_advantages(rewards, self.groups)
        s = self.selected.size
        stochastic = np.asarray(out.pop("stochastic"), bool)
        mask = stochastic & (advantages != 0.0)[:, None]
        result: dict[str, Any] = {name: np.asarray(v) for name, v in out.items()}
        result.update(obj.fields(repeated))
        result["transition_mask"] = mask.astype(np.float32)
        result["advantages"] = np.repeat(advantages.astype(np.float32)[:, None], s, axis=1)
        result["rewards"] = rewards
        if self.rescore:
            fields = {k: v for k, v in result.items() if k != "rewards"}
            result["old_log_probs"] = np.asarray(
                jax.device_get(self._rescorer(host_vars, fields)), np.float32
            )
        timings["batch"] = time.perf_counter() - start
        self.last_rewards = rewards
        self.last_timings = timings
        return result


__all__ = ["FlowRollout", "STD_EPS", "group_advantages"]
