"""Record verl 0.9.1 fixtures for Dew's reward shaping: KL in the reward and DAPO's overlong term.

Runs verl's own code on seeded inputs and writes ``tests/fixtures/reward_shaping/<case>.npz``
with a JSON sidecar of the same stem (package, version, wheel sha256, sha256 of the verl
source files used, torch version, options):

- ``kl_in_reward_<estimator>_<dtype>`` and ``kl_in_reward_fixed_f64``: verl's
  ``apply_kl_penalty`` (``ray_trainer.py``) called on five successive batches with one
  ``AdaptiveKLController`` (the fixed case: ``FixedKLController``), as verl's trainer calls
  it once per step. Per step ``s``: inputs ``in__scores_s``, ``in__old_log_probs_s``,
  ``in__ref_log_probs_s``, ``in__mask_s`` (one row of each batch has no response token);
  outputs ``out__rewards_s`` (``token_level_rewards``), ``out__current_kl_s``,
  ``out__coefficient_s`` (the coefficient the step charged) and ``out__next_coefficient_s``
  (the controller's value after its update).
- ``dapo_overlong``: verl's ``DAPORewardManager`` with the overlong buffer on, over responses
  whose valid lengths run from short to the budget; ``in__lengths``, ``in__scores`` (what the
  score function returned), ``out__rewards`` (the reward verl wrote on each last token).

``ray_trainer.py`` imports torchdata, which the reference venv lacks; ``apply_kl_penalty`` is
therefore compiled from that file's own source text (its function definition, unchanged) with
the names it reads from the module bound to verl's objects.

Usage (any python; it re-executes itself under the reference venv of tools/reference_env.sh)::

    python tools/parity_reward_shaping.py [--out tests/fixtures/reward_shaping]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERL_VERSION = "0.9.1"
ESTIMATORS = ("kl", "abs", "mse", "low_var_kl")
STEPS = 5


def _ensure_reference_env() -> None:
    """Re-execute this script under the reference venv unless verl is importable here."""
    try:
        import torch  # noqa: F401
        import verl  # noqa: F401
    except ImportError:
        if os.environ.get("DEW_PARITY_REEXEC"):
            raise
        done = subprocess.run(
            ["bash", str(ROOT / "tools" / "reference_env.sh")],
            check=True,
            capture_output=True,
            text=True,
        )
        python = done.stdout.strip().splitlines()[-1]
        os.environ["DEW_PARITY_REEXEC"] = "1"
        os.execv(python, [python, __file__, *sys.argv[1:]])


_ensure_reference_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
import verl.trainer.ppo.core_algos as core_algos  # noqa: E402
import verl.workers.reward_manager.dapo as dapo  # noqa: E402
from reference_wheel import atomic_write, source_sha256, wheel_sha256  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils.torch_functional import masked_mean  # noqa: E402

RAY_TRAINER = Path(str(verl.__file__)).parent / "trainer" / "ppo" / "ray_trainer.py"


def _apply_kl_penalty() -> Any:
    """verl's ``apply_kl_penalty``, compiled from ``ray_trainer.py``'s own text."""
    tree = ast.parse(RAY_TRAINER.read_text())
    found = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_kl_penalty"
    ]
    module = ast.Module(body=found, type_ignores=[])
    scope = {
        "DataProto": DataProto,
        "core_algos": core_algos,
        "masked_mean": masked_mean,
        "torch": torch,
    }
    exec(compile(module, str(RAY_TRAINER), "exec"), scope)
    return scope["apply_kl_penalty"]


def _batch(rng: np.random.Generator, dtype: torch.dtype, spread: float) -> dict[str, torch.Tensor]:
    rows, width = 6, 9
    old = -rng.uniform(0.05, 3.0, (rows, width))
    ref = old + rng.normal(0.0, spread, (rows, width))
    lengths = rng.integers(1, width + 1, rows)
    lengths[2] = 0  # a row with no response token
    mask = np.arange(width)[None, :] < lengths[:, None]
    scores = np.zeros((rows, width))
    for row, n in enumerate(lengths):
        if n:
            scores[row, n - 1] = rng.choice([0.0, 1.0])
    as_t = lambda a: torch.from_numpy(np.asarray(a)).to(dtype)  # noqa: E731
    return {
        "token_level_scores": as_t(scores),
        "old_log_probs": as_t(old),
        "ref_log_prob": as_t(ref),
        "response_mask": torch.from_numpy(
            mask.astype(np.int64)
        ),  # an attention-mask slice, as in verl
    }


def _kl_case(estimator: str, dtype: torch.dtype, controller: Any) -> dict[str, np.ndarray]:
    apply = _apply_kl_penalty()
    rng = np.random.default_rng(7)
    arrays: dict[str, np.ndarray] = {}
    for step in range(STEPS):
        tensors = _batch(rng, dtype, spread=0.2 * (step + 1))  # the KL grows past the target
        before = float(controller.value)
        data, metrics = apply(
            DataProto.from_dict(tensors=dict(tensors)), controller, kl_penalty=estimator
        )
        arrays[f"in__scores_{step}"] = tensors["token_level_scores"].numpy()
        arrays[f"in__old_log_probs_{step}"] = tensors["old_log_probs"].numpy()
        arrays[f"in__ref_log_probs_{step}"] = tensors["ref_log_prob"].numpy()
        arrays[f"in__mask_{step}"] = tensors["response_mask"].numpy() > 0
        arrays[f"out__rewards_{step}"] = data.batch["token_level_rewards"].numpy()
        arrays[f"out__current_kl_{step}"] = np.float64(metrics["actor/reward_kl_penalty"])
        arrays[f"out__coefficient_{step}"] = np.float64(before)
        arrays[f"out__next_coefficient_{step}"] = np.float64(controller.value)
    return arrays


class _Tokenizer:
    """What DAPORewardManager reads of a tokenizer: ``decode`` and ``eos_token``."""

    eos_token = "<eos>"

    def decode(self, ids: torch.Tensor, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def _dapo_case() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    max_len, buffer, factor = 16, 6, 0.75
    lengths = np.array([1, 5, 9, 10, 11, 12, 13, 15, 16, 16])
    scores = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0])
    rows, prompt_width = len(lengths), 3
    responses = np.arange(rows * max_len).reshape(rows, max_len) % 50 + 1
    attention = np.ones((rows, prompt_width + max_len), np.int64)
    for row, n in enumerate(lengths):
        attention[row, prompt_width + n :] = 0
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.ones(rows, prompt_width, dtype=torch.long),
            "responses": torch.from_numpy(responses),
            "attention_mask": torch.from_numpy(attention),
        },
        non_tensors={
            "data_source": np.array(["toy"] * rows, dtype=object),
            "reward_model": np.array([{"ground_truth": str(s)} for s in scores], dtype=object),
        },
    )
    manager = dapo.DAPORewardManager(
        tokenizer=_Tokenizer(),
        num_examine=0,
        compute_score=lambda data_source, solution_str, ground_truth, extra_info: float(
            ground_truth
        ),
        max_resp_len=max_len,
        overlong_buffer_cfg=SimpleNamespace(
            enable=True, len=buffer, penalty_factor=factor, log=False
        ),
    )
    reward_tensor = manager(data)
    last = reward_tensor[torch.arange(rows), torch.from_numpy(lengths - 1)]
    arrays = {"in__lengths": lengths, "in__scores": scores, "out__rewards": last.numpy()}
    return arrays, {"max_length": max_len, "buffer": buffer, "penalty_factor": factor}


def _write(out: Path, stem: str, arrays: dict[str, np.ndarray], side: dict[str, Any]) -> None:
    atomic_write(out / f"{stem}.npz", lambda tmp: np.savez_compressed(tmp, **arrays))
    text = json.dumps({**side, "arrays": sorted(arrays)}, indent=1, sort_keys=True) + "\n"
    atomic_write(out / f"{stem}.json", lambda tmp: Path(tmp).write_text(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "reward_shaping")
    parser.add_argument("--wheel-sha256", default=None, help="skip the pip download")
    args = parser.parse_args()
    torch.manual_seed(0)
    provenance = {
        "package": "verl",
        "version": VERL_VERSION,
        "wheel_sha256": wheel_sha256("verl", VERL_VERSION, args.wheel_sha256),
        "source_sha256": {
            **source_sha256((core_algos, dapo), verl),
            "verl/trainer/ppo/ray_trainer.py": hashlib.sha256(RAY_TRAINER.read_bytes()).hexdigest(),
        },
        "torch": torch.__version__,
        "recorder": "tools/parity_reward_shaping.py",
    }
    adaptive = {"kl_coef": 0.05, "target_kl": 0.1, "horizon": 60}
    for estimator in ESTIMATORS:
        for name, dtype in (("f64", torch.float64), ("f32", torch.float32)):
            controller = core_algos.AdaptiveKLController(
                adaptive["kl_coef"], adaptive["target_kl"], adaptive["horizon"]
            )
            arrays = _kl_case(estimator, dtype, controller)
            side = {"function": "apply_kl_penalty + AdaptiveKLController", "estimator": estimator,
                    "dtype": name, "controller": {"type": "adaptive", **adaptive}, "steps": STEPS}  # fmt: skip
            _write(args.out, f"kl_in_reward_{estimator}_{name}", arrays, {**provenance, **side})
    arrays = _kl_case("kl", torch.float64, core_algos.FixedKLController(0.05))
    side = {"function": "apply_kl_penalty + FixedKLController", "estimator": "kl", "dtype": "f64",
            "controller": {"type": "fixed", "kl_coef": 0.05}, "steps": STEPS}  # fmt: skip
    _write(args.out, "kl_in_reward_fixed_f64", arrays, {**provenance, **side})
    arrays, options = _dapo_case()
    side = {"function": "DAPORewardManager (overlong buffer)", "options": options}
    _write(args.out, "dapo_overlong", arrays, {**provenance, **side})
    print(f"wrote {len(ESTIMATORS) * 2 + 2} fixtures to {args.out}")


if __name__ == "__main__":
    main()
