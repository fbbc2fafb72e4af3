"""dew.rl's reward shaping against verl 0.9.1: KL in the reward with its controllers, DAPO's
overlong term.

The fixtures in ``tests/fixtures/reward_shaping`` were written by
``tools/parity_reward_shaping.py`` from verl's own ``apply_kl_penalty``,
``AdaptiveKLController``/``FixedKLController`` and ``DAPORewardManager``. The KL cases replay
five successive batches: Dew's coefficient at each step is the one its own
``adaptive_kl_coefficient`` produced from the previous step (never verl's), so a drift in the
controller would compound and show.

Tolerances: float64 1e-12 of the scale; float32 4 ulps of the scale for rewards and the mean
KL; the coefficient, host float64 arithmetic on the same float32 KL verl reads with
``.item()``, 1e-15 relative.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import rl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reward_shaping"
KL_CASES = sorted(p.stem for p in FIXTURES.glob("kl_in_reward_*.npz"))
LARGEST: dict[str, float] = {}


def _tolerance(dtype: str, scale: float) -> float:
    if dtype == "f64":
        return 1e-12 * max(scale, 1.0)
    return 4 * float(np.finfo(np.float32).eps) * max(scale, 1.0)


def _record(name: str, diff: float) -> None:
    LARGEST[name] = max(LARGEST.get(name, 0.0), diff)


def test_fixtures_exist() -> None:
    assert len(KL_CASES) == 9, KL_CASES
    assert (FIXTURES / "dapo_overlong.npz").exists()


@pytest.mark.parametrize("case", KL_CASES)
def test_kl_in_reward_matches_verl(case: str) -> None:
    side = json.loads((FIXTURES / f"{case}.json").read_text())
    with jax.enable_x64(side["dtype"] == "f64"):
        _replay(side, np.load(FIXTURES / f"{case}.npz"))


def _replay(side: dict, data: Any) -> None:
    """Runs the fixture's steps through dew.rl, the coefficient carried from step to step."""
    controller = side["controller"]
    dtype = jnp.float64 if side["dtype"] == "f64" else jnp.float32
    coefficient = controller["kl_coef"]
    for step in range(side["steps"]):
        assert coefficient == pytest.approx(float(data[f"out__coefficient_{step}"]), rel=1e-15)
        old = jnp.asarray(data[f"in__old_log_probs_{step}"], dtype)
        ref = jnp.asarray(data[f"in__ref_log_probs_{step}"], dtype)
        mask = jnp.asarray(data[f"in__mask_{step}"])
        scores = jnp.asarray(data[f"in__scores_{step}"], dtype)
        kl = rl.kl_penalty(old, ref, side["estimator"])
        rewards, current_kl = rl.kl_reward(scores, kl, mask, coefficient)
        assert rewards.dtype == dtype and current_kl.dtype == dtype
        want = data[f"out__rewards_{step}"]
        diff = float(np.max(np.abs(np.asarray(rewards, np.float64) - want)))
        assert diff <= _tolerance(side["dtype"], float(np.max(np.abs(want)))), (step, diff)
        _record(f"kl_reward rewards ({side['dtype']})", diff)
        want_kl = float(data[f"out__current_kl_{step}"])
        diff = abs(float(current_kl) - want_kl)
        assert diff <= _tolerance(side["dtype"], abs(want_kl)), (step, diff)
        _record(f"kl_reward current_kl ({side['dtype']})", diff)
        if controller["type"] == "adaptive":
            coefficient = rl.adaptive_kl_coefficient(
                coefficient,
                float(current_kl),
                n_steps=scores.shape[0],
                target=controller["target_kl"],
                horizon=controller["horizon"],
            )
        want_next = float(data[f"out__next_coefficient_{step}"])
        assert coefficient == pytest.approx(want_next, rel=1e-15), step
        _record("adaptive_kl_coefficient (relative)", abs(coefficient - want_next) / want_next)


def test_the_adaptive_cases_reach_both_error_bounds() -> None:
    """The fixtures exercise the clip at -0.2 and +0.2, not only the linear middle."""
    errors = []
    for case in KL_CASES:
        side = json.loads((FIXTURES / f"{case}.json").read_text())
        if side["controller"]["type"] != "adaptive":
            continue
        data = np.load(FIXTURES / f"{case}.npz")
        for step in range(side["steps"]):
            errors.append(
                float(data[f"out__current_kl_{step}"]) / side["controller"]["target_kl"] - 1
            )
    assert min(errors) < -0.2 and max(errors) > 0.2 and any(abs(e) < 0.2 for e in errors)


def test_overlong_penalty_matches_dapo_reward_manager() -> None:
    side = json.loads((FIXTURES / "dapo_overlong.json").read_text())
    data = np.load(FIXTURES / "dapo_overlong.npz")
    options = side["options"]
    penalty = rl.overlong_penalty(
        jnp.asarray(data["in__lengths"]),
        options["max_length"],
        buffer=options["buffer"],
        penalty_factor=options["penalty_factor"],
    )
    rewards = data["in__scores"] + np.asarray(penalty, np.float64)
    diff = float(np.max(np.abs(rewards - data["out__rewards"])))
    assert diff <= 4 * float(np.finfo(np.float32).eps), diff
    _record("overlong_penalty", diff)
    assert np.any(np.asarray(penalty) < 0) and np.any(np.asarray(penalty) == 0)


def test_largest_differences_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """Prints the largest difference per function (run with ``-s``) once the others ran."""
    assert LARGEST, "run with the parity cases above"
    with capsys.disabled():
        for name, diff in sorted(LARGEST.items()):
            print(f"reward shaping vs verl 0.9.1: {name}: largest |diff| {diff:.3g}")
