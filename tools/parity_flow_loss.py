"""Record Flow-GRPO's per-timestep training loss, its parts and its gradients as fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_flow_loss.py

The loss is the block of ``scripts/train_sd3.py`` of github.com/yifan123/flow_grpo at commit
``ac4c86e8cae021841f1fde853d340e0db67690dd`` (lines 880-930, from ``# grpo logic`` to
``info["loss"].append(loss)``; MIT licence, ``tools/reference/flow_grpo_LICENSE.txt``), kept
verbatim in ``tools/reference/flow_grpo_train_sd3_loss.py.txt``. The trainer around it needs
diffusers, accelerate and SD3, so only that block runs here: its git blob hash is checked, it is
dedented and executed in a namespace holding exactly the names it reads (``torch``, ``sample``,
``j``, ``config.train``, ``log_prob``, ``prev_sample_mean``, ``prev_sample_mean_ref``,
``std_dev_t``, ``info``). Those tensors come from the released ``sde_step_with_logprob`` (loaded
by ``tools/parity_flow.py``, blob-checked too) on a constant "model output" per row, with the
next state given, exactly as the trainer's ``compute_log_prob`` calls it.

The rows are chosen so that the ratio leaves the clip range on both sides, with positive and
negative advantages, and two advantages lie beyond ``adv_clip_max``. Each case records the
loss, ``policy_loss``, ``kl_loss`` (beta > 0) and the logged ``approx_kl`` / ``clipfrac*``,
plus autograd gradients of the loss with respect to the new log-prob, to the transition mean
(through the log-prob and the KL) and to the model output. Everything is float32: the released
SDE step casts its inputs to float32. Arrays are stored channels-last ``[B, H, W, C]``.

Writes ``tests/fixtures/flow/flow_grpo_loss.npz`` and ``flow_grpo_loss.json``, each only when
its content changed, so a second run leaves both byte-identical.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_flow  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tools" / "reference" / "flow_grpo_train_sd3_loss.py.txt"
OUT = ROOT / "tests" / "fixtures" / "flow"
PATH = "scripts/train_sd3.py"
LINES = (880, 930)
SCRIPT_BLOB = "057a5979afcb50fd0600b773576f2bf9a64d407b"
BLOCK_BLOB = "b603345d0d849c78e31ce7a4a1107acde3219919"

# rows: advantage (before the clip) and log(new / old) chosen around clip_range 0.2
ADVANTAGES = [1.5, 1.5, -2.0, -2.0, 7.0, -9.0]
LOG_RATIOS = [0.4, -0.5, -0.45, 0.3, 0.05, -0.1]
SHAPE = (2, 3, 3)  # C, H, W
STEPS, SHIFT, NOISE_LEVEL, STEP = 6, 3.0, 0.7, 2
CASES = {"beta0": 0.0, "beta004": 0.04, "beta2": 2.0}
TRAIN = {"clip_range": 0.2, "adv_clip_max": 5.0}


def load_block() -> types.CodeType:
    """The released loss block, dedented, after checking it is the pinned blob."""
    blob = subprocess.run(
        ["git", "hash-object", str(SOURCE)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if blob != BLOCK_BLOB:
        sys.exit(f"{SOURCE}: git blob {blob}, expected {BLOCK_BLOB} ({PATH} {LINES})")
    return compile(textwrap.dedent(SOURCE.read_text()), PATH, "exec")


def inputs() -> dict[str, np.ndarray]:
    """The fixed tensors (channels-first float32) shared by every case."""
    rng = np.random.default_rng(7)
    b = len(ADVANTAGES)
    draw = lambda scale: rng.normal(0.0, scale, (b, *SHAPE)).astype(np.float32)  # noqa: E731
    x, v = draw(1.0), draw(1.0)
    return {"state": x, "velocity": v, "ref_velocity": v + draw(0.3), "next_state": draw(1.0)}


def run_case(block, step_fn, beta: float, arrays: dict[str, np.ndarray]) -> dict:  # noqa: ANN001
    """One execution of the block with autograd; returns every recorded quantity."""
    times = parity_flow.grid(STEPS, SHIFT)
    scheduler = parity_flow._Scheduler(torch.from_numpy(times.copy()))
    b = len(ADVANTAGES)
    t = scheduler.timesteps[STEP].expand(b)
    x = torch.from_numpy(arrays["state"])
    nxt = torch.from_numpy(arrays["next_state"])
    v = torch.from_numpy(arrays["velocity"]).clone().requires_grad_(True)
    _, log_prob, prev_sample_mean, std_dev_t = step_fn(
        scheduler, v, t, x, noise_level=NOISE_LEVEL, prev_sample=nxt
    )
    log_prob.retain_grad()
    prev_sample_mean.retain_grad()
    with torch.no_grad():
        vr = torch.from_numpy(arrays["ref_velocity"])
        _, _, prev_sample_mean_ref, _ = step_fn(
            scheduler, vr, t, x, noise_level=NOISE_LEVEL, prev_sample=nxt
        )
    old = log_prob.detach() - torch.tensor(LOG_RATIOS, dtype=torch.float32)
    filler = torch.full((b,), 123.0)  # column 0: a timestep the block must not read
    sample = {
        "advantages": torch.stack([filler, torch.tensor(ADVANTAGES)], dim=1),
        "log_probs": torch.stack([filler, old], dim=1),
    }
    config = types.SimpleNamespace(train=types.SimpleNamespace(beta=beta, **TRAIN))
    namespace = {
        "torch": torch,
        "sample": sample,
        "j": 1,
        "config": config,
        "log_prob": log_prob,
        "prev_sample_mean": prev_sample_mean,
        "prev_sample_mean_ref": prev_sample_mean_ref,
        "std_dev_t": std_dev_t,
        "info": collections.defaultdict(list),
    }
    exec(block, namespace)
    loss = namespace["loss"]
    loss.backward()
    info = namespace["info"]
    out = {name: torch.stack(info[name]).detach().numpy() for name in sorted(info)}
    out.update(
        old_log_prob=old.numpy(),
        log_prob=log_prob.detach().numpy(),
        mean=parity_flow.nhwc(prev_sample_mean),
        ref_mean=parity_flow.nhwc(prev_sample_mean_ref),
        std_dev_t=std_dev_t.reshape(b).detach().numpy(),
        grad_log_prob=log_prob.grad.numpy(),
        grad_mean=parity_flow.nhwc(prev_sample_mean.grad),
        grad_velocity=parity_flow.nhwc(v.grad),
    )
    return {k: np.asarray(a, np.float32) for k, a in out.items()}


def write_if_changed(path: Path, arrays: dict[str, np.ndarray] | None, text: str | None) -> bool:
    """Write ``arrays`` (npz) or ``text`` unless the file already holds exactly that."""
    if path.exists():
        if text is not None and path.read_text() == text:
            return False
        if arrays is not None:
            with np.load(path) as z:
                same = sorted(z.files) == sorted(arrays) and all(
                    z[k].dtype == a.dtype and np.array_equal(z[k], a) for k, a in arrays.items()
                )
            if same:
                return False
    tmp = path.with_name(f".{path.name}.tmp" + path.suffix)
    if arrays is not None:
        np.savez(tmp, **arrays)
    else:
        tmp.write_text(text or "")
    tmp.replace(path)
    return True


def main() -> None:
    block = load_block()
    step_fn = parity_flow.load_reference()
    arrays = inputs()
    fixture = {f"input/{k}": parity_flow.nhwc(torch.from_numpy(a)) for k, a in arrays.items()}
    fixture["input/times"] = parity_flow.grid(STEPS, SHIFT)
    fixture["input/advantages"] = np.asarray(ADVANTAGES, np.float32)
    for name, beta in CASES.items():
        for key, value in run_case(block, step_fn, beta, arrays).items():
            fixture[f"{name}/{key}"] = value
    sidecar = {
        "package": "flow_grpo",
        "repository": parity_flow.REPOSITORY,
        "revision": parity_flow.COMMIT,
        "path": PATH,
        "lines": list(LINES),
        "blob": SCRIPT_BLOB,
        "block_blob": BLOCK_BLOB,
        "sde_path": parity_flow.PATH,
        "sde_blob": parity_flow.BLOB,
        "licence": "MIT",
        "torch": torch.__version__,
        "dtype": "float32",
        "steps": STEPS,
        "shift": SHIFT,
        "noise_level": NOISE_LEVEL,
        "step": STEP,
        "train": TRAIN,
        "cases": CASES,
        "log_ratios": LOG_RATIOS,
        "arrays": sorted(fixture),
    }
    wrote = [
        write_if_changed(OUT / "flow_grpo_loss.npz", fixture, None),
        write_if_changed(
            OUT / "flow_grpo_loss.json", None, json.dumps(sidecar, indent=2, sort_keys=True) + "\n"
        ),
    ]
    print(f"flow_grpo_loss: {sum(wrote)} of 2 files rewritten in {OUT}")


if __name__ == "__main__":
    main()
