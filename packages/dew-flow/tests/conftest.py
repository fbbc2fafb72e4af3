"""Test setup for dew-flow: CPU only, two simulated devices (set before JAX starts)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
