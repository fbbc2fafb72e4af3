"""Test setup for the dew distribution: four simulated CPU devices, so sharding and
collectives run in every test. This must happen before JAX creates its backends."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
