"""Record TRL 1.16.0's DPO sigmoid loss and its autograd gradients as Dew parity fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_dpo.py

TRL keeps the DPO loss inside ``DPOTrainer._compute_loss``. That method runs on fixed
tensors when the trainer is made with ``DPOTrainer.__new__`` and given the few attributes
the method reads: a stand-in model whose forward returns per-token log-probabilities that
are already zero where the shifted completion mask is zero (TRL's fused LM head does the
same with ``labels == -100``), a stand-in accelerator whose gathers return their input,
and precomputed reference sequence log-probabilities. Rows go chosen-first, then rejected.

Each case writes ``tests/fixtures/dpo/<case>.npz`` with, in Dew's pair layout:

* ``completion_mask`` ``[B, 2, S]`` int32 (index 0 chosen, 1 rejected, unshifted),
* ``policy_log_probs`` / ``reference_log_probs`` ``[B, 2, S - 1]`` float32, per-token
  log-probabilities of token ``t + 1`` (raw values also at masked positions, which a correct
  port must ignore),
* ``loss`` (scalar, TRL's mean over pairs), ``grad_policy_log_probs`` ``[B, 2, S - 1]``
  (d loss / d policy log-probs from torch autograd), and TRL's logged ``rewards/*`` metrics,

plus one JSON sidecar ``tests/fixtures/dpo/trl_dpo.json`` naming the package, its version,
the wheel's sha256, the function and the options of every case.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import trl
from reference_wheel import atomic_write, wheel_sha256
from trl import DPOConfig, DPOTrainer

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "dpo"
TRL_VERSION = "1.16.0"


class _StandInModel:
    """Returns fixed per-token log-probs; TRL only reads the fields listed here."""

    training = True

    def __init__(self, log_probs: torch.Tensor) -> None:
        self._log_probs = log_probs

    def __call__(self, *, labels: torch.Tensor, **_: object) -> SimpleNamespace:
        shifted = labels[:, 1:]
        log_probs = self._log_probs.masked_fill(shifted == -100, 0.0)
        zeros = torch.zeros_like(self._log_probs)
        return SimpleNamespace(
            log_probs=log_probs,
            entropy=zeros,
            mean_logits=zeros,
            is_top1=torch.zeros_like(self._log_probs, dtype=torch.bool),
        )


class _StandInAccelerator:
    device = torch.device("cpu")

    @staticmethod
    def gather(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @staticmethod
    def gather_for_metrics(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _trainer(
    beta: float, log_probs: torch.Tensor, workdir: str, nll_weight: float | None = None
) -> DPOTrainer:
    # RPO in TRL 1.16.0 is the "sft" loss type beside "sigmoid", weighted by loss_weights.
    losses = ["sigmoid"] if nll_weight is None else ["sigmoid", "sft"]
    args = DPOConfig(
        output_dir=workdir,
        beta=beta,
        loss_type=losses,
        loss_weights=None if nll_weight is None else [1.0, nll_weight],
        bf16=False,
        report_to="none",
        precompute_ref_log_probs=True,
    )
    trainer = DPOTrainer.__new__(DPOTrainer)
    # The same assignments DPOTrainer.__init__ makes from its config (trl 1.16.0).
    trainer.args = args
    trainer.beta = args.beta
    trainer.precompute_ref_logps = True
    trainer.loss_types = args.loss_type
    trainer.loss_weights = args.loss_weights or [1.0] * len(trainer.loss_types)
    trainer.ld_alpha = args.ld_alpha
    trainer.f_divergence_type = args.f_divergence_type
    trainer.f_alpha_divergence_coef = args.f_alpha_divergence_coef
    trainer.label_smoothing = args.label_smoothing
    trainer.use_weighting = args.use_weighting
    trainer.aux_loss_enabled = False
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer._total_train_tokens = 0
    trainer._tp_size = 1
    trainer.model = _StandInModel(log_probs)
    trainer.accelerator = _StandInAccelerator()
    return trainer


def _case(
    name: str,
    beta: float,
    mask: np.ndarray,
    policy: np.ndarray,
    reference: np.ndarray,
    workdir: str,
    nll_weight: float | None = None,
) -> dict[str, object]:
    """Run TRL on one batch; ``mask`` is ``[B, 2, S]``, log-probs ``[B, 2, S - 1]``.

    ``nll_weight`` adds TRL's ``"sft"`` loss (RPO) with that weight."""
    pairs, _, width = mask.shape

    def stack(x: np.ndarray) -> np.ndarray:  # [B, 2, ...] -> [2B, ...], chosen rows first
        return np.concatenate([x[:, 0], x[:, 1]], axis=0)

    completion_mask = torch.from_numpy(stack(mask)).long()
    input_ids = torch.arange(2 * pairs * width).reshape(2 * pairs, width) % 7 + 1
    leaf = torch.from_numpy(stack(policy)).clone().requires_grad_(True)
    ref_tokens = torch.from_numpy(stack(reference))
    ref_sums = ref_tokens.masked_fill(completion_mask[:, 1:] == 0, 0.0).sum(dim=1)
    trainer = _trainer(beta, leaf, workdir, nll_weight)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_sums[:pairs],
        "ref_rejected_logps": ref_sums[pairs:],
    }
    loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    loss.backward()
    grad = leaf.grad.detach().numpy()
    grad_pairs = np.stack([grad[:pairs], grad[pairs:]], axis=1)
    metrics = {
        k: float(v[-1]) for k, v in trainer._metrics["train"].items() if k.startswith("rewards/")
    }
    arrays = {
        "completion_mask": mask.astype(np.int32),
        "policy_log_probs": policy.astype(np.float32),
        "reference_log_probs": reference.astype(np.float32),
        "beta": np.float32(beta),
        "nll_weight": np.float32(nll_weight or 0.0),
        "loss": np.float32(loss.detach().item()),
        "grad_policy_log_probs": grad_pairs.astype(np.float32),
    }
    for key, value in metrics.items():
        arrays["metric_" + key.replace("/", "_")] = np.float32(value)
    path = OUT / f"{name}.npz"
    atomic_write(path, lambda tmp: np.savez(tmp, **arrays))
    return {
        "file": path.name,
        "beta": beta,
        "loss_type": "sigmoid" if nll_weight is None else ["sigmoid", "sft"],
        "loss_weights": None if nll_weight is None else [1.0, nll_weight],
        "pairs": pairs,
        "row_width": width,
        "dtype": "float32",
        "trl_metrics": metrics,
    }


def _masks(rng: np.random.Generator, pairs: int, width: int) -> np.ndarray:
    """Prompt zeros, completion ones, right padding zeros; one rejected side fully masked."""
    mask = np.zeros((pairs, 2, width), dtype=np.int32)
    for b in range(pairs):
        for side in range(2):
            prompt = int(rng.integers(1, width // 2))
            end = int(rng.integers(prompt + 1, width + 1))
            mask[b, side, prompt:end] = 1
    mask[-1, 1, :] = 0
    return mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-sha256", help="the trl wheel's sha256, if already known")
    args = parser.parse_args()
    if trl.__version__ != TRL_VERSION:
        raise SystemExit(f"trl version: expected {TRL_VERSION}, found {trl.__version__}")
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20260530)
    cases = []
    with tempfile.TemporaryDirectory() as workdir:
        pairs, width = 5, 7
        mask = _masks(rng, pairs, width)
        for beta in (0.1, 0.5, 2.0):
            policy = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
            reference = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
            name = f"sigmoid_beta{str(beta).replace('.', 'p')}"
            cases.append(_case(name, beta, mask, policy, reference, workdir))
        # Large margins in both directions: the log-sigmoid must stay finite and saturate.
        policy = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
        reference = policy.copy()
        policy[:, 0] += np.float32(30.0) * np.array([1, -1, 1, -1, 1], np.float32)[:, None]
        cases.append(_case("sigmoid_saturated", 1.0, mask, policy, reference, workdir))
        # An unmoved policy: zero rewards, loss log 2, no wins.
        policy = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
        cases.append(_case("sigmoid_unmoved", 0.1, mask, policy, policy.copy(), workdir))
        # RPO: the chosen side's token-mean NLL beside the sigmoid loss (drawn after the
        # cases above, so their fixtures do not change).
        for beta, weight in ((0.1, 1.0), (1.0, 0.25)):
            policy = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
            reference = rng.normal(-2.0, 1.0, (pairs, 2, width - 1)).astype(np.float32)
            name = f"rpo_beta{str(beta).replace('.', 'p')}_nll{str(weight).replace('.', 'p')}"
            cases.append(_case(name, beta, mask, policy, reference, workdir, weight))
    sidecar = {
        "package": "trl",
        "version": trl.__version__,
        "wheel_sha256": wheel_sha256("trl", TRL_VERSION, args.wheel_sha256),
        "torch": torch.__version__,
        "function": "trl.trainer.dpo_trainer.DPOTrainer._compute_loss",
        "recorder": "tools/parity_dpo.py",
        "how": "DPOTrainer.__new__ with a stand-in model and accelerator, precomputed reference "
        "log-probs; gradients by torch autograd w.r.t. the per-token policy log-probs",
        "options": {"loss_type": "sigmoid", "f_divergence_type": "reverse_kl", "ld_alpha": None},
        "cases": cases,
    }
    text = json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
    atomic_write(OUT / "trl_dpo.json", lambda tmp: Path(tmp).write_text(text))
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
