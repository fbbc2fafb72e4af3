"""The Server's parts outside its scheduling loop: a request's record and its completion,
and the served weights (cast, then fused). ``test_server.py`` runs the whole server."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.inference import Completion
from dew.inference._served_weights import served_variables
from dew.inference.requests import Request
from dew.inference.server import _key_data_for
from dew.models import load_pretrained
from dew.models.serving import fuse

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "models"


def request() -> Request:
    key = np.zeros(2, np.uint32)
    return Request(4, np.array([5, 6], np.int32), 3, key, submitted_version=2, callback=None)


def test_request_records_draws_and_completes() -> None:
    r = request()
    r.record(np.int32(9), np.float32(-0.5), -0.25, np.array([9, 1]), 2)
    r.record(11, -1.5, -1.25, np.array([11, 3]), 3)
    done = r.completion("eos", 2)
    assert isinstance(done, Completion) and done.eos and done.error is None
    assert done.request_id == 4 and done.submitted_version == 2
    np.testing.assert_array_equal(done.prompt_ids, [5, 6])
    assert done.ids.tolist() == [9, 11] and done.ids.dtype == np.int32
    assert done.raw_log_probs.tolist() == [-0.5, -1.5] and done.raw_log_probs.dtype == np.float32
    assert done.behavior_log_probs.tolist() == [-0.25, -1.25]
    assert done.versions.tolist() == [2, 3] and done.versions.dtype == np.int64
    assert done.support is not None and done.support.dtype == np.int32
    np.testing.assert_array_equal(done.support, [[9, 1], [11, 3]])


def test_completion_support_edges_and_error() -> None:
    nothing = request().completion("cancelled", 3)
    assert nothing.ids.shape == (0,) and nothing.support is not None
    assert nothing.support.shape == (0, 3) and nothing.support.dtype == np.int32
    error = RuntimeError("boom")
    r = request()
    r.record(1, 0.0, 0.0, None, 0)
    failed = r.completion("error", 0, error)
    assert failed.support is None and failed.error is error and failed.finish_reason == "error"


@pytest.fixture(scope="module")
def pretrained():
    return load_pretrained(FIXTURES / "qwen3_tied")


def test_served_variables_cast_floats_then_fuse(pretrained) -> None:
    config = pretrained.model.config
    served = served_variables(pretrained.variables, jnp.bfloat16, config)
    want = fuse(jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), dict(pretrained.variables)),
                config)  # fmt: skip
    assert jax.tree.structure(served) == jax.tree.structure(want)
    for got, expected in zip(jax.tree.leaves(served), jax.tree.leaves(want)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


def test_served_variables_errors_name_the_field(pretrained) -> None:
    config = pretrained.model.config
    with pytest.raises(
        ValueError, match="variables: expected a mapping with a 'params' collection"
    ):
        served_variables({"weights": {}}, jnp.float32, config)
    with pytest.raises(ValueError, match="variables: not a tree of this model's parameters"):
        served_variables({"params": {"other": jnp.zeros(3)}}, jnp.float32, config)


@pytest.mark.parametrize(
    ("seed", "request_id", "fold"),
    [(0, 5, True), (123, 0, False), (2**31 - 1, 9, True), (2**40 + 3, 7, True), (-5, 2, True)],
)
def test_request_key_data_is_the_seed_folded_with_the_request_id(seed, request_id, fold) -> None:
    # The compiled fast path (int32 seeds) and the general one give what jax.random gives.
    base = jax.random.key(seed)
    want = jax.random.key_data(jax.random.fold_in(base, request_id) if fold else base)
    got = _key_data_for(seed, request_id, fold)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, np.asarray(want))
