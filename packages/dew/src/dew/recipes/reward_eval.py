"""Held-out reward of an RL run: what ``dew train grpo|ppo`` reports as its validation.

With ``data.val_path`` and ``run.eval_every``, a GRPO or PPO run evaluates the policy on the
validation prompts the way ``dew eval`` does (``dew.recipes.generate.evaluate``): one greedy
completion per prompt (temperature 0, ending at the run's end id, at most the run's
``max_new_tokens``), scored by the run's reward. ``HeldOutReward`` is the Trainer's
``evaluator``; its metrics become ``val/reward`` (the mean reward), ``val/reward_stderr``
(its standard error, ``sqrt(var / n)`` with the population variance) and ``val/prompts``
(``n``), written to ``metrics.jsonl`` and the trackers with the other validation metrics.

Greedy decoding does not depend on a key, so the evaluation of the same weights gives the
same numbers whenever it runs (a resumed run reports what an uninterrupted one would).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any


@dataclasses.dataclass
class HeldOutReward:
    """Greedy completions of ``prompts`` scored by ``reward``; called with the variables.

    Args:
      model: the policy decoder.
      prompts: a ``dew.data.Prompts`` (the validation prompts).
      reward: ``reward(data_source, completion, ground_truth, extra_info) -> float``.
      max_new_tokens: the response budget.
      eos_id: the id that ends a completion (None: completions run to the budget).
      tokenizer: the ``ChatTokenizer`` whose decoding the reward reads (None: ids
        separated by spaces, as GRPO's default).
      policy_of: picks the policy's variables out of the Trainer's (PPO's
        ``policy_variables``); None takes them as they are.
      batch: completions drawn per sampling call.
    """

    model: Any
    prompts: Any
    reward: Callable[..., float]
    _: dataclasses.KW_ONLY
    max_new_tokens: int
    eos_id: int | None = None
    tokenizer: Any = None
    policy_of: Callable[[Any], Any] | None = None
    batch: int = 16

    def __call__(self, variables: Mapping[str, Any]) -> dict[str, float]:
        """``{"reward", "reward_stderr", "prompts"}`` of the policy in ``variables``."""
        from dew.recipes.generate import LoadedModel, evaluate

        policy = variables if self.policy_of is None else self.policy_of(variables)
        loaded = LoadedModel(self.model, policy, self.tokenizer, self.eos_id, "training")
        out = evaluate(loaded, self.prompts, self.reward, max_new_tokens=self.max_new_tokens,
                       batch=self.batch)  # fmt: skip
        return {"reward": out["mean"], "reward_stderr": out["standard_error"],
                "prompts": float(out["n"])}  # fmt: skip


__all__ = ["HeldOutReward"]
