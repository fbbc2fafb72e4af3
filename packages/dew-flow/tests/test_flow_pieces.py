"""InputSpec, Process, SimpleDiT, sample_trajectory and DiffusionObjective on tiny shapes."""

from __future__ import annotations

import itertools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew import Trainer
from dew.data import Dataset
from dew.flow import (
    DiffusionObjective,
    Field,
    InputError,
    InputSpec,
    LabelEncoder,
    Process,
    SimpleDiT,
    TokenEncoder,
    presets,
    sample_trajectory,
)

DIT = SimpleDiT(output_channels=1, patch_size=2, emb_features=8, num_layers=1, num_heads=2,
                mlp_ratio=2)  # fmt: skip


# ------------------------------------------------------------------ inputs
def test_input_spec_names_the_bad_field() -> None:
    spec = InputSpec(Field("image", (4, 4, 1)), Field("label", (), "int32"))
    with pytest.raises(InputError, match=r"batch\['label'\]: missing \(a condition\)"):
        spec.check({"image": np.zeros((2, 4, 4, 1), np.uint8)}, target=True)
    with pytest.raises(
        InputError, match=r"batch\['image'\]: expected shape \[B, 4, 4, 1\], got \[2, 4, 4, 3\]"
    ):
        spec.check({"image": np.zeros((2, 4, 4, 3)), "label": np.zeros(2)}, target=True)
    spec.check({"label": np.zeros(2)}, target=False)  # prompt-only batches need no image
    with pytest.raises(ValueError, match="unique"):
        InputSpec(Field("image", (4, 4, 1)), Field("image", (4, 4, 1)))
    with pytest.raises(ValueError, match=r"InputSpec.target: 'image' is not one of"):
        InputSpec(Field("picture", (4, 4, 1)))
    with pytest.raises(ValueError, match=r"expected \[H, W, C\]"):
        InputSpec(Field("image", (4, 4)))


def test_tokenize_pads_and_refuses_long_prompts() -> None:
    spec = InputSpec(Field("image", (4, 4, 1)), Field("prompt", (5,), "int32"))
    out = spec.tokenize(["ab", "é"])
    assert list(out) == ["prompt"]
    np.testing.assert_array_equal(out["prompt"], [[98, 99, 0, 0, 0], [196, 170, 0, 0, 0]])
    with pytest.raises(
        InputError, match=r"prompts\[1\]: 6 tokens do not fit Field\('prompt'\) of length 5"
    ):
        spec.tokenize(["ok", "sixsix"])
    with pytest.raises(TypeError, match="one string"):
        spec.tokenize("ab")


# ------------------------------------------------------------------ process
def test_process_grid_interpolation_and_steps() -> None:
    p = Process(shift=3.0)
    times = np.asarray(p.grid(5))
    assert times[0] == 1.0 and times[-1] == 0.0 and np.all(np.diff(times) < 0)
    np.testing.assert_allclose(times[2], 3 * 0.5 / (1 + 2 * 0.5), rtol=1e-6)
    x0, eps = jnp.ones((2, 3)), jnp.full((2, 3), -2.0)
    np.testing.assert_allclose(p.interpolate(x0, eps, jnp.array([0.0, 1.0])), [[1] * 3, [-2] * 3])
    x, v = jnp.arange(6.0).reshape(2, 3), jnp.ones((2, 3))
    t, tn = jnp.array([0.5, 0.5]), jnp.array([0.25, 0.25])
    mean, std = p.sde_step(x, v, t, tn, jnp.zeros(2))
    np.testing.assert_allclose(mean, p.euler_step(x, v, t, tn), rtol=1e-6)
    np.testing.assert_array_equal(std, [0.0, 0.0])
    scales = np.asarray(Process(sde_window=(1, 3)).noise_scales(p.grid(6)))
    assert scales[0] == 0 and scales[3] == 0 and scales[4] == 0 and np.all(scales[1:3] > 0)
    with pytest.raises(ValueError, match=r"steps: expected an integer >= 2"):
        p.grid(1)
    with pytest.raises(ValueError, match=r"Process.time_sampler: expected one of"):
        Process(time_sampler="beta")
    with pytest.raises(ValueError, match=r"Process.sde_window"):
        Process(sde_window=(3, 3))
    assert presets.Flow()() == Process(time_sampler="logit-normal", noise_level=0.7)
    t = np.asarray(Process().sample_times(jax.random.key(0), 4000))
    assert 0 < t.min() and t.max() < 1 and abs(np.median(t) - 0.5) < 0.03


def test_flow_matching_loss_is_zero_for_the_true_velocity() -> None:
    p = Process()
    x0 = jax.random.normal(jax.random.key(1), (3, 2, 2, 1))
    eps = jax.random.normal(jax.random.key(2), (3, 2, 2, 1))
    np.testing.assert_allclose(p.loss(eps - x0, x0, eps), np.zeros(3), atol=1e-7)
    np.testing.assert_allclose(p.loss(jnp.zeros_like(x0), x0, eps),
                               np.mean(np.square(eps - x0), axis=(1, 2, 3)), rtol=1e-6)  # fmt: skip


# ------------------------------------------------------------------ model
def test_simple_dit_starts_at_zero_and_uses_time_and_condition() -> None:
    x = jax.random.normal(jax.random.key(0), (2, 4, 4, 1))
    t = jnp.array([0.2, 0.9])
    cond = jnp.ones((2, 3))
    variables = DIT.init(jax.random.key(1), x, t, cond)
    np.testing.assert_array_equal(DIT.apply(variables, x, t, cond), np.zeros((2, 4, 4, 1)))
    # move every zero-initialised (adaLN-zero) kernel away from zero
    flat = flax.traverse_util.flatten_dict(variables["params"])
    rng = np.random.default_rng(0)
    flat = {k: (v + rng.normal(0, 0.3, v.shape)).astype(np.float32) for k, v in flat.items()}
    moved = {"params": flax.traverse_util.unflatten_dict(flat)}
    out = DIT.apply(moved, x, t, cond)
    assert out.shape == (2, 4, 4, 1) and float(jnp.abs(out).max()) > 0
    assert not np.allclose(out, DIT.apply(moved, x, t[::-1], cond))
    assert not np.allclose(out, DIT.apply(moved, x, t, 2 * cond))
    with pytest.raises(ValueError, match="not a multiple of patch_size 2"):
        DIT.init(jax.random.key(1), jnp.zeros((1, 3, 4, 1)), jnp.zeros(1))


def test_encoders() -> None:
    ids = jnp.array([[3, 4, 0], [0, 0, 0]])
    enc = TokenEncoder(vocab_size=8, features=2)
    v = enc.init(jax.random.key(0), ids)
    table = v["params"]["table"]["embedding"]
    np.testing.assert_allclose(enc.apply(v, ids), [(table[3] + table[4]) / 2, [0, 0]], rtol=1e-6)
    lab = LabelEncoder(num_classes=3, features=2)
    lv = lab.init(jax.random.key(0), jnp.array([1]))
    np.testing.assert_allclose(
        lab.apply(lv, jnp.array([2])), lv["params"]["table"]["embedding"][2:3]
    )


# ------------------------------------------------------------------ trajectories
def test_trajectory_without_noise_is_the_euler_sampler() -> None:
    p = Process()

    def velocity(x, t):
        return 0.5 * x + t[:, None]

    x = jnp.ones((2, 3))
    path = sample_trajectory(velocity, p, x, 4)
    times = np.asarray(p.grid(4))
    y = np.ones((2, 3), np.float32)
    for k in range(3):
        y = y + (0.5 * y + times[k]) * (times[k + 1] - times[k])
    np.testing.assert_allclose(path.samples, y, rtol=1e-6)
    assert not np.any(np.asarray(path.stochastic))
    np.testing.assert_array_equal(path.log_densities, np.zeros((2, 3)))
    window = Process(sde_window=(1, 2))
    noisy = sample_trajectory(velocity, window, x, 4, jnp.ones((2, 3, 3)))
    np.testing.assert_array_equal(noisy.stochastic, [False, True, False])
    assert np.all(np.asarray(noisy.log_densities)[:, 1] != 0)
    np.testing.assert_array_equal(np.asarray(noisy.log_densities)[:, [0, 2]], 0)
    with pytest.raises(ValueError, match=r"noise: expected shape \[B, steps - 1, ...\]"):
        sample_trajectory(velocity, p, x, 4, jnp.ones((2, 2, 3)))


# ------------------------------------------------------------------ flow matching
class _Pool:
    """A fixed 2x average-pool autoencoder (decode repeats pixels)."""

    def encode(self, images):
        b, h, w, c = images.shape
        return images.reshape(b, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))

    def decode(self, latents):
        return jnp.repeat(jnp.repeat(latents, 2, axis=1), 2, axis=2)


def test_diffusion_objective_learns_and_checks_its_arguments() -> None:
    inputs = InputSpec(Field("image", (4, 4, 1)), Field("label", (), "int32"))
    enc = {"label": LabelEncoder(num_classes=2, features=4)}
    objective = DiffusionObjective(DIT, presets.Flow()(), inputs, encoders=enc,
                                   condition_dropout=0.1)  # fmt: skip
    rng = np.random.default_rng(0)
    labels = np.array([0, 1] * 4, np.int32)
    images = np.where(labels[:, None, None, None] == 0, 30, 220).astype(np.uint8)
    images = np.broadcast_to(images, (8, 4, 4, 1)) + rng.integers(0, 10, (8, 4, 4, 1)).astype(
        np.uint8
    )
    batch = {"image": images, "label": labels}
    data = Dataset(
        train=lambda p: itertools.repeat(batch), val=lambda p: iter([batch]), records=8, batch=8
    )
    trainer = Trainer(objective, optax.adam(1e-2), key=jax.random.key(0))
    state0 = trainer.initial_state()
    before = trainer.evaluate(state0.params, data)["loss"]
    state = trainer.fit(data, steps=30, state=state0)
    after = trainer.evaluate(state.params, data)["loss"]
    assert after < 0.7 * before, (before, after)
    out = objective.generate(state.params, {"label": labels[:2]}, jax.random.key(3), steps=6)
    assert out.shape == (2, 4, 4, 1) and float(out[1].mean()) > float(out[0].mean())

    latent = DiffusionObjective(DIT, presets.Flow()(), InputSpec(Field("image", (8, 8, 1))),
                                autoencoder=_Pool())  # fmt: skip
    assert latent.state_shape == (4, 4, 1)
    v = latent.init(jax.random.key(0))
    ls, w, _ = latent.loss(v, {"image": np.zeros((2, 8, 8, 1), np.uint8)}, jax.random.key(1))
    assert float(w) == 2 and np.isfinite(float(ls))
    with pytest.raises(ValueError, match=r"encoders\['prompt'\]: not a condition field"):
        DiffusionObjective(DIT, presets.Flow()(), inputs, encoders={"prompt": enc["label"]})
    with pytest.raises(TypeError, match="process: expected a dew.flow.Process"):
        DiffusionObjective(DIT, presets.Flow(), inputs)
    with pytest.raises(InputError, match=r"batch\['image'\]: missing"):
        objective.loss(state.params, {"label": labels}, jax.random.key(0))
