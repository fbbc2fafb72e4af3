"""Flow-GRPO's released training loss (recorded by tools/parity_flow_loss.py) against dew.flow.

The fixture holds one transition per row, scored by ``sde_step_with_logprob`` and then by the
loss block of yifan123/flow_grpo's ``scripts/train_sd3.py`` (the commit and blob hashes are in
the JSON sidecar), for three values of beta. Here ``FlowGRPOObjective.loss`` sees the same
states, next states, advantages and old log-probs through a model whose output is a parameter
(the fixture's model output); its loss over its weight, its parts and its gradients (with
respect to that output, the per-transition log density and the transition mean, the last two
through zero probes added where dew computes them) must match torch autograd.

Two differences are by design and pinned here: dew's KL is the exact Gaussian KL of the
transition, which is the released ``kl_loss`` divided by the elapsed time ``t - t'``, so dew's
beta is the released beta times that time; and dew's clip fraction counts the rows where the
clip is active (verl's ``pg_clipfrac``), while the released ``clipfrac`` counts every ratio
outside the range.
"""

from __future__ import annotations

import json
import pathlib
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.flow.grpo as grpo
from dew.flow import Field, FlowGRPOObjective, InputSpec, Process

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "flow"
SIDECAR = json.loads((FIXTURES / "flow_grpo_loss.json").read_text())
with np.load(FIXTURES / "flow_grpo_loss.npz") as _z:
    REF = {k: _z[k] for k in _z.files}
CASES = sorted(SIDECAR["cases"])
MAX_DIFF: dict[str, float] = {}


class Output(nn.Module):
    """A "model" whose velocity is one parameter per row, whatever the state and time."""

    shape: tuple[int, ...]

    @nn.compact
    def __call__(self, x: jax.Array, t: jax.Array, condition: jax.Array | None = None):
        return self.param("v", nn.initializers.zeros, self.shape) + jnp.zeros_like(x)


def close(name: str, got, want, atol: float, rtol: float = 1e-5) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    diff = float(np.max(np.abs(got - want)))
    MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), diff)
    np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=name)


def setup(beta: float):
    """``(objective, variables, reference, batch, elapsed)`` for the fixture's rows."""
    states = REF["input/state"]
    n, shape = states.shape[0], states.shape[1:]
    process = Process(shift=SIDECAR["shift"], noise_level=SIDECAR["noise_level"])
    times, k = REF["input/times"], SIDECAR["step"]
    elapsed = float(times[k] - times[k + 1])
    objective = FlowGRPOObjective(
        Output((n, *shape)),
        process,
        InputSpec(Field("image", shape, "float32")),
        beta=beta * elapsed,  # the released kl_loss is dew's KL times the elapsed time
        epsilon_low=SIDECAR["train"]["clip_range"],
        epsilon_high=SIDECAR["train"]["clip_range"],
        advantage_clip=SIDECAR["train"]["adv_clip_max"],
    )
    init = objective.init(jax.random.key(0))
    as_vars = lambda v: jax.tree.map(lambda _: jnp.asarray(v), init)  # noqa: E731
    column = lambda value: jnp.full((n, 1), value, jnp.float32)  # noqa: E731
    batch = {
        "states": jnp.asarray(states)[:, None],
        "next_states": jnp.asarray(REF["input/next_state"])[:, None],
        "times": column(times[k]),
        "next_times": column(times[k + 1]),
        "scales": column(process.noise_scales(jnp.asarray(times))[k]),
        "transition_mask": column(1.0),
        "advantages": jnp.asarray(REF["input/advantages"])[:, None],
    }
    reference = as_vars(REF["input/ref_velocity"])
    return objective, as_vars(REF["input/velocity"]), reference, batch, elapsed


def probed_loss(objective, variables, lp_probe, mean_probe, batch, reference):
    """Dew's loss over its weight, with zero probes on the log densities and the means."""
    process, density = objective.process, grpo.coordinate_log_density

    class Probed:
        def sde_step(self, *args):
            mean, std = process.sde_step(*args)
            return mean + mean_probe.reshape(mean.shape), std

    with (
        mock.patch.object(grpo, "coordinate_log_density", lambda *a: density(*a) + lp_probe),
        mock.patch.object(objective, "process", Probed()),
    ):
        loss_sum, weight, metrics = objective.loss(variables, batch, jax.random.key(0), reference)
    return loss_sum / weight, (weight, metrics)


@pytest.mark.parametrize("name", CASES)
def test_flow_grpo_loss_matches_released_trainer(name: str) -> None:
    beta = SIDECAR["cases"][name]
    objective, variables, reference, batch, elapsed = setup(beta)
    n = batch["states"].shape[0]
    old = REF[f"{name}/old_log_prob"]
    batch["behavior_log_probs"] = jnp.asarray(old)[:, None]
    probes = (jnp.zeros((n,)), jnp.zeros(REF["input/state"].shape))
    grad = jax.grad(probed_loss, argnums=(1, 2, 3), has_aux=True)
    (g_vars, g_lp, g_mean), (weight, metrics) = grad(
        objective, variables, *probes, batch, reference
    )
    loss, _ = probed_loss(objective, variables, *probes, batch, reference)
    assert float(weight) == n
    close(f"{name}/log_prob", objective.log_densities(variables, batch)[:, 0],
          REF[f"{name}/log_prob"], atol=2e-6)  # fmt: skip
    close(f"{name}/loss", loss, REF[f"{name}/loss"][0], atol=1e-6)
    close(f"{name}/policy_loss", metrics["policy/loss"], REF[f"{name}/policy_loss"][0], atol=1e-6)
    if beta > 0:
        kl = metrics["kl/reference"] * elapsed
        close(f"{name}/kl_loss", kl, REF[f"{name}/kl_loss"][0], atol=1e-9, rtol=1e-5)
    close(f"{name}/grad_log_prob", g_lp, REF[f"{name}/grad_log_prob"], atol=1e-6)
    close(f"{name}/grad_mean", g_mean, REF[f"{name}/grad_mean"], atol=1e-6, rtol=1e-4)
    (g_v,) = jax.tree.leaves(g_vars)
    close(f"{name}/grad_velocity", g_v, REF[f"{name}/grad_velocity"], atol=1e-6, rtol=1e-4)
    log_ratio = np.asarray(objective.log_densities(variables, batch)[:, 0], np.float64) - old
    check_logged_metrics(name, metrics, log_ratio)


def check_logged_metrics(name: str, metrics, log_ratio: np.ndarray) -> None:
    """The released trainer's logged statistics next to dew's, on dew's own log-ratios.

    The released ``approx_kl`` is ``mean(log_ratio**2) / 2``; dew logs ``mean(-log_ratio)``
    (verl's ``ppo_kl``). The released ``clipfrac`` counts ratios outside ``1 +- clip_range``;
    dew's ``policy/clip_fraction`` counts only the rows whose clipped term is the larger one.
    """
    eps = SIDECAR["train"]["clip_range"]
    ratio = np.exp(log_ratio)
    close(f"{name}/approx_kl", 0.5 * np.mean(log_ratio**2), REF[f"{name}/approx_kl"][0], 1e-6)
    close(f"{name}/ppo_kl", metrics["policy/ppo_kl"], -np.mean(log_ratio), 1e-6)
    close(f"{name}/clipfrac", np.mean(np.abs(ratio - 1) > eps), REF[f"{name}/clipfrac"][0], 0)
    for side, outside in (("gt_one", ratio - 1 > eps), ("lt_one", 1 - ratio > eps)):
        close(f"{name}/clipfrac_{side}", np.mean(outside), REF[f"{name}/clipfrac_{side}"][0], 0)
    adv = np.clip(REF["input/advantages"], -5.0, 5.0)
    active = ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))
    close(f"{name}/clip_fraction", metrics["policy/clip_fraction"], np.mean(active), 1e-7)
    assert 0 < np.mean(active) < np.mean(np.abs(ratio - 1) > eps)  # both clip sides occur


def test_sidecar_pins_the_reference() -> None:
    assert SIDECAR["repository"] == "https://github.com/yifan123/flow_grpo"
    assert SIDECAR["revision"] == "ac4c86e8cae021841f1fde853d340e0db67690dd"
    assert SIDECAR["path"] == "scripts/train_sd3.py"
    assert SIDECAR["cases"]["beta0"] == 0.0 and max(SIDECAR["cases"].values()) > 0


def test_report_max_differences() -> None:
    """Runs last in this file: prints the largest difference of every compared quantity."""
    assert MAX_DIFF, "the parity tests above recorded nothing"
    for key in sorted(MAX_DIFF):
        print(f"parity {key}: max |diff| = {MAX_DIFF[key]:.3g}")
