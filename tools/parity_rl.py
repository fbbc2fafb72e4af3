"""Record verl 0.9.1 reference fixtures for the ``dew.rl`` parity suite.

Runs verl's own loss, advantage and reduction functions (``verl.trainer.ppo.core_algos``,
``verl.trainer.ppo.rollout_corr_helper``, ``verl.utils.torch_functional``) on fixed seeded
inputs and writes, per case and dtype, ``tests/fixtures/rl/<case>_<dtype>.npz`` with a JSON
sidecar of the same stem. Each npz holds arrays under four prefixes:

- ``in__<name>``: the inputs exactly as verl saw them (bf16 cases: float32 arrays whose values
  are bf16-representable; masks as bool; group ids as int64);
- ``out__<name>``: verl's outputs, tensors and the scalar metrics it returns;
- ``cot__<name>``: the fixed cotangent used when the differentiated output is not a scalar
  (the gradient recorded is then that of ``sum(output * cotangent)``);
- ``grad__<name>``: torch autograd gradients with respect to the named inputs.

dtypes: ``f64`` and ``f32`` compute in that dtype. ``bf16`` cases hold inputs rounded to
bfloat16 and two answers: ``out__*``/``grad__*`` from verl in float32 on those rounded inputs
(what a caller that upcasts gets) and ``out_bf16__*``/``grad_bf16__*`` from verl computing in
bfloat16 itself.

The sidecar names the package, version, wheel sha256, the sha256 of the three verl source files
used, the torch version, the function, its options and the loss aggregation mode.

Usage (any python; it re-executes itself under the reference venv of tools/reference_env.sh)::

    python tools/parity_rl.py [--out tests/fixtures/rl] [--wheel-sha256 HEX]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERL_VERSION = "0.9.1"
TORCH_VERSION = "2.13.0"


def _reference_python() -> str:
    """Path of the shared reference venv's python, building the venv if it is missing."""
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "reference_env.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _ensure_reference_env() -> None:
    """Re-execute this script under the reference venv unless verl is importable here."""
    try:
        import torch  # noqa: F401
        import verl  # noqa: F401
    except ImportError:
        python = _reference_python()
        if os.environ.get("DEW_PARITY_REEXEC"):
            raise
        os.environ["DEW_PARITY_REEXEC"] = "1"
        os.execv(python, [python, __file__, *sys.argv[1:]])


_ensure_reference_env()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402
import verl.trainer.ppo.core_algos as core_algos  # noqa: E402
import verl.trainer.ppo.rollout_corr_helper as rollout_corr  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
from reference_wheel import source_sha256, wheel_sha256  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

DTYPES = {"f64": torch.float64, "f32": torch.float32}
Run = Callable[[dict[str, Any]], dict[str, Any]]


def actor_config(clip_low: float = 0.2, clip_high: float = 0.28, clip_c: float = 3.0) -> Any:
    """A real, frozen verl ActorConfig with the clip settings the policy losses read."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
    )


# ----------------------------------------------------------------------------- inputs


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded from the case name, so cases stay stable when others are added."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def lengths_mask(lengths: list[int], t: int) -> np.ndarray:
    """[B, T] bool mask holding the first ``lengths[b]`` positions of each row."""
    return np.arange(t)[None, :] < np.asarray(lengths)[:, None]


def standard_mask(b: int, t: int) -> np.ndarray:
    """Rows: full, padded tail, all masked, one token, then assorted padded tails."""
    fixed = [t, t - 3, 0, 1]
    rest = [max(2, (t * (k + 2)) // (b + 1)) for k in range(b - len(fixed))]
    return lengths_mask((fixed + rest)[:b], t)


def holes_mask(b: int, t: int) -> np.ndarray:
    """standard_mask plus interior gaps (observation tokens of a multi-turn row) in row 0."""
    mask = standard_mask(b, t)
    mask[0, 2:4] = False
    mask[0, t // 2] = False
    return mask


# ----------------------------------------------------------------------------- recording


class Recorder:
    """Runs verl on one case's inputs per dtype and writes the npz and sidecar files."""

    def __init__(self, out_dir: Path, meta: dict[str, Any]) -> None:
        self.out_dir = out_dir
        self.meta = meta
        self.written: list[Path] = []

    def case(
        self,
        name: str,
        function: str,
        run: Run,
        inputs: dict[str, np.ndarray],
        *,
        options: dict[str, Any] | None = None,
        loss_agg_mode: str | None = None,
        grad_of: str | None = None,
        grad_wrt: tuple[str, ...] = (),
        dtypes: tuple[str, ...] = ("f64", "f32"),
        note: str = "",
        mask_dtype: str = "float",
    ) -> None:
        """Record ``run`` on ``inputs`` for each dtype in ``dtypes`` ('f64', 'f32', 'bf16').

        Boolean inputs are masks: verl receives them as float tensors of the compute dtype
        (``mask_dtype="float"``) or as int64 (``"int64"``, what verl's DataProto carries);
        the two differ in the dtype torch gives ``mask.sum() + 1e-8``.
        """
        for dtype in dtypes:
            arrays: dict[str, np.ndarray] = {}
            if dtype == "bf16":
                rounded = {k: _round_bf16(v) if _is_float(v) else v for k, v in inputs.items()}
                for tdtype, suffix in ((torch.float32, ""), (torch.bfloat16, "_bf16")):
                    self._run(
                        name, run, rounded, tdtype, arrays, suffix, grad_of, grad_wrt, mask_dtype
                    )
                stored = rounded
            else:
                stored = {
                    k: v.astype(np.float64 if dtype == "f64" else np.float32) if _is_float(v) else v
                    for k, v in inputs.items()
                }
                self._run(
                    name, run, stored, DTYPES[dtype], arrays, "", grad_of, grad_wrt, mask_dtype
                )
            for k, v in stored.items():
                arrays[f"in__{k}"] = v
            side = {
                **self.meta,
                "function": function,
                "options": options or {},
                "loss_agg_mode": loss_agg_mode,
                "dtype": {"f64": "float64", "f32": "float32", "bf16": "bfloat16"}[dtype],
                "case": name,
                "grad_of": grad_of,
                "grad_wrt": list(grad_wrt),
                "arrays": sorted(arrays),
                "note": note,
                "mask_dtype": mask_dtype if mask_dtype == "int64" else "compute dtype",
            }
            self._write(f"{name}_{dtype}", arrays, side)

    def _run(
        self,
        name: str,
        run: Run,
        inputs: dict[str, np.ndarray],
        tdtype: torch.dtype,
        arrays: dict[str, np.ndarray],
        suffix: str,
        grad_of: str | None,
        grad_wrt: tuple[str, ...],
        mask_dtype: str,
    ) -> None:
        tensors: dict[str, Any] = {}
        for k, v in inputs.items():
            if v.dtype == np.bool_ and mask_dtype == "int64":
                tensors[k] = torch.from_numpy(v.astype(np.int64))
            elif v.dtype == np.bool_:
                tensors[k] = torch.from_numpy(v.astype(np.float64)).to(tdtype)
            elif _is_float(v):
                tensors[k] = torch.from_numpy(v).to(tdtype)
                if k in grad_wrt:
                    tensors[k].requires_grad_(True)
            else:
                tensors[k] = v  # integer group ids stay numpy, as verl wants them
        outs = run(tensors)
        for k, v in outs.items():
            arrays[f"out{suffix}__{k}"] = _to_numpy(v)
        if grad_of is None:
            return
        target = outs[grad_of]
        if target.ndim == 0:
            target.backward()
        else:
            cot = rng_for(name + "/cot").standard_normal(tuple(target.shape))
            cot_t = torch.from_numpy(cot).to(tdtype)
            (target * cot_t).sum().backward()
            arrays[f"cot{suffix}__{grad_of}"] = _to_numpy(cot_t)
        for k in grad_wrt:
            arrays[f"grad{suffix}__{k}"] = _to_numpy(tensors[k].grad)

    def _write(self, stem: str, arrays: dict[str, np.ndarray], side: dict[str, Any]) -> None:
        # Runs in the reference virtualenv without dew, hence not dew.files.atomic_write.
        self.out_dir.mkdir(parents=True, exist_ok=True)
        npz = self.out_dir / f"{stem}.npz"
        fd, tmp = tempfile.mkstemp(dir=self.out_dir, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        os.replace(tmp, npz)
        fd, tmp = tempfile.mkstemp(dir=self.out_dir, suffix=".json.tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(side, fh, indent=1, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, self.out_dir / f"{stem}.json")
        self.written.append(npz)


def _is_float(v: np.ndarray) -> bool:
    return np.issubdtype(v.dtype, np.floating)


def _round_bf16(v: np.ndarray) -> np.ndarray:
    return torch.from_numpy(v).to(torch.bfloat16).float().numpy()


def _to_numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach()
        if v.dtype == torch.bfloat16:
            v = v.float()
        return v.numpy().copy()
    return np.asarray(v)


# ----------------------------------------------------------------------------- cases


def policy_inputs(name: str, b: int, t: int, *, spread: float, per_sequence_adv: bool) -> dict:
    """log_prob / old_log_prob / advantages / mask with a few log ratios far past +-20."""
    rng = rng_for(name)
    old = -np.abs(rng.standard_normal((b, t))) * 2.0 - 0.05
    log_prob = old + spread * rng.standard_normal((b, t))
    log_prob[0, 1] = old[0, 1] + 25.0  # beyond the +20 clamp
    log_prob[1, 0] = old[1, 0] - 30.0  # beyond the -20 clamp
    log_prob[4, 2] = old[4, 2] + 2.5  # inside the clamp, far past the dual clip
    if per_sequence_adv:
        adv = np.repeat(rng.standard_normal((b, 1)), t, axis=1)
    else:
        adv = rng.standard_normal((b, t))
    adv[4, 2] = -1.5
    return {
        "old_log_prob": old,
        "log_prob": log_prob,
        "advantages": adv,
        "response_mask": standard_mask(b, t),
    }


def policy_run(loss_fn: Callable, mode: str, config: Any) -> Run:
    def run(x: dict[str, Any]) -> dict[str, Any]:
        loss, metrics = loss_fn(
            old_log_prob=x["old_log_prob"],
            log_prob=x["log_prob"],
            advantages=x["advantages"],
            response_mask=x["response_mask"],
            loss_agg_mode=mode,
            config=config,
        )
        out = {"pg_loss": loss}
        for k, v in metrics.items():
            out[k.split("/")[-1]] = np.float64(v)
        return out

    return run


def record_all(rec: Recorder) -> None:
    """Every case of the parity suite."""
    ca = "verl.trainer.ppo.core_algos"
    tf = "verl.utils.torch_functional"
    rc = "verl.trainer.ppo.rollout_corr_helper"

    # masked reductions ------------------------------------------------------------------------
    b, t = 6, 9
    rng = rng_for("masked_mean")
    x = {"values": rng.standard_normal((b, t)) * 3.0 + 1.0, "mask": standard_mask(b, t)}
    for axis in (None, -1):
        tag = "all" if axis is None else "last"
        rec.case(
            f"masked_mean_{tag}",
            f"{tf}.masked_mean",
            lambda v, axis=axis: {"mean": verl_F.masked_mean(v["values"], v["mask"], axis)},
            x,
            options={"axis": axis},
            grad_of="mean",
            grad_wrt=("values",),
        )
    rec.case(
        "masked_mean_last_intmask",
        f"{tf}.masked_mean",
        lambda v: {"mean": verl_F.masked_mean(v["values"], v["mask"], -1)},
        x,
        options={"axis": -1},
        grad_of="mean",
        grad_wrt=("values",),
        mask_dtype="int64",
        note="with an integer mask the 1e-8 vanishes in float32: sum / count exactly",
    )
    rec.case(
        "masked_mean_all_intmask",
        f"{tf}.masked_mean",
        lambda v: {"mean": verl_F.masked_mean(v["values"], v["mask"])},
        x,
        options={"axis": None},
        grad_of="mean",
        grad_wrt=("values",),
        mask_dtype="int64",
    )
    nan_x = dict(x)
    nan_x["values"] = x["values"].copy()
    nan_x["values"][~x["mask"]] = np.nan
    nan_x["values"][1, -1] = np.inf
    rec.case(
        "masked_mean_nan_outside",
        f"{tf}.masked_mean",
        lambda v: {"mean": verl_F.masked_mean(v["values"], v["mask"])},
        nan_x,
        options={"axis": None},
        grad_of="mean",
        grad_wrt=("values",),
        note="nan and inf at masked positions; verl's masked_sum replaces them before summing",
    )
    rec.case(
        "masked_whiten",
        f"{tf}.masked_whiten",
        lambda v: {"whitened": verl_F.masked_whiten(v["values"], v["mask"])},
        x,
        options={"shift_mean": True},
        grad_of="whitened",
        grad_wrt=("values",),
        dtypes=("f64", "f32", "bf16"),
    )

    # entropy ----------------------------------------------------------------------------------
    rng = rng_for("entropy")
    rec.case(
        "entropy_from_logits",
        f"{tf}.entropy_from_logits",
        lambda v: {"entropy": verl_F.entropy_from_logits(v["logits"])},
        {"logits": rng.standard_normal((4, 7, 11)) * 3.0},
        grad_of="entropy",
        grad_wrt=("logits",),
    )

    # KL estimators ----------------------------------------------------------------------------
    rng = rng_for("kl")
    logprob = -np.abs(rng.standard_normal((b, t))) * 2.0
    ref = logprob + 0.5 * rng.standard_normal((b, t))
    ref[0, 0] = logprob[0, 0] + 30.0  # ref - logprob past +20: both k3 clamps
    ref[0, 1] = logprob[0, 1] - 30.0  # past -20
    ref[1, 1] = logprob[1, 1] + 4.0  # k3 output past 10 while the input is unclamped
    ref[1, 2] = logprob[1, 2] - 15.0  # k3 output past 10 from the other side
    kl_x = {"logprob": logprob, "ref_logprob": ref}
    # verl's other spellings (and "abs") on the same inputs plus a tie, where abs's gradient
    # is torch's sign(0) = 0.
    tie_x = {"logprob": logprob, "ref_logprob": ref.copy()}
    tie_x["ref_logprob"][2, 4] = logprob[2, 4]
    for kind, inputs in (
        *((k, kl_x) for k in ("k1", "k2", "k3")),
        *((k, tie_x) for k in ("kl", "abs", "mse", "low_var_kl")),
    ):
        rec.case(
            f"kl_penalty_{kind}",
            f"{ca}.kl_penalty",
            lambda v, kind=kind: {
                "kl": core_algos.kl_penalty(v["logprob"], v["ref_logprob"], kind)
            },
            inputs,
            options={"kl_penalty": kind},
            grad_of="kl",
            grad_wrt=("logprob", "ref_logprob"),
            dtypes=("f64", "f32", "bf16"),
        )

    # agg_loss ------------------------------------------------------------------------------------
    rng = rng_for("agg_loss")
    agg_x = {"loss_mat": rng.standard_normal((b, t)), "loss_mask": holes_mask(b, t)}
    modes = [
        ("token_mean", "token-mean", None),
        ("token_sum", "token-sum", None),
        ("seq_mean_token_sum", "seq-mean-token-sum", None),
        ("seq_mean_token_mean", "seq-mean-token-mean", None),
        ("seq_mean_token_sum_norm", "seq-mean-token-sum-norm", None),
        ("seq_mean_token_sum_norm_16", "seq-mean-token-sum-norm", 16),
    ]
    for tag, mode, factor in modes:
        rec.case(
            f"agg_loss_{tag}",
            f"{ca}.agg_loss",
            lambda v, mode=mode, factor=factor: {
                "loss": core_algos.agg_loss(
                    v["loss_mat"], v["loss_mask"], mode, loss_scale_factor=factor
                )
            },
            agg_x,
            options={"loss_scale_factor": factor, "dp_size": 1},
            loss_agg_mode=mode,
            grad_of="loss",
            grad_wrt=("loss_mat",),
            dtypes=("f64", "f32", "bf16")
            if tag.startswith("seq_mean_token_") and factor is None and not tag.endswith("norm")
            else ("f64", "f32"),
        )

    # policy losses ----------------------------------------------------------------------------
    b, t = 8, 16
    cfg = actor_config(0.2, 0.28, 3.0)
    clip_opts = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    van_x = policy_inputs("vanilla", b, t, spread=0.3, per_sequence_adv=False)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        rec.case(
            f"policy_vanilla_{mode.replace('-', '_')}",
            f"{ca}.compute_policy_loss_vanilla",
            policy_run(core_algos.compute_policy_loss_vanilla, mode, cfg),
            van_x,
            options=clip_opts,
            loss_agg_mode=mode,
            grad_of="pg_loss",
            grad_wrt=("log_prob",),
            dtypes=("f64", "f32", "bf16") if mode == "token-mean" else ("f64", "f32"),
        )

    # seq-mean-token-sum-norm with a fixed normaliser, as verl's ppo_loss passes
    # config.loss_scale_factor to the policy loss through config.global_batch_info
    norm_cfg = actor_config(0.2, 0.28, 3.0)
    norm_cfg.global_batch_info["loss_scale_factor"] = 16
    rec.case(
        "policy_vanilla_seq_mean_token_sum_norm_16",
        f"{ca}.compute_policy_loss_vanilla",
        policy_run(core_algos.compute_policy_loss_vanilla, "seq-mean-token-sum-norm", norm_cfg),
        van_x,
        options={**clip_opts, "loss_scale_factor": 16},
        loss_agg_mode="seq-mean-token-sum-norm",
        grad_of="pg_loss",
        grad_wrt=("log_prob",),
        dtypes=("f64", "f32", "bf16"),
    )

    rec.case(
        "policy_vanilla_token_mean_intmask",
        f"{ca}.compute_policy_loss_vanilla",
        policy_run(core_algos.compute_policy_loss_vanilla, "token-mean", cfg),
        van_x,
        options=clip_opts,
        loss_agg_mode="token-mean",
        grad_of="pg_loss",
        grad_wrt=("log_prob",),
        mask_dtype="int64",
    )

    gspo_x = policy_inputs("gspo", b, t, spread=0.3, per_sequence_adv=True)
    gspo_x["log_prob"][5, :] = gspo_x["old_log_prob"][5, :] + 12.0  # sequence log ratio > 10
    gspo_x["log_prob"][6, :3] = gspo_x["old_log_prob"][6, :3] + 0.5  # ratio above 1 + high
    gspo_cfg = actor_config(0.2, 0.28, 3.0)
    for mode in ("token-mean", "seq-mean-token-mean"):
        rec.case(
            f"policy_gspo_{mode.replace('-', '_')}",
            f"{ca}.compute_policy_loss_gspo",
            policy_run(core_algos.compute_policy_loss_gspo, mode, gspo_cfg),
            gspo_x,
            options={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
            loss_agg_mode=mode,
            grad_of="pg_loss",
            grad_wrt=("log_prob",),
        )

    gspo_tok_x = policy_inputs("gspo_token_adv", b, t, spread=0.3, per_sequence_adv=False)
    rec.case(
        "policy_gspo_token_adv_token_mean",
        f"{ca}.compute_policy_loss_gspo",
        policy_run(core_algos.compute_policy_loss_gspo, "token-mean", gspo_cfg),
        gspo_tok_x,
        options={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
        loss_agg_mode="token-mean",
        grad_of="pg_loss",
        grad_wrt=("log_prob",),
        note="per-token advantages, so each token's gradient differs within a sequence",
    )

    cispo_x = policy_inputs("cispo", b, t, spread=0.3, per_sequence_adv=False)
    for mode in ("token-mean", "seq-mean-token-mean"):
        rec.case(
            f"policy_cispo_{mode.replace('-', '_')}",
            f"{ca}.compute_policy_loss_cispo",
            policy_run(core_algos.compute_policy_loss_cispo, mode, cfg),
            cispo_x,
            options={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
            loss_agg_mode=mode,
            grad_of="pg_loss",
            grad_wrt=("log_prob",),
        )

    # value loss -------------------------------------------------------------------------------
    rng = rng_for("value_loss")
    values = rng.standard_normal((b, t))
    value_x = {
        "vpreds": values + 0.4 * rng.standard_normal((b, t)),
        "returns": values + rng.standard_normal((b, t)),
        "values": values,
        "response_mask": standard_mask(b, t),
    }
    rec.case(
        "value_loss",
        f"{ca}.compute_value_loss",
        lambda v: dict(
            zip(
                ("vf_loss", "vf_clipfrac"),
                core_algos.compute_value_loss(
                    v["vpreds"], v["returns"], v["values"], v["response_mask"], 0.2, "token-mean"
                ),
            )
        ),
        value_x,
        options={"cliprange_value": 0.2},
        loss_agg_mode="token-mean",
        grad_of="vf_loss",
        grad_wrt=("vpreds",),
    )

    # GAE --------------------------------------------------------------------------------------
    b, t = 6, 12
    rng = rng_for("gae")
    gae_mask = holes_mask(b, t)
    gae_x = {
        "token_level_rewards": rng.standard_normal((b, t)) * 0.5,
        "values": rng.standard_normal((b, t)),
        "response_mask": gae_mask,
    }
    for tag, gamma, lam in (("", 0.99, 0.95), ("_g1l1", 1.0, 1.0)):
        rec.case(
            f"gae{tag}",
            f"{ca}.compute_gae_advantage_return",
            lambda v, gamma=gamma, lam=lam: dict(
                zip(
                    ("advantages", "returns"),
                    core_algos.compute_gae_advantage_return(
                        v["token_level_rewards"], v["values"], v["response_mask"], gamma, lam
                    ),
                )
            ),
            gae_x,
            options={"gamma": gamma, "lam": lam},
            dtypes=("f64", "f32", "bf16") if not tag else ("f64", "f32"),
            note="runs under torch.no_grad in verl; no gradients",
        )
    rec.case(
        "gae_intmask",
        f"{ca}.compute_gae_advantage_return",
        lambda v: dict(
            zip(
                ("advantages", "returns"),
                core_algos.compute_gae_advantage_return(
                    v["token_level_rewards"], v["values"], v["response_mask"], 0.99, 0.95
                ),
            )
        ),
        gae_x,
        options={"gamma": 0.99, "lam": 0.95},
        mask_dtype="int64",
        note="runs under torch.no_grad in verl; no gradients",
    )

    # outcome advantages -----------------------------------------------------------------------
    def outcome_inputs(name: str, group: int, n_groups: int, zero_spread: bool) -> dict:
        rng = rng_for(name)
        bb, tt = group * n_groups, 7
        lengths = rng.integers(1, tt + 1, size=bb)
        lengths[0] = tt
        mask = lengths_mask(list(lengths), tt)
        score = rng.integers(0, 2, size=bb).astype(np.float64) + 0.25 * rng.standard_normal(bb)
        if zero_spread and group > 1:
            score[group : 2 * group] = 1.0  # second group: all equal
        rewards = np.zeros((bb, tt))
        rewards[np.arange(bb), lengths - 1] = score
        return {
            "token_level_rewards": rewards,
            "response_mask": mask,
            "index": np.repeat(np.arange(n_groups), group).astype(np.int64),
        }

    for group, n_groups in ((4, 3), (1, 5)):
        inputs = outcome_inputs(f"outcome_g{group}", group, n_groups, zero_spread=True)
        for norm in (True, False):
            rec.case(
                f"grpo_outcome_g{group}_{'std' if norm else 'nostd'}",
                f"{ca}.compute_grpo_outcome_advantage",
                lambda v, norm=norm: dict(
                    zip(
                        ("advantages", "returns"),
                        core_algos.compute_grpo_outcome_advantage(
                            v["token_level_rewards"],
                            v["response_mask"],
                            v["index"],
                            epsilon=1e-6,
                            norm_adv_by_std_in_grpo=norm,
                        ),
                    )
                ),
                inputs,
                options={"epsilon": 1e-6, "norm_adv_by_std_in_grpo": norm, "group": group},
                note="index holds contiguous groups of equal size, as Dew's rollout makes them",
            )
        rec.case(
            f"rloo_outcome_g{group}",
            f"{ca}.compute_rloo_outcome_advantage",
            lambda v: dict(
                zip(
                    ("advantages", "returns"),
                    core_algos.compute_rloo_outcome_advantage(
                        v["token_level_rewards"], v["response_mask"], v["index"]
                    ),
                )
            ),
            inputs,
            options={"group": group},
        )

    # rollout corrections ----------------------------------------------------------------------
    b, t = 8, 16
    rng = rng_for("rollout_corr")
    old = -np.abs(rng.standard_normal((b, t))) * 2.0
    behavior = old + 0.4 * rng.standard_normal((b, t))
    behavior[0, 0] = old[0, 0] - 25.0  # log ratio past +20
    behavior[0, 1] = old[0, 1] + 25.0  # past -20
    corr_x = {
        "old_log_prob": old,
        "behavior_log_prob": behavior,
        "response_mask": standard_mask(b, t),
    }

    def corr_run(level: str, threshold: Any) -> Run:
        def run(v: dict[str, Any]) -> dict[str, Any]:
            weights, _ = rollout_corr.compute_rollout_correction_weights(
                v["old_log_prob"] - v["behavior_log_prob"],
                v["response_mask"],
                rollout_is=level,
                rollout_is_threshold=threshold,
            )
            return {"weights": weights}

        return run

    for tag, threshold in (("tis_2", 2.0), ("icepop_0.5_2", "0.5_2.0")):
        rec.case(
            f"rollout_is_token_{tag}",
            f"{rc}.compute_rollout_correction_weights",
            corr_run("token", threshold),
            corr_x,
            options={"rollout_is": "token", "rollout_is_threshold": threshold},
            note="log_ratio = old_log_prob - behavior_log_prob; weights are detached",
        )

    def rs_run(option: str, threshold: str) -> Run:
        def run(v: dict[str, Any]) -> dict[str, Any]:
            mask, _ = rollout_corr.compute_rollout_rejection_mask(
                v["old_log_prob"] - v["behavior_log_prob"],
                v["response_mask"],
                rollout_rs=option,
                rollout_rs_threshold=threshold,
            )
            return {"mask": mask}

        return run

    for option, threshold in (
        ("token_k1", "0.6_1.5"),
        ("seq_sum_k1", "0.3_3.0"),
        ("seq_mean_k1", "0.8_1.25"),
    ):
        rec.case(
            f"rollout_rs_{option}",
            f"{rc}.compute_rollout_rejection_mask",
            rs_run(option, threshold),
            corr_x,
            options={"rollout_rs": option, "rollout_rs_threshold": threshold},
            note="log_ratio = old_log_prob - behavior_log_prob; k1 statistic is -log_ratio",
        )

    # composites -------------------------------------------------------------------------------
    grpo_x = policy_inputs("grpo_composite", b, t, spread=0.3, per_sequence_adv=True)
    rng = rng_for("grpo_composite/ref")
    grpo_x["ref_log_prob"] = grpo_x["log_prob"] + 0.3 * rng.standard_normal((b, t))
    grpo_x["ref_log_prob"][2, 3] = grpo_x["log_prob"][2, 3] + 4.0  # k3 output clamp
    beta = 0.04

    def grpo_run(v: dict[str, Any]) -> dict[str, Any]:
        pg_loss, _ = core_algos.compute_policy_loss_vanilla(
            v["old_log_prob"], v["log_prob"], v["advantages"], v["response_mask"],
            "token-mean", cfg,
        )  # fmt: skip
        kl = core_algos.kl_penalty(v["log_prob"], v["ref_log_prob"], "k3")
        kl_loss = core_algos.agg_loss(kl, v["response_mask"], "token-mean")
        return {"loss": pg_loss + beta * kl_loss, "pg_loss": pg_loss, "kl_loss": kl_loss}

    rec.case(
        "composite_grpo",
        f"{ca}.compute_policy_loss_vanilla + {ca}.kl_penalty(k3) + {ca}.agg_loss",
        grpo_run,
        grpo_x,
        options={**clip_opts, "kl_penalty": "k3", "kl_coef": beta},
        loss_agg_mode="token-mean",
        grad_of="loss",
        grad_wrt=("log_prob",),
        dtypes=("f64", "f32", "bf16"),
        note="loss = pg_loss + kl_coef * token-mean(k3), as verl's actor adds use_kl_loss",
    )

    # GRPO actor loss with verl's entropy bonus (verl/workers/utils/losses.py ppo_loss):
    # loss = pg_loss - entropy_coeff * agg_loss(entropy) + kl_coef * agg_loss(kl), with the
    # log-probs and the entropy both taken from the same logits.
    rng = rng_for("grpo_entropy")
    vocab = 11
    ent_mask = standard_mask(b, t)
    ent_x = {
        "logits": rng.standard_normal((b, t, vocab)) * 2.0,
        "ids": rng.integers(0, vocab, size=(b, t)).astype(np.int64),
        "old_log_prob": -np.abs(rng.standard_normal((b, t))) * 1.5 - 1.5,
        "advantages": np.repeat(rng.standard_normal((b, 1)), t, axis=1),
        "response_mask": ent_mask,
    }
    ent_x["ref_log_prob"] = ent_x["old_log_prob"] + 0.3 * rng.standard_normal((b, t))
    entropy_coeff = 0.01

    def entropy_run(mode: str) -> Run:
        def run(v: dict[str, Any]) -> dict[str, Any]:
            ids = torch.from_numpy(v["ids"])
            log_prob = verl_F.logprobs_from_logits(v["logits"], ids)
            entropy = verl_F.entropy_from_logits(v["logits"])
            pg_loss, _ = core_algos.compute_policy_loss_vanilla(
                v["old_log_prob"], log_prob, v["advantages"], v["response_mask"], mode, cfg
            )
            entropy_loss = core_algos.agg_loss(entropy, v["response_mask"], mode)
            kl = core_algos.kl_penalty(log_prob, v["ref_log_prob"], "low_var_kl")
            kl_loss = core_algos.agg_loss(kl, v["response_mask"], mode)
            loss = pg_loss - entropy_coeff * entropy_loss + beta * kl_loss
            return {"loss": loss, "pg_loss": pg_loss, "entropy_loss": entropy_loss,
                    "kl_loss": kl_loss}  # fmt: skip

        return run

    for mode in ("token-mean", "seq-mean-token-mean"):
        rec.case(
            f"composite_grpo_entropy_{mode.replace('-', '_')}",
            f"verl.workers.utils.losses.ppo_loss terms: {tf}.logprobs_from_logits, "
            f"{tf}.entropy_from_logits, {ca}.compute_policy_loss_vanilla, {ca}.agg_loss, "
            f"{ca}.kl_penalty(low_var_kl)",
            entropy_run(mode),
            ent_x,
            options={
                **clip_opts,
                "entropy_coeff": entropy_coeff,
                "kl_penalty": "low_var_kl",
                "kl_coef": beta,
            },  # fmt: skip
            loss_agg_mode=mode,
            grad_of="loss",
            grad_wrt=("logits",),
            dtypes=("f64", "f32", "bf16") if mode == "token-mean" else ("f64", "f32"),
            note="loss = pg_loss - entropy_coeff * agg_loss(entropy) + kl_coef * agg_loss(k3), "
            "as verl's ppo_loss adds its entropy and KL terms",
        )

    ppo_x = policy_inputs("ppo_composite", b, t, spread=0.3, per_sequence_adv=False)
    rng = rng_for("ppo_composite/values")
    ppo_x["values"] = rng.standard_normal((b, t))
    ppo_x["vpreds"] = ppo_x["values"] + 0.4 * rng.standard_normal((b, t))
    ppo_x["returns"] = ppo_x["values"] + rng.standard_normal((b, t))
    vf_coef = 0.5

    def ppo_run(v: dict[str, Any]) -> dict[str, Any]:
        pg_loss, _ = core_algos.compute_policy_loss_vanilla(
            v["old_log_prob"], v["log_prob"], v["advantages"], v["response_mask"],
            "token-mean", cfg,
        )  # fmt: skip
        vf_loss, _ = core_algos.compute_value_loss(
            v["vpreds"], v["returns"], v["values"], v["response_mask"], 0.2, "token-mean"
        )
        return {"loss": pg_loss + vf_coef * vf_loss, "pg_loss": pg_loss, "vf_loss": vf_loss}

    rec.case(
        "composite_ppo",
        f"{ca}.compute_policy_loss_vanilla + {ca}.compute_value_loss",
        ppo_run,
        ppo_x,
        options={**clip_opts, "cliprange_value": 0.2, "vf_coef": vf_coef},
        loss_agg_mode="token-mean",
        grad_of="loss",
        grad_wrt=("log_prob", "vpreds"),
        note="loss = pg_loss + vf_coef * vf_loss",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "rl")
    parser.add_argument("--wheel-sha256", default=None, help="skip the pip download")
    args = parser.parse_args()
    if verl.__version__ != VERL_VERSION or not torch.__version__.startswith(TORCH_VERSION):
        sys.exit(
            f"reference env: expected verl {VERL_VERSION} and torch {TORCH_VERSION}, "
            f"got verl {verl.__version__} and torch {torch.__version__}"
        )
    torch.manual_seed(0)
    meta = {
        "package": "verl",
        "version": verl.__version__,
        "wheel": f"verl-{VERL_VERSION}-py3-none-any.whl",
        "wheel_sha256": wheel_sha256("verl", VERL_VERSION, args.wheel_sha256),
        "source_sha256": source_sha256((core_algos, rollout_corr, verl_F), verl),
        "torch": torch.__version__,
        "recorder": "tools/parity_rl.py",
    }
    # Record into a scratch folder beside the target; the old fixtures are replaced only once
    # every case has been written.
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=".rl-recording-") as tmp:
        rec = Recorder(Path(tmp), meta)
        record_all(rec)
        for old in [*args.out.glob("*.npz"), *args.out.glob("*.json")]:
            old.unlink()
        for new in Path(tmp).iterdir():
            os.replace(new, args.out / new.name)
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.suffix in (".npz", ".json"))
    print(f"wrote {len(rec.written)} fixtures to {args.out} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
