"""Reductions of per-token terms: verl's ``agg_loss`` modes, masked means, per-chain means."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dew.rl._checks import require_float, require_rank, require_same_shape, require_segments
from dew.rl._masking import (
    at_least_float32,
    count_dtype_for,
    count_kept,
    divide,
    eps_denominator,
    exact_mean,
    keep_of,
    mean_with_eps,
    pooled_mean,
    select,
    sequence_totals,
    token_keep,
)


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Average ``x`` over every position ``mask`` keeps, across the whole batch.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="token-mean")`` (single data-parallel
    rank): the masked sum divided by the exact number of kept tokens, with no 1e-8 added
    (that belongs to :func:`masked_mean`; the two are kept apart as in verl and Tunix).

    Args:
      x: ``[B, T]`` (any shape) floating values.
      mask: same shape as ``x``; non-zero keeps a position.

    Returns:
      A scalar in ``x``'s dtype. Positions outside the mask never reach it, nan included.
      When the mask keeps nothing the result is 0/0 = nan, on purpose: an empty batch is a
      bug upstream and should show.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 2.0, jnp.nan], [3.0, 4.0, 5.0]])
      >>> mask = jnp.array([[1, 1, 0], [1, 0, 0]])  # the nan is padding
      >>> print(rl.token_mean(x, mask))
      2.0

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss`` (``"token-mean"``).
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    return exact_mean(x, keep_of(mask))


def masked_mean(
    x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None
) -> jax.Array:
    """Mean of ``x`` over the positions ``mask`` keeps, along ``axis`` (all axes by default).

    Port of verl 0.9.1 ``verl.utils.torch_functional.masked_mean`` (through its
    ``masked_sum``): dropped positions are replaced by zero with ``jnp.where`` (a multiply
    by a zero mask would keep a nan), and the sum is divided by ``count + 1e-8``. As in
    torch, that 1e-8 is added in float32 for a boolean or integer mask and in the mask's
    dtype for a floating mask, so with a boolean mask it only matters when nothing is kept,
    where the mean is 0 instead of nan.

    Args:
      x: floating values of any shape, e.g. ``[B, T]``.
      mask: same shape as ``x``; non-zero keeps a position.
      axis: axes to reduce, None for all.

    Returns:
      ``x`` reduced over ``axis``. The dtype is torch's for verl's expression: ``x``'s,
      except that half-precision ``x`` with a boolean, integer or float32 mask gives
      float32 (the count's dtype wins the promotion).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
      >>> mask = jnp.array([[True, True, False], [False, False, False]])
      >>> print(rl.masked_mean(x, mask, axis=-1))  # a row keeping nothing gives 0
      [1.5 0. ]

    References:
      verl 0.9.1, ``verl/utils/torch_functional.py``, ``masked_mean``.
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    return mean_with_eps(x, mask, axis)


def _check_rows(x: jax.Array, mask: jax.Array, segments: jax.Array | None) -> None:
    """Raise unless ``x`` is ``[B, T]`` floats with a matching mask and optional segments."""
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    if segments is not None:
        require_segments(segments, "x", x)


def sequence_mean(x: jax.Array, mask: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """Average over sequences of each sequence's own token mean.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-mean")`` (one data-parallel
    rank): each sequence's masked sum is divided by its kept count + 1e-8 (added in float32
    for boolean/integer masks, as torch does), and those means are averaged over the
    sequences that keep at least one token. Sequences with nothing kept are left out of
    the average instead of counting as zero. No kept token anywhere gives 0/0 = nan.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: optional ``[B, T]`` integer chain ids (0 = padding) when rows are packed;
        then each chain is a sequence (see :func:`segment_mean`).

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 3.0, 0.0, 0.0], [6.0, 0.0, 0.0, 0.0]])
      >>> mask = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0]])
      >>> print(f"{rl.sequence_mean(x, mask):.4f}")  # (2 + 6) / 2
      4.0000
      >>> packed = jnp.array([[1.0, 3.0, 6.0, 0.0]])  # the same two sequences in one row
      >>> segments = jnp.array([[1, 1, 2, 0]])
      >>> print(f"{rl.sequence_mean(packed, segments > 0, segments):.4f}")
      4.0000

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss``
      (``"seq-mean-token-mean"``).
    """
    _check_rows(x, mask, segments)
    keep = token_keep(keep_of(mask), segments)
    totals, _ = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    wide = at_least_float32(x.dtype)
    per_sequence = divide(totals, eps_denominator(counts, mask), wide)
    present = counts > 0
    return divide(jnp.sum(select(per_sequence, present)), count_kept(present), wide)


def sequence_sum_mean(
    x: jax.Array, mask: jax.Array, segments: jax.Array | None = None
) -> jax.Array:
    """Average over sequences of each sequence's masked sum.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-sum")`` (one data-parallel
    rank): per-sequence sums of the kept positions, averaged over the sequences that keep
    at least one token. No kept token anywhere gives 0/0 = nan.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: optional ``[B, T]`` integer chain ids (0 = padding); each chain is then a
        sequence (see :func:`segment_mean`).

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 3.0, 0.0], [6.0, 0.0, 0.0]])
      >>> mask = jnp.array([[1, 1, 0], [1, 0, 0]])
      >>> print(rl.sequence_sum_mean(x, mask))  # (4 + 6) / 2
      5.0

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss``
      (``"seq-mean-token-sum"``).
    """
    _check_rows(x, mask, segments)
    return _summed_sequences(x, keep_of(mask), segments)


def sequence_sum_norm(
    x: jax.Array,
    mask: jax.Array,
    norm: float | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """:func:`sequence_sum_mean` divided by a constant, Dr.GRPO's length-free reduction.

    Port of verl 0.9.1 ``agg_loss(loss_agg_mode="seq-mean-token-sum-norm")`` (one
    data-parallel rank): the mean over non-empty sequences of their masked sums, divided by
    ``norm``. ``norm=None`` uses the row width ``T``, verl's default
    (``loss_scale_factor=None``). Pass a fixed number to keep the divisor constant when the
    padded width changes from batch to batch (arXiv:2503.20783).

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      norm: the constant divisor (a Python number or a scalar array), default ``T``.
      segments: optional ``[B, T]`` integer chain ids (0 = padding); each chain is then a
        sequence. The default divisor stays the row width ``T``.

    Returns:
      A scalar in ``x``'s dtype, or float32 for half-precision ``x`` (verl's per-sequence
      statistics are float32 there too).

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 3.0, 0.0, 0.0], [6.0, 0.0, 0.0, 0.0]])
      >>> mask = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0]])
      >>> print(rl.sequence_sum_norm(x, mask))  # (4 + 6) / 2 / T, T = 4
      1.25
      >>> print(rl.sequence_sum_norm(x, mask, norm=10.0))
      0.5

    References:
      Liu et al., `Understanding R1-Zero-Like Training: A Critical Perspective
      <https://arxiv.org/abs/2503.20783>`_, 2025 (Dr.GRPO).

      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss``
      (``"seq-mean-token-sum-norm"``).
    """
    _check_rows(x, mask, segments)
    if norm is None:
        norm = x.shape[-1]
    elif isinstance(norm, int | float) and norm <= 0:
        raise ValueError(f"norm: expected a positive divisor, got {norm}")
    loss = _summed_sequences(x, keep_of(mask), segments)
    return loss / jnp.asarray(norm, dtype=loss.dtype)


def _summed_sequences(x: jax.Array, keep: jax.Array, segments: jax.Array | None) -> jax.Array:
    """Mean over non-empty sequences of their masked sums, in at least float32."""
    keep = token_keep(keep, segments)
    totals, _ = sequence_totals(select(x, keep), segments)
    counts, _ = sequence_totals(keep.astype(count_dtype_for(keep.size)), segments)
    present = counts > 0
    totals = totals.astype(at_least_float32(x.dtype))
    return jnp.sum(select(totals, present)) / count_kept(present).astype(totals.dtype)


def segment_mean(x: jax.Array, mask: jax.Array, segments: jax.Array) -> jax.Array:
    """Each token gets the masked mean of ``x`` over its own chain.

    A packed row holds several sequences ("chains") side by side; ``segments`` gives each
    token its chain id, 0 for padding. A chain is a maximal run of one non-zero id along a
    row (ids only mark boundaries, so row-local or batch-global numbering both work).

    The divisor is the chain's kept count floored at one, the pooling verl 0.9.1
    ``compute_policy_loss_gspo`` applies per row (``mask.sum(-1).clamp(min=1)``), so a
    chain with no kept token, and every padding position, gets 0. With one chain per row
    this equals that per-row pooling exactly.

    Args:
      x: ``[B, T]`` floating values.
      mask: ``[B, T]``; non-zero keeps a position.
      segments: ``[B, T]`` integer chain ids, 0 = padding.

    Returns:
      ``[B, T]`` in ``x``'s dtype; positions outside the mask carry their chain's value.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 3.0, 6.0, 8.0, 9.0]])
      >>> mask = jnp.array([[1, 1, 1, 0, 0]])  # 8.0 is not kept, 9.0 is padding
      >>> segments = jnp.array([[1, 1, 2, 2, 0]])
      >>> print(rl.segment_mean(x, mask, segments))
      [[2. 2. 6. 6. 0.]]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_gspo`` (its
      per-sequence pooling).
    """
    require_float("x", x)
    require_rank("x", x, 2, "[B, T]")
    require_same_shape("mask", mask, "x", x)
    require_segments(segments, "x", x)
    return pooled_mean(x, keep_of(mask), segments)


def group_sums(x: jax.Array, mask: jax.Array, group_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Sum of ``x`` and number of kept positions per group id, wherever the members sit.

    A group is the set of kept positions that share an integer id, as in
    :func:`ragged_group_advantage`: unlike a chain of :func:`segment_mean` its members need
    not be adjacent, nor in one row (a session split over several packed rows, say). The
    ids are ranked inside the function, so it jits with every argument traced and any
    integers serve as ids.

    Args:
      x: floating values of any shape, e.g. ``[B, T]``.
      mask: same shape as ``x``; non-zero keeps a position.
      group_ids: same shape as ``x``, integer group of each position.

    Returns:
      ``(sums, counts)``, each ``[x.size]``: one slot per group in ascending id order,
      preceded by one empty slot when the mask drops any position, and empty slots (sum
      and count 0) after them. ``sums`` is in ``x``'s dtype and adds the kept values of
      a group in position order; ``counts`` is int32. A position outside the mask reaches
      neither, nan included. Divide the two where ``counts > 0`` for per-group means.

    Examples:
      >>> import jax.numpy as jnp
      >>> import dew.rl as rl
      >>> x = jnp.array([[1.0, 2.0, 4.0], [8.0, 16.0, jnp.nan]])
      >>> mask = jnp.array([[1, 1, 1], [1, 1, 0]])  # the nan is padding
      >>> group_ids = jnp.array([[5, 3, 5], [3, 3, 5]])  # group 3 spans both rows
      >>> sums, counts = rl.group_sums(x, mask, group_ids)
      >>> print(sums[:3], counts[:3])  # the dropped position's slot, then groups 3 and 5
      [ 0. 26.  5.] [0 3 2]

    References:
      verl 0.9.1, ``verl/trainer/ppo/core_algos.py``, ``agg_loss``
      (``"seq-mean-token-mean"``, whose sequences this generalises to groups by id).
    """
    require_float("x", x)
    require_same_shape("mask", mask, "x", x)
    require_same_shape("group_ids", group_ids, "x", x)
    if not jnp.issubdtype(jnp.result_type(group_ids), jnp.integer):
        raise TypeError(
            f"group_ids: expected integer group ids, got dtype {jnp.result_type(group_ids)}"
        )
    keep = keep_of(mask)
    ids = jnp.asarray(group_ids)
    # Dropped positions share one id below every real one; they add nothing to its slot.
    dropped = jnp.asarray(jnp.iinfo(ids.dtype).min, ids.dtype)
    flat = jnp.where(keep, ids, dropped).reshape(-1)
    _, slot = jnp.unique(flat, size=flat.size, fill_value=dropped, return_inverse=True)
    slot = slot.reshape(-1)
    sums = jax.ops.segment_sum(select(x, keep).reshape(-1), slot, num_segments=flat.size)
    counts = jax.ops.segment_sum(keep.reshape(-1).astype(jnp.int32), slot, num_segments=flat.size)
    return sums, counts
