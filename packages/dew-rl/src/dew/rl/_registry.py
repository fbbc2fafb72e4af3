"""Policy losses, advantage estimators and aggregations by name, in the spirit of verl's.

verl 0.9.1 picks its policy loss and advantage estimator from dictionaries filled by
decorators (``register_policy_loss``, ``register_adv_est`` in
``verl/trainer/ppo/core_algos.py``); an objective then looks a name up once instead of
branching on strings. These three registries do the same for Dew. Each fixes one signature
for its entries, so a caller can call whichever entry a name picks:

- policy losses: ``loss(log_probs, old_log_probs, advantages, mask, *, segments,
  epsilon_low, epsilon_high, dual_clip) -> (terms, metrics)``. The four arrays are
  ``[B, T]`` (``mask`` non-zero where kept, the others one floating dtype), ``segments`` is
  ``[B, T]`` integer chain ids (0 = padding) or None, the three bounds are Python numbers
  (``dual_clip`` may be None). ``terms`` is ``[B, T]`` in the inputs' dtype, 0 outside the
  mask, differentiable in ``log_probs``; ``metrics`` maps names to scalars without
  gradient, among them (when the loss has them) ``pg_clipfrac``, ``pg_clipfrac_lower``
  and ``ppo_kl`` in verl's meaning. An entry ignores the arguments it has no use for.
- advantage estimators: ``estimator(rewards, group_ids, mask, eps) -> advantages``, all
  ``[B]``: one reward and one integer group id per completion, ``mask`` (or None, all
  kept), ``eps`` a Python number; the result is in the rewards' dtype, 0 where dropped.
- aggregations: ``aggregation(x, mask, group_ids) -> (total, weight)``: ``x`` and
  ``mask`` ``[B, T]``, ``group_ids`` ``[B, T]`` integers or None; two scalars in ``x``'s
  dtype, the loss being ``total / weight`` and, over microbatches,
  ``sum(total) / sum(weight)``.

The built-in entries live in ``_builtins``. Like ``dew.rl.__init__`` (and ``_builtins``)
this module is a composition layer, not a theme: it may import from the themed modules,
and no theme imports it. Names are registered once per process; the registries are plain
module-level dictionaries, read at trace time, so a registered function runs under
``jax.jit`` like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dew.rl._builtins import ADVANTAGE_ESTIMATORS, AGGREGATIONS, POLICY_LOSSES

F = TypeVar("F", bound=Callable[..., Any])

#: The registries by kind; the kinds are the option names the objective checks.
_REGISTRIES: dict[str, dict[str, Callable[..., Any]]] = {
    "policy_loss": dict(POLICY_LOSSES),
    "estimator": dict(ADVANTAGE_ESTIMATORS),
    "aggregation": dict(AGGREGATIONS),
}


def _table(kind: str) -> dict[str, Callable[..., Any]]:
    if kind not in _REGISTRIES:
        raise ValueError(f"kind: expected one of {', '.join(_REGISTRIES)}, got {kind!r}")
    return _REGISTRIES[kind]


def _register(kind: str, name: str) -> Callable[[F], F]:
    table = _table(kind)
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty string, got {name!r}")
    if name in table:
        raise ValueError(f"{kind}: {name!r} is already registered")

    def decorator(function: F) -> F:
        if not callable(function):
            raise TypeError(f"{kind} {name!r}: expected a callable, got {type(function).__name__}")
        if name in table:  # registered between the two calls
            raise ValueError(f"{kind}: {name!r} is already registered")
        table[name] = function
        return function

    return decorator


def _lookup(kind: str, name: str) -> Callable[..., Any]:
    table = _table(kind)
    if name not in table:
        raise ValueError(f"{kind}: expected one of {', '.join(table)}, got {name!r}")
    return table[name]


def registered(kind: str) -> tuple[str, ...]:
    """The names registered under ``kind``, in the order they were registered.

    ``kind`` is ``"policy_loss"``, ``"estimator"`` or ``"aggregation"``, the option each
    registry serves; the built-in names come first. Use it to validate an option or to list
    the choices in a message; it reflects registrations made later, unlike a tuple copied
    at import.

    Args:
      kind: ``"policy_loss"``, ``"estimator"`` or ``"aggregation"``.

    Returns:
      A tuple of names (policy losses take ``[B, T]`` arrays, estimators ``[B]``).

    Raises:
      ValueError: ``kind`` is none of the three.

    Examples:
      >>> import dew.rl as rl
      >>> print(rl.registered("policy_loss")[:3])
      ('ppo', 'gspo', 'cispo')
      >>> print(rl.registered("estimator")[:3])
      ('group', 'mean', 'rloo')
      >>> print(rl.registered("aggregation")[:2])
      ('token-mean', 'session-mean')

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``POLICY_LOSS_REGISTRY`` and
      ``ADV_ESTIMATOR_REGISTRY``.
    """
    return tuple(_table(kind))


def register_policy_loss(name: str) -> Callable[[F], F]:
    """Decorator that registers a per-token policy loss under ``name``.

    The function must take the registry's policy-loss signature (module docstring):
    ``(log_probs, old_log_probs, advantages, mask, *, segments, epsilon_low, epsilon_high,
    dual_clip)``, all arrays ``[B, T]``, and return ``(terms [B, T], metrics)`` with
    ``terms`` 0 outside the mask. The GRPO objective then takes it by its ``policy_loss``
    option, applies its rollout corrections and aggregation to the terms and reports
    ``pg_clipfrac``, ``pg_clipfrac_lower`` and ``ppo_kl`` when the metrics hold them. The
    decorator returns the function unchanged.

    Args:
      name: the name to register, a non-empty string not registered yet.

    Returns:
      The decorator.

    Raises:
      ValueError: ``name`` is already registered (the built-ins ``"ppo"``, ``"gspo"`` and
        ``"cispo"`` included); nothing is replaced.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> @rl.register_policy_loss("doc-reinforce")
      ... def reinforce(log_probs, old_log_probs, advantages, mask, **bounds):
      ...     return jnp.where(mask > 0, -advantages * log_probs, 0.0), {}
      >>> terms, _ = rl.get_policy_loss("doc-reinforce")(
      ...     jnp.array([[-1.0, -2.0]]), jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.array([[1, 0]]))
      >>> print(terms)
      [[1. 0.]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``register_policy_loss``.
    """
    return _register("policy_loss", name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered under ``name`` (see :func:`register_policy_loss`).

    Args:
      name: a registered name: ``"ppo"``, ``"gspo"``, ``"cispo"`` or one registered later.

    Returns:
      The function, called as ``loss(log_probs, old_log_probs, advantages, mask,
      segments=..., epsilon_low=..., epsilon_high=..., dual_clip=...)`` on ``[B, T]``
      arrays; it returns ``([B, T] terms, metrics)``.

    Raises:
      ValueError: ``name`` is not registered; the message names the ``policy_loss`` field,
        lists the registered names and repeats what came.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> ppo = rl.get_policy_loss("ppo")
      >>> log_probs = jnp.log(jnp.array([[1.0, 1.5, 0.5, 5.0]]))
      >>> terms, metrics = ppo(log_probs, jnp.zeros((1, 4)), jnp.array([[1.0, 1.0, -1.0, -1.0]]),
      ...                      jnp.ones((1, 4)), epsilon_low=0.2, epsilon_high=0.2, dual_clip=3.0)
      >>> print(terms)  # as rl.clipped_surrogate_terms of the token log ratio
      [[-1.  -1.2  0.8  3. ]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``get_policy_loss_fn``.
    """
    return _lookup("policy_loss", name)


def register_advantage_estimator(name: str) -> Callable[[F], F]:
    """Decorator that registers an advantage estimator under ``name``.

    The function takes ``(rewards, group_ids, mask, eps)``: ``[B]`` rewards, ``[B]``
    integer group ids, a ``[B]`` mask or None and a Python number, and returns ``[B]``
    advantages in the rewards' dtype, 0 where the mask drops a completion. Dew's session
    packing (``dew.sessions.pack`` and the rollouts) then accepts ``name`` as its
    ``estimator``. The decorator returns the function unchanged.

    Args:
      name: the name to register, a non-empty string not registered yet.

    Returns:
      The decorator.

    Raises:
      ValueError: ``name`` is already registered (``"group"``, ``"mean"`` and ``"rloo"``
        included); nothing is replaced.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> @rl.register_advantage_estimator("doc-raw")
      ... def raw(rewards, group_ids, mask=None, eps=0.0):
      ...     return rewards if mask is None else jnp.where(mask > 0, rewards, 0.0)
      >>> print(rl.get_advantage_estimator("doc-raw")(jnp.array([1.0, 2.0]), jnp.array([0, 0])))
      [1. 2.]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``register_adv_est``.
    """
    return _register("estimator", name)


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """The advantage estimator registered under ``name``.

    The built-ins are the estimators of :func:`ragged_group_advantage`: ``"group"``,
    ``"mean"`` and ``"rloo"``, each that function with ``estimator`` fixed.

    Args:
      name: a registered name.

    Returns:
      The function, called as ``estimator(rewards, group_ids, mask, eps)`` on ``[B]``
      arrays.

    Raises:
      ValueError: ``name`` is not registered; the message names the ``estimator`` field,
        lists the registered names and repeats what came.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> rloo = rl.get_advantage_estimator("rloo")
      >>> rewards, group_ids = jnp.array([1.0, 3.0, 0.0, 5.0]), jnp.array([7, 4, 7, 4])
      >>> print(rloo(rewards, group_ids, None, 1e-6))
      [ 1. -2. -1.  2.]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``get_adv_estimator_fn``.
    """
    return _lookup("estimator", name)


def register_aggregation(name: str) -> Callable[[F], F]:
    """Decorator that registers a loss aggregation under ``name``.

    The function takes ``(x, mask, group_ids)``: ``[B, T]`` per-token losses, a ``[B, T]``
    mask and ``[B, T]`` integer group ids or None, and returns ``(total, weight)``, two
    scalars in ``x``'s dtype: the loss is ``total / weight``, and over several
    microbatches ``sum(total) / sum(weight)``. The GRPO objective then accepts ``name`` as
    its ``aggregation`` (passing the batch's ``session_index`` as ``group_ids`` when the
    batch has one). The decorator returns the function unchanged.

    Args:
      name: the name to register, a non-empty string not registered yet.

    Returns:
      The decorator.

    Raises:
      ValueError: ``name`` is already registered (``"token-mean"`` and ``"session-mean"``
        included); nothing is replaced.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> @rl.register_aggregation("doc-sum")
      ... def total_sum(x, mask, group_ids=None):
      ...     return jnp.sum(jnp.where(mask > 0, x, 0.0)), jnp.ones((), x.dtype)
      >>> print(rl.get_aggregation("doc-sum")(jnp.array([[1.0, 2.0]]), jnp.array([[1, 1]]), None))
      (Array(3., dtype=float32), Array(1., dtype=float32))

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss`` (its modes, chosen there
      by an if/elif on the name).
    """
    return _register("aggregation", name)


def get_aggregation(name: str) -> Callable[..., Any]:
    """The aggregation registered under ``name``.

    Built-ins: ``"token-mean"`` (the kept sum over the kept count, verl ``"token-mean"``)
    and ``"session-mean"`` (the sum of each group's mean over the number of groups, each
    mean its kept sum over its kept count + 1e-8, groups by id as in :func:`group_sums`),
    also registered as verl's ``"seq-mean-token-mean"``; ``"seq-mean-token-sum"`` (the kept
    sum over the number of groups with a kept position: the mean of the groups' token sums).
    The weight is the kept token count (token mean) or the number of groups holding a kept
    position (the others); both add up over micro-batches that do not split a group.

    Args:
      name: a registered name.

    Returns:
      The function, called as ``aggregation(x, mask, group_ids)`` on ``[B, T]`` arrays.

    Raises:
      ValueError: ``name`` is not registered; the message names the ``aggregation`` field,
        lists the registered names and repeats what came.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x, mask = jnp.array([[1.0, 3.0, 6.0]]), jnp.array([[1, 1, 1]])
      >>> total, weight = rl.get_aggregation("session-mean")(x, mask, jnp.array([[0, 0, 1]]))
      >>> print(f"{total:.4f} {weight}")  # 2 + 6 over two sessions
      8.0000 2.0
      >>> total, weight = rl.get_aggregation("seq-mean-token-sum")(x, mask, jnp.array([[0, 0, 1]]))
      >>> print(f"{total:.4f} {weight}")  # (1 + 3) + 6 over two sequences
      10.0000 2.0

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss``.
    """
    return _lookup("aggregation", name)
