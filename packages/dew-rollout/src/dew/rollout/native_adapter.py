"""`NativeAdapterServer`: the native rollout server of a run that trains a LoRA adapter.

The `Server` underneath serves a `LoraDecoder` unmerged, from `{"params": adapter,
"base": base params}`. The base is frozen for the whole run, so a push only has to carry
the adapter: `select(variables)` is the adapter tree of `variables` (what the scheduler
copies, pushes and keeps in its weight journal), and `load(variables, version)` takes
either that adapter tree or whole LoRA variables and serves the new adapter beside the
base the server already holds on its device (the same arrays every version; a base
handed in with the variables is ignored, never copied).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from dew.inference import Server
from dew.models.lora import BASE, LoraConfig, LoraDecoder, check_adapters
from dew.rollout.native import NativeRolloutServer


def adapter_of(variables: Any) -> Mapping[str, Any]:
    """The adapter tree of `variables`: its `params` collection when it has one (LoRA
    variables, the base in `base`), else `variables` itself (a bare adapter tree).

    Raises `TypeError` naming `variables` when it is not a mapping."""
    if not isinstance(variables, Mapping):
        raise TypeError(
            f"variables: expected a mapping (an adapter tree or LoRA variables), "
            f"got {type(variables).__name__}"
        )
    params = variables.get("params")
    return params if isinstance(params, Mapping) else variables


class NativeAdapterServer(NativeRolloutServer):
    """A `NativeRolloutServer` whose pushes are adapters alone (module docstring).

    server: a `dew.inference.Server` built on a `LoraDecoder` with `{"params": adapter,
    "base": base}`; anything else raises `TypeError` naming `server`.
    """

    def __init__(self, server: Server) -> None:
        model = getattr(server, "model", None)
        lora = getattr(model, "lora", None)
        if not isinstance(model, LoraDecoder) or not isinstance(lora, LoraConfig):
            raise TypeError(
                f"server: expected a Server on a LoraDecoder, got one on {type(model).__name__}"
            )
        super().__init__(server)
        self.lora: LoraConfig = lora

    def select(self, variables: Any) -> Mapping[str, Any]:
        """What a push needs of `variables`: the adapter tree (`adapter_of`)."""
        return adapter_of(variables)

    def load(self, variables: Any, version: int) -> None:
        """Serve the adapter of `variables` (an adapter tree or LoRA variables) as `version`,
        beside the served base. Raises `ValueError` when the adapter does not fit the base
        (`check_adapters`), `TypeError` when `version` is not an int."""
        if isinstance(version, bool) or not isinstance(version, int | np.integer):
            raise TypeError(f"version: expected an int, got {type(version).__name__}")
        adapter = adapter_of(variables)
        check_adapters(adapter, self.server.model.config, self.lora)
        served = self.server.variables  # swapped whole under the server's lock
        kept = {k: v for k, v in served.items() if k != "params"}
        new = {**kept, "params": jax.tree.map(self._place, dict(adapter))}
        self.server.reload(new, int(version))

    @property
    def base(self) -> Any:
        """The base parameters the server holds (on its device, in its dtype)."""
        return self.server.variables[BASE]


__all__ = ["NativeAdapterServer", "adapter_of"]
