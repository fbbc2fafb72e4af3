"""KL estimators between the policy and a reference: k1, abs, k2 and verl's clamped k3,
and ``kl_penalty``, which picks one by verl's name for it.

k3's elementwise value and derivative come from the foundation ``_token_terms``, which the
fused ``_policy_loss`` calls too.
"""

# Ports verl 0.9.1 (Apache License 2.0, Copyright 2024 Bytedance Ltd. and/or its affiliates).

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_same_dtype, require_same_shape
from dew.rl._token_terms import k3_grad_d, k3_value


def k1_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """The naive estimator ``log pi - log pi_ref`` of KL(pi || pi_ref), per token.

    Port of verl 0.9.1 ``kl_penalty_forward(..., "k1")`` (also spelled ``"kl"``). Unbiased
    but high variance and negative for some tokens (http://joschu.net/blog/kl-approx.html).
    No clamp.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]``; aggregate with :func:`token_mean` or the sequence reductions.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> ref_log_probs = jnp.array([[-1.5, -1.0]])
      >>> print(rl.k1_kl(log_probs, ref_log_probs))
      [[ 0.5 -1. ]]

    References:
      Schulman, `Approximating KL Divergence <http://joschu.net/blog/kl-approx.html>`_,
      2020.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``kl_penalty_forward`` (``"k1"``).
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    return log_probs - ref_log_probs


def abs_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """The absolute log ratio ``|log pi - log pi_ref|``, per token.

    Port of verl 0.9.1 ``kl_penalty_forward(..., "abs")``. Non-negative; not an estimate of
    the KL in expectation, a distance that grows linearly with the log ratio. No clamp. Its
    gradient is ``sign(log pi - log pi_ref)`` (in ``log_probs``), 0 where the two are equal,
    as torch's ``abs`` gives it.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> ref_log_probs = jnp.array([[-1.5, -1.0]])
      >>> print(rl.abs_kl(log_probs, ref_log_probs))
      [[0.5 1. ]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``kl_penalty_forward`` (``"abs"``).
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    d = log_probs - ref_log_probs
    # |d| written as d * sign(d): the same value, and the gradient sign(d), 0 at d == 0 as in
    # torch (jnp.abs's own gradient is 1 there).
    return d * jax.lax.stop_gradient(jnp.sign(d))


def k2_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """Half the squared log ratio, ``0.5 * (log pi - log pi_ref)**2``, per token.

    Port of verl 0.9.1 ``kl_penalty_forward(..., "k2")`` (also spelled ``"mse"``).
    Non-negative and biased, but its gradient is the gradient of the true KL in
    expectation, which is why verl's ``"k3+"`` straight-through mode borrows it. No clamp.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> ref_log_probs = jnp.array([[-1.5, -1.0]])
      >>> print(rl.k2_kl(log_probs, ref_log_probs))
      [[0.125 0.5  ]]

    References:
      Schulman, `Approximating KL Divergence <http://joschu.net/blog/kl-approx.html>`_,
      2020.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``kl_penalty_forward`` (``"k2"``).
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    return 0.5 * jnp.square(log_probs - ref_log_probs)


def k3_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    """Schulman's k3 estimate of KL(pi || pi_ref) per token: ``exp(d) - d - 1``.

    ``d = log pi_ref - log pi``. The estimate is non-negative, unbiased for the sampled
    tokens and has lower variance than ``-d`` (http://joschu.net/blog/kl-approx.html).
    Port of verl 0.9.1 ``kl_penalty_forward(..., "k3")`` (``"low_var_kl"``): ``d`` is
    clamped to [-20, 20] before the exponential and the estimate to [-10, 10] after it, so
    one drifted token adds at most 10 rather than exp(20). Both clamps pass gradient at and
    inside their bounds, none beyond (torch's rule).

    For a KL loss, aggregate like the policy loss, ``beta * token_mean(k3_kl(...), mask)``.
    The backward pass is written out (``jax.custom_vjp``, so no ``jax.jvp``): it keeps only
    the inputs and recomputes ``exp(d)``, returning autodiff's gradient term for term.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.

    Returns:
      ``[B, T]`` in the inputs' dtype. No mask is taken: a nan input stays at its own
      position (and, since exp is non-linear, in its own gradient): select such entries
      away with ``jnp.where`` before calling when padding may hold garbage.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -1.0, -40.0]])
      >>> ref_log_probs = jnp.array([[-1.0, -2.0, -1.0]])
      >>> import numpy as np
      >>> print(np.asarray(rl.k3_kl(log_probs, ref_log_probs)).round(4))  # the last is clamped
      [[ 0.      0.3679 10.    ]]

    References:
      Schulman, `Approximating KL Divergence <http://joschu.net/blog/kl-approx.html>`_,
      2020.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``kl_penalty_forward`` (``"k3"``,
      also ``"low_var_kl"``).
    """
    require_float("log_probs", log_probs)
    require_same_shape("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    require_same_dtype("ref_log_probs", ref_log_probs, "log_probs", log_probs)
    return _k3(log_probs, ref_log_probs)


#: verl 0.9.1's names of the estimators ``kl_penalty`` accepts, each with its function.
_BY_NAME = {
    "kl": k1_kl,
    "k1": k1_kl,
    "abs": abs_kl,
    "mse": k2_kl,
    "k2": k2_kl,
    "low_var_kl": k3_kl,
    "k3": k3_kl,
}
#: The names ``kl_penalty`` accepts, verl 0.9.1's spellings (its ``"+"`` straight-through
#: variants and ``"full"`` are not among them).
KL_ESTIMATORS: tuple[str, ...] = tuple(_BY_NAME)


def kl_penalty(
    log_probs: jax.Array, ref_log_probs: jax.Array, estimator: str = "low_var_kl"
) -> jax.Array:
    """The per-token KL estimate verl names ``estimator``: one of :data:`KL_ESTIMATORS`.

    ``"kl"``/``"k1"`` is :func:`k1_kl`, ``"abs"`` :func:`abs_kl`, ``"mse"``/``"k2"``
    :func:`k2_kl` and ``"low_var_kl"``/``"k3"`` :func:`k3_kl` (with its clamps), as verl
    0.9.1's ``kl_penalty`` dispatches them. ``estimator`` is a static Python string, picked
    at trace time.

    Args:
      log_probs: ``[B, T]`` log-probabilities under the policy.
      ref_log_probs: ``[B, T]`` the same under the reference, same dtype.
      estimator: the estimator's verl name.

    Returns:
      ``[B, T]`` in the inputs' dtype.

    Raises:
      ValueError: ``estimator`` is not one of the names; the message names the
        ``kl_estimator`` option, lists the names and repeats what came. verl's
        straight-through ``"k3+"`` style names are refused too.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> ref_log_probs = jnp.array([[-1.5, -1.0]])
      >>> print(rl.kl_penalty(log_probs, ref_log_probs, "abs"))
      [[0.5 1. ]]
      >>> print(rl.kl_penalty(log_probs, ref_log_probs, "mse"))
      [[0.125 0.5  ]]

    References:
      Schulman, `Approximating KL Divergence <http://joschu.net/blog/kl-approx.html>`_,
      2020.

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``kl_penalty`` and
      ``kl_penalty_forward``.
    """
    if not isinstance(estimator, str) or estimator not in _BY_NAME:
        raise ValueError(
            f"kl_estimator: expected one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}"
        )
    return _BY_NAME[estimator](log_probs, ref_log_probs)


@jax.custom_vjp
def _k3(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    return k3_value(log_probs, ref_log_probs)[0]


def _k3_forward(
    log_probs: jax.Array, ref_log_probs: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _k3(log_probs, ref_log_probs), (log_probs, ref_log_probs)


def _k3_backward(
    residuals: tuple[jax.Array, jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Autodiff's gradient, term for term, recomputed from the inputs.

    Saving only the inputs lets XLA keep ``exp(d)`` in registers instead of writing it out
    in the forward pass and reading it back here; the barrier stops it from merging this
    recomputation with the forward one into a stored array.
    """
    log_probs, ref_log_probs = jax.lax.optimization_barrier(residuals)
    _, e, passes = k3_value(log_probs, ref_log_probs)
    grad_d = k3_grad_d(e, passes, cotangent)  # d/dd of exp(d) - d - 1
    return -grad_d, grad_d


_k3.defvjp(_k3_forward, _k3_backward)
