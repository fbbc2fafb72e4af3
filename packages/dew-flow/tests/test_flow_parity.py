"""Flow-GRPO's released SDE step (recorded by tools/parity_flow.py) against dew.flow.

The fixtures hold one trajectory per case, run by ``sde_step_with_logprob`` of
yifan123/flow_grpo at the commit the JSON sidecar names, through a linear velocity
``v = w * x + c``, with the noise it drew. Replaying that noise, ``sample_trajectory`` must give
the same states, means, standard deviations and per-coordinate log densities; the gradients of
the log densities (with respect to the velocity and the state) and of ``transition_kl`` must
match torch autograd.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.flow import Process, sample_trajectory, transition_kl
from dew.flow.process import coordinate_log_density

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "flow"
SIDECAR = json.loads((FIXTURES / "flow_grpo.json").read_text())
CASES = sorted(SIDECAR["cases"])
MAX_DIFF: dict[str, float] = {}


def load(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(FIXTURES / f"{name}.npz") as z:
        return SIDECAR["cases"][name], {k: z[k] for k in z.files}


def close(name: str, got, want, atol: float, rtol: float = 1e-5) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), diff)
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)


def test_sidecar_pins_the_reference() -> None:
    assert SIDECAR["repository"] == "https://github.com/yifan123/flow_grpo"
    assert len(SIDECAR["revision"]) == 40
    assert SIDECAR["function"] == "sde_step_with_logprob"


@pytest.mark.parametrize("name", CASES)
def test_trajectory_matches_flow_grpo(name: str) -> None:
    meta, ref = load(name)
    process = Process(shift=meta["shift"], noise_level=meta["noise_level"])
    steps = meta["steps"]
    close(f"{name}/times", process.grid(steps), ref["times"], atol=1e-7)
    w, c = jnp.asarray(ref["weight"]), jnp.asarray(ref["bias"])
    noise = jnp.asarray(ref["noise"])
    path = jax.jit(
        lambda x0, eps: sample_trajectory(lambda x, t: w * x + c, process, x0, steps, eps)
    )(jnp.asarray(ref["states"][:, 0]), noise)
    close(f"{name}/scales", path.scales, ref["std_dev_t"], atol=1e-6)
    dt = ref["times"][:-1] - ref["times"][1:]
    close(f"{name}/stds", path.stds, ref["std_dev_t"] * np.sqrt(dt), atol=1e-6)
    assert bool(np.all(np.asarray(path.stochastic)))
    close(f"{name}/means", path.means, ref["means"], atol=2e-5)
    close(f"{name}/states", path.states, ref["states"], atol=2e-5)
    close(f"{name}/log_probs", path.coordinate_log_densities, ref["log_probs"], atol=2e-5)
    size = int(np.prod(ref["states"].shape[2:]))
    close(f"{name}/joint_log_probs", path.log_densities, ref["log_probs"] * size, atol=2e-5 * size)


def _step(process: Process, times: np.ndarray, k: int, batch: int):
    t = jnp.full((batch,), times[k])
    t_next = jnp.full((batch,), times[k + 1])
    scale = jnp.full((batch,), process.noise_scales(jnp.asarray(times))[k])
    return t, t_next, scale


@pytest.mark.parametrize("name", CASES)
def test_log_density_gradients_match_autograd(name: str) -> None:
    meta, ref = load(name)
    process = Process(shift=meta["shift"], noise_level=meta["noise_level"])
    times, states = ref["times"], ref["states"]
    w, c = ref["weight"], ref["bias"]
    b = states.shape[0]

    def total(v, x, x_next, t, t_next, scale):
        mean, std = process.sde_step(x, v, t, t_next, scale)
        return jnp.sum(coordinate_log_density(x_next, mean, std))

    grad = jax.jit(jax.grad(total, argnums=(0, 1)))
    for k in range(meta["steps"] - 1):
        x = jnp.asarray(states[:, k])
        gv, gx = grad(w * x + c, x, jnp.asarray(states[:, k + 1]), *_step(process, times, k, b))
        close(
            f"{name}/grad_velocity", gv, ref["grad_log_probs_velocity"][:, k], atol=1e-5, rtol=1e-4
        )
        close(f"{name}/grad_state", gx, ref["grad_log_probs_state"][:, k], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_transition_kl_matches_torch(name: str) -> None:
    meta, ref = load(name)
    process = Process(shift=meta["shift"], noise_level=meta["noise_level"])
    times, states = ref["times"], ref["states"]
    b = states.shape[0]

    def kl(v, v_ref, x, t, t_next, scale):
        mean, std = process.sde_step(x, v, t, t_next, scale)
        mean_ref, _ = process.sde_step(x, v_ref, t, t_next, scale)
        return transition_kl(mean, mean_ref, std)

    value = jax.jit(kl)
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(kl(*a))))
    for k in range(meta["steps"] - 1):
        x = jnp.asarray(states[:, k])
        v = ref["weight"] * x + ref["bias"]
        v_ref = ref["ref_weight"] * x + ref["ref_bias"]
        args = (v, v_ref, x, *_step(process, times, k, b))
        got = value(*args)
        close(f"{name}/kl", got, ref["kl"][:, k], atol=1e-7, rtol=1e-4)
        # the released trainer's regularizer is the same KL times the elapsed time
        elapsed = times[k] - times[k + 1]
        close(f"{name}/kl_released", got * elapsed, ref["kl_released"][:, k], atol=1e-7, rtol=1e-4)
        close(f"{name}/grad_kl", grad(*args), ref["grad_kl_velocity"][:, k], atol=1e-6, rtol=1e-4)


def test_report_max_differences() -> None:
    """Runs last in this file: prints the largest difference of every compared quantity."""
    assert MAX_DIFF, "the parity tests above recorded nothing"
    for key in sorted(MAX_DIFF):
        print(f"parity {key}: max |diff| = {MAX_DIFF[key]:.3g}")
