"""LoRA adapters on a frozen Dew decoder, with PEFT's numerics and file layout.

An adapter adds `scale * (x @ a) @ b` to chosen projections of the decoder
(`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`),
with `a` `[in, r]` and `b` `[r, out]` kept in a pytree of their own, apart from
the base parameters::

    from dew.models.lora import LoraConfig, init_adapters, apply_adapters
    lora = LoraConfig(rank=8, alpha=16, targets=("q_proj", "v_proj"))
    adapters = init_adapters(key, model.config, lora)     # b = 0: outputs unchanged
    logits = apply_adapters(model, variables, adapters, lora, ids)
    step = adapter_value_and_grad(loss)                   # gradients for `adapters` only

* `LoraConfig`: rank, alpha, targets, dropout, rsLoRA (`config`).
* `select_targets`: the projections a config selects (`targets`).
* `init_adapters`, `check_adapters`, `merge_adapters`: the adapter tree
  (`adapters`); `merge_adapters` gives base weights with the adapter folded
  in, which `dew.models.Pretrained` saves in the Hugging Face layout.
* `apply_adapters`, `adapter_value_and_grad`: the forward pass and the
  frozen-base gradient (`apply`).
* `LoraDecoder`: a decoder whose variables hold the adapter in `params` and
  the frozen base in `base`, for training (`decoder`; the Trainer side is
  `dew.objectives.lora.LoraObjective`).
* `save_peft_adapter`, `load_peft_adapter`, `export_peft`: PEFT's
  `adapter_model.safetensors` and `adapter_config.json` (`peft_io`).

Parity with PEFT 0.21.2 (logits, adapter gradients, saved adapters in both
directions) is recorded by tools/parity_lora.py.
"""

from dew.models.lora.adapters import check_adapters, init_adapters, merge_adapters
from dew.models.lora.apply import adapter_value_and_grad, apply_adapters
from dew.models.lora.config import PROJECTIONS, LoraConfig
from dew.models.lora.decoder import BASE, DROPOUT, LoraDecoder
from dew.models.lora.peft_io import export_peft, load_peft_adapter, save_peft_adapter
from dew.models.lora.targets import Target, select_targets

__all__ = [
    "BASE",
    "DROPOUT",
    "PROJECTIONS",
    "LoraConfig",
    "LoraDecoder",
    "Target",
    "adapter_value_and_grad",
    "apply_adapters",
    "check_adapters",
    "export_peft",
    "init_adapters",
    "load_peft_adapter",
    "merge_adapters",
    "save_peft_adapter",
    "select_targets",
]
