"""Record Flow-GRPO's own SDE step (states, means, stds, log-probs, KL, gradients) as fixtures.

Run it in the shared reference environment (never in Dew's own venv)::

    "$(tools/reference_env.sh | tail -n 1)" tools/parity_flow.py

The reference is ``sde_step_with_logprob`` from ``flow_grpo/diffusers_patch/
sd3_sde_with_logprob.py`` of github.com/yifan123/flow_grpo at commit
``ac4c86e8cae021841f1fde853d340e0db67690dd`` (MIT licence, ``tools/reference/
flow_grpo_LICENSE.txt``). The file is kept verbatim in ``tools/reference/`` and its git blob
hash is checked before it runs, so the recorded numbers come from the released code and
nothing else. It imports two names from diffusers, which the reference environment does not
hold; this script registers stand-ins for exactly those before running the file:

* ``randn_tensor(shape, generator, device, dtype)``: ``torch.randn`` with the generator, as
  diffusers 0.34 ``utils/torch_utils.py`` does on CPU; every draw is kept so the JAX side can
  replay the same noise;
* ``FlowMatchEulerDiscreteScheduler``: only the attributes the function reads, ``sigmas`` (the
  time grid, with the final 0) and ``index_for_timestep`` (diffusers 0.34
  ``scheduling_flow_match_euler_discrete.py``: the position of ``timestep`` in
  ``timesteps = sigmas[:-1] * 1000``, the second match when there are two).

Each case runs one full trajectory from fixed initial noise through a linear "model"
``v = w * x + c`` (per-coordinate ``w``, ``c``), then, for every transition, the function again
with the recorded next state and autograd on: the gradient of the summed per-sample log-prob
with respect to the model output and to the current state. The KL between the transition
under that model and under a second linear model (same state and time) is recorded twice: as
``torch.distributions.kl_divergence`` of the two Gaussians (mean over coordinates), with its
gradient, and as the released trainer's ``kl_loss`` formula, which leaves the elapsed time
out of the variance. Arrays are stored channels-last ``[B, K, H, W, C]`` like Dew's.

Writes ``tests/fixtures/flow/<case>.npz`` and ``tests/fixtures/flow/flow_grpo.json``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tools" / "reference" / "flow_grpo_sd3_sde_with_logprob.py.txt"
OUT = ROOT / "tests" / "fixtures" / "flow"
REPOSITORY = "https://github.com/yifan123/flow_grpo"
COMMIT = "ac4c86e8cae021841f1fde853d340e0db67690dd"
PATH = "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"
BLOB = "1f3aa7c18038e95a0138482a7cedd002af2fc8f2"

CASES = {
    # name: (batch, channels, height, width, steps, shift, noise_level, seed)
    "sd3_shift3": (3, 2, 4, 4, 6, 3.0, 0.7, 0),
    "plain_noise1": (2, 1, 4, 4, 5, 1.0, 1.0, 1),
}

DRAWS: list[torch.Tensor] = []


def _randn_tensor(shape, generator=None, device=None, dtype=None, layout=None):  # noqa: ANN001
    out = torch.randn(shape, generator=generator, dtype=dtype, layout=layout or torch.strided)
    DRAWS.append(out.clone())
    return out


class _Scheduler:
    """The two things ``sde_step_with_logprob`` reads from diffusers' scheduler."""

    def __init__(self, sigmas: torch.Tensor) -> None:
        self.sigmas = sigmas
        self.timesteps = sigmas[:-1] * 1000.0

    def index_for_timestep(self, timestep, schedule_timesteps=None):  # noqa: ANN001
        schedule = self.timesteps if schedule_timesteps is None else schedule_timesteps
        indices = (schedule == timestep).nonzero()
        pos = 1 if len(indices) > 1 else 0
        return indices[pos].item()


def load_reference():  # noqa: ANN201
    """The released ``sde_step_with_logprob``, after checking the file is the pinned blob."""
    blob = subprocess.run(
        ["git", "hash-object", str(SOURCE)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if blob != BLOB:
        sys.exit(f"{SOURCE}: git blob {blob}, expected {BLOB} ({PATH} at {COMMIT})")
    utils = types.ModuleType("diffusers.utils.torch_utils")
    utils.randn_tensor = _randn_tensor  # type: ignore[attr-defined]
    sched = types.ModuleType("diffusers.schedulers.scheduling_flow_match_euler_discrete")
    sched.FlowMatchEulerDiscreteScheduler = _Scheduler  # type: ignore[attr-defined]
    for name in ("diffusers", "diffusers.utils", "diffusers.schedulers"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules[utils.__name__] = utils
    sys.modules[sched.__name__] = sched
    namespace: dict[str, object] = {"__name__": "flow_grpo_sde"}
    exec(compile(SOURCE.read_text(), PATH, "exec"), namespace)
    return namespace["sde_step_with_logprob"]


def grid(steps: int, shift: float) -> np.ndarray:
    """Dew's time grid in float32: ``linspace(1, 0)`` warped by ``shift``."""
    s = np.linspace(1.0, 0.0, steps, dtype=np.float32)
    return (np.float32(shift) * s / (np.float32(1.0) + np.float32(shift - 1.0) * s)).astype(
        np.float32
    )


def nhwc(x: torch.Tensor) -> np.ndarray:
    """``[B, C, H, W]`` (or ``[B, K, C, H, W]``) torch to channels-last numpy."""
    a = x.detach().numpy()
    return np.moveaxis(a, -3, -1).astype(np.float32)


def record(name: str, spec: tuple, step_fn) -> dict:  # noqa: ANN001
    b, c, h, w, steps, shift, noise_level, seed = spec
    rng = np.random.default_rng(seed)
    times = grid(steps, shift)
    scheduler = _Scheduler(torch.from_numpy(times.copy()))
    weight = torch.from_numpy(rng.normal(0.0, 0.5, (c, h, w)).astype(np.float32))
    bias = torch.from_numpy(rng.normal(0.0, 0.5, (c, h, w)).astype(np.float32))
    ref_weight = weight + torch.from_numpy(rng.normal(0.0, 0.1, (c, h, w)).astype(np.float32))
    ref_bias = bias + torch.from_numpy(rng.normal(0.0, 0.1, (c, h, w)).astype(np.float32))
    initial = torch.from_numpy(rng.normal(size=(b, c, h, w)).astype(np.float32))
    generator = torch.Generator().manual_seed(1234 + seed)

    states, means, log_probs, std_dev, noises = [initial], [], [], [], []
    grad_v, grad_x, kl_exact, kl_released, grad_kl_v = [], [], [], [], []
    x = initial
    DRAWS.clear()
    for k in range(steps - 1):
        t = scheduler.timesteps[k].expand(b)
        v = weight * x + bias
        nxt, lp, mean, std = step_fn(
            scheduler, v, t, x, noise_level=noise_level, generator=generator
        )
        noises.append(DRAWS[-1])
        states.append(nxt)
        means.append(mean)
        log_probs.append(lp)
        std_dev.append(std.reshape(b)[0])
        # autograd through the same function, given the recorded next state
        xg = x.clone().requires_grad_(True)
        vg = (weight * x + bias).clone().requires_grad_(True)
        _, lp2, mean2, std2 = step_fn(
            scheduler, vg, t, xg, noise_level=noise_level, prev_sample=nxt
        )
        assert torch.equal(lp2.detach(), lp.detach())
        gv, gx = torch.autograd.grad(lp2.sum(), (vg, xg))
        grad_v.append(gv)
        grad_x.append(gx)
        # KL to a second model at the same state and time
        vr = ref_weight * x + ref_bias
        _, _, mean_ref, _ = step_fn(scheduler, vr, t, x, noise_level=noise_level, prev_sample=nxt)
        vk = (weight * x + bias).clone().requires_grad_(True)
        _, _, mean_k, std_k = step_fn(scheduler, vk, t, x, noise_level=noise_level, prev_sample=nxt)
        dt = scheduler.sigmas[k + 1] - scheduler.sigmas[k]
        scale = std_k * torch.sqrt(-dt)
        exact = torch.distributions.kl_divergence(
            torch.distributions.Normal(mean_k, scale.expand_as(mean_k)),
            torch.distributions.Normal(mean_ref.detach(), scale.expand_as(mean_k)),
        ).mean(dim=(1, 2, 3))
        (gk,) = torch.autograd.grad(exact.sum(), (vk,))
        kl_exact.append(exact.detach())
        grad_kl_v.append(gk)
        released = ((mean_k - mean_ref) ** 2).mean(dim=(1, 2, 3), keepdim=True) / (2 * std_k**2)
        kl_released.append(released.reshape(b).detach())
        x = nxt

    stack = lambda xs: torch.stack(xs, dim=1)  # noqa: E731
    arrays = {
        "times": times,
        "weight": nhwc(weight[None])[0],
        "bias": nhwc(bias[None])[0],
        "ref_weight": nhwc(ref_weight[None])[0],
        "ref_bias": nhwc(ref_bias[None])[0],
        "states": nhwc(stack(states)),
        "noise": nhwc(stack(noises)),
        "means": nhwc(stack(means)),
        "std_dev_t": torch.stack(std_dev).numpy().astype(np.float32),
        "log_probs": stack(log_probs).detach().numpy().astype(np.float32),
        "grad_log_probs_velocity": nhwc(stack(grad_v)),
        "grad_log_probs_state": nhwc(stack(grad_x)),
        "kl": stack(kl_exact).numpy().astype(np.float32),
        "kl_released": stack(kl_released).numpy().astype(np.float32),
        "grad_kl_velocity": nhwc(stack(grad_kl_v)),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = OUT / f".{name}.tmp.npz"
    np.savez(tmp, **arrays)
    tmp.replace(OUT / f"{name}.npz")
    return {
        "batch": b,
        "channels": c,
        "height": h,
        "width": w,
        "steps": steps,
        "shift": shift,
        "noise_level": noise_level,
        "seed": seed,
        "arrays": sorted(arrays),
    }


def main() -> None:
    torch.manual_seed(0)
    step_fn = load_reference()
    cases = {name: record(name, spec, step_fn) for name, spec in CASES.items()}
    sidecar = {
        "package": "flow_grpo",
        "repository": REPOSITORY,
        "revision": COMMIT,
        "path": PATH,
        "function": "sde_step_with_logprob",
        "blob": BLOB,
        "licence": "MIT",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "stand_ins": "diffusers 0.34 randn_tensor and FlowMatchEulerDiscreteScheduler "
        "(sigmas, index_for_timestep) only",
        "pi": math.pi,
        "cases": cases,
    }
    tmp = OUT / ".flow_grpo.json.tmp"
    tmp.write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    tmp.replace(OUT / "flow_grpo.json")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
