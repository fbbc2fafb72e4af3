"""PPO with a LoRA adapter on the policy and a fully trainable critic beside it.

`LoraPPOObjective(ppo, lora)` wraps a `PPOObjective` the way
`dew.objectives.lora.LoraObjective` wraps a token objective, keeping PPO's
two-subtree layout (`dew.objectives.rl._ppo_tree`) under every collection::

    {"params": {"policy": adapter tree, "critic": critic params},
     "base":   {"policy": base params}}

* The Trainer differentiates and optimizes `params` only: the policy's adapter and
  the whole critic (`ValueHead`: its decoder and its value head) train, the base
  rides in `base`, gets no gradient and no optimizer state, and checkpoints leave
  it out (`frozen_collections`), recording its path and hash instead
  (`frozen_identity`, compared on resume).
* `policy_variables(variables)` is `{"params": adapter, "base": base}`, what the
  policy's `LoraDecoder` reads; `PPORollout` hands it to the sampler, so sampling,
  old log-probs and the KL in the reward all go through the adapter.
* The frozen reference (`beta > 0`) is the base with the adapter off, read from the
  `base` collection: `reference_variables` keeps nothing in `TrainState.ema`.
* `merged(variables)` is the policy alone with the adapter folded in
  (`{"params": merged kernels}`, the critic dropped): what a chain hands to its next
  stage; `save_adapter` writes the policy's adapter in PEFT's layout.

The critic starts as the wrapped objective's does (`critic_pretrained`, e.g. the
policy's starting decoder, or fresh). Dropout (`lora.dropout > 0`) applies to the
policy's forward in `loss`, keyed by the step's key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from dew.models.lora.adapters import init_adapters, merge_adapters
from dew.models.lora.config import LoraConfig
from dew.models.lora.decoder import BASE, DROPOUT, LoraDecoder
from dew.models.lora.peft_io import save_peft_adapter
from dew.objectives.lora import base_digest, check_lora_wrap
from dew.objectives.rl._ppo_tree import CRITIC, POLICY
from dew.objectives.rl.ppo import PPOObjective


class LoraPPOObjective:
    """Train PPO's policy as a LoRA adapter on a frozen base, its critic in full.

    Args:
      objective: a `PPOObjective` whose `model` is a plain `CausalTransformer`; its
        `pretrained` (or fresh) policy variables are the base.
      lora: the adapter's `LoraConfig`.
      adapters: an adapter tree to start from; default a fresh one (`b = 0`: the first
        forward is the base's).
      base_path: where the base came from, recorded with its hash in checkpoints and in
        the exported adapter's `base_model_name_or_path`.
    """

    frozen_collections = (BASE,)

    def __init__(
        self,
        objective: PPOObjective,
        lora: LoraConfig,
        *,
        adapters: Mapping[str, Any] | None = None,
        base_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(objective, PPOObjective):
            raise TypeError(f"objective: expected a PPOObjective, got {type(objective).__name__}")
        config = check_lora_wrap(objective.model, lora, adapters)
        self.objective = objective
        self.lora = lora
        self.model_config = config
        self.adapters = adapters
        self.base_path = None if base_path is None else os.fspath(base_path)
        pretrained = objective.pretrained
        # the starting policy with the adapter off; also tells the Trainer to init outside jit
        self.pretrained = None if pretrained is None else {BASE: pretrained["params"]}
        self.ppo = objective.on_policy_model(LoraDecoder(config, lora), self.pretrained)

    def __getattr__(self, name: str) -> Any:
        """Everything else (width, model, packed_log_probs, packed_values,
        policy_variables, policy_objective, key_metrics, evaluate, ...) is the wrapped
        PPO's, its policy running on the `LoraDecoder`."""
        if name.startswith("__") or name == "ppo":
            raise AttributeError(name)
        return getattr(self.ppo, name)

    @property
    def ema_decay(self) -> float | None:
        """PPO's: 1.0 (a frozen reference, here the adapter-off base) when `beta > 0`."""
        return self.objective.ema_decay

    def init(self, key: jax.Array) -> dict[str, Any]:
        """The PPO tree with the adapter in `params.policy` and the base in `base.policy`."""
        tree = dict(self.objective.init(key))
        adapters = self.adapters
        if adapters is None:
            adapters = init_adapters(jax.random.fold_in(key, 1), self.model_config, self.lora)
        params = {POLICY: dict(adapters), CRITIC: tree["params"][CRITIC]}
        rest = {k: v for k, v in tree.items() if k != "params"}
        return {**rest, "params": params, BASE: {POLICY: tree["params"][POLICY]}}

    @staticmethod
    def reference_variables(variables: Mapping[str, Any]) -> dict[str, Any]:
        """Nothing: the reference is the base already in `variables`."""
        del variables
        return {}

    @staticmethod
    def reference_of(variables: Mapping[str, Any]) -> dict[str, Any]:
        """The adapter-off policy's variables, `{"base": base params}`."""
        return {BASE: variables[BASE][POLICY]}

    def loss(
        self,
        variables: Mapping[str, Any],
        batch: Mapping[str, jax.Array],
        key: jax.Array,
        reference: Any = None,
    ) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
        """PPO's loss with the adapter on the policy; its reference is the adapter-off base."""
        policy = dict(variables)
        if self.lora.dropout > 0.0 and key is not None:  # the policy's forward only
            policy[DROPOUT] = {POLICY: jax.random.fold_in(key, 0x10A)}
        ref = None if reference is None else self.reference_of(variables)
        return self.ppo.loss(policy, batch, key, ref)

    def frozen_identity(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """What a checkpoint records of the base: its path and its `base_digest`."""
        return {"base": self.base_path, "sha256": base_digest(variables[BASE][POLICY])}

    def merged(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """The policy's plain variables with the adapter folded in (no critic)."""
        base, adapters = variables[BASE][POLICY], variables["params"][POLICY]
        return {"params": merge_adapters(base, adapters, self.model_config, self.lora)}

    def save_adapter(self, directory: str | os.PathLike[str], variables: Mapping[str, Any]) -> Path:
        """Write the policy's adapter in PEFT's layout (`save_peft_adapter`)."""
        return save_peft_adapter(
            directory,
            jax.device_get(variables["params"][POLICY]),
            self.model_config,
            self.lora,
            base_model=self.base_path,
        )


__all__ = ["LoraPPOObjective"]
