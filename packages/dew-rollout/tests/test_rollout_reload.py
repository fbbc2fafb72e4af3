"""SafetensorsReload and Publication against vLLM and SGLang fakes: the exact call
sequences, the written checkpoint, and every fault leaving the version where it was."""

from __future__ import annotations

import time

import jax
import ml_dtypes
import numpy as np
import pytest
from rollout_engine import tiny_pretrained
from rollout_fakes import FakeSGLang, FakeVLLM

from dew.models import load_pretrained
from dew.rollout import (
    EngineHTTPError,
    EngineRefused,
    EngineTimeout,
    MalformedResponse,
    Publication,
    PushFailed,
    SafetensorsReload,
)

VLLM_SEQUENCE = [
    "/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume",
]  # fmt: skip


@pytest.fixture(scope="module")
def other():
    return tiny_pretrained(seed=3)


@pytest.fixture
def replicas():
    engines = [FakeVLLM(), FakeVLLM()]
    yield engines
    for engine in engines:
        engine.close()


def bf16(tree):
    return jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float32), tree)


def test_vllm_push_sequence_and_checkpoint(pretrained, other, replicas, tmp_path):
    stamps: list[int] = []
    reload = SafetensorsReload(pretrained, tmp_path / "policy", [e.url for e in replicas])
    reload.write()
    publication = Publication(reload, version=0, stamp=stamps.append)
    assert stamps == [0] and publication.version == 0
    publication.load(other.variables, 3)
    assert publication.version == 3 and stamps == [0, 3]
    for engine in replicas:
        assert engine.paths() == VLLM_SEQUENCE
        pause, rpc, _, version, _ = engine.calls
        assert pause[1] == {"mode": "wait"}
        assert rpc[2] == {"method": "reload_weights"}
        assert version[2] == {"new_version": "3"}
        assert engine.version == "3" and not engine.paused
    loaded = load_pretrained(tmp_path / "policy")
    for got, want in zip(jax.tree.leaves(loaded.variables), jax.tree.leaves(bf16(other.variables))):
        np.testing.assert_array_equal(got, want)
    assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no staging left behind


@pytest.mark.parametrize(
    ("path", "fault", "error", "message"),
    [
        ("/reset_prefix_cache", "success_false", EngineRefused, "answered success=False"),
        ("/collective_rpc", "500", EngineHTTPError, "HTTP 500"),
        ("/reset_prefix_cache", "malformed", MalformedResponse, "expected a JSON body"),
        ("/pause", "timeout", EngineTimeout, "no answer in time"),
        ("/update_weight_version", "500", EngineHTTPError, "HTTP 500"),
    ],
)
def test_vllm_faults_fail_the_push_and_keep_the_version(
    pretrained, other, replicas, tmp_path, path, fault, error, message
):
    stamps: list[int] = []
    reload = SafetensorsReload(
        pretrained, tmp_path / "policy", [e.url for e in replicas], timeout=0.5
    )
    publication = Publication(reload, version=1, stamp=stamps.append)
    replicas[1].fail(path, fault, delay=3.0)
    start = time.monotonic()
    with pytest.raises(PushFailed, match="push of version 2 failed on 1 replica") as caught:
        publication.load(other.variables, 2)
    assert time.monotonic() - start < 10
    (failure,) = caught.value.failures.values()
    assert isinstance(failure, error) and message in str(failure)
    assert list(caught.value.failures) == [replicas[1].url]
    assert publication.version == 1 and stamps == [1]
    time.sleep(3.2 if fault == "timeout" else 0)  # let the slow answer land first
    # the failing replica stays paused; the healthy one finished its sequence
    assert "/resume" not in replicas[1].paths() and replicas[1].paused
    assert replicas[0].paths() == VLLM_SEQUENCE
    # the next successful push resumes it and moves the version
    replicas[1].heal()
    publication.load(other.variables, 4)
    assert publication.version == 4 and stamps == [1, 4] and not replicas[1].paused


def test_a_slow_pause_is_waited_for(pretrained, other, tmp_path):
    engine = FakeVLLM()
    try:
        engine.fail("/pause", "slow", delay=1.0)  # in-flight requests finishing
        publication = Publication(SafetensorsReload(pretrained, tmp_path / "p", [engine.url]))
        start = time.monotonic()
        publication.load(other.variables, 1)
        assert time.monotonic() - start >= 1.0
        assert publication.version == 1 and engine.paths() == VLLM_SEQUENCE
    finally:
        engine.close()


def test_sglang_push(pretrained, other, tmp_path):
    engine = FakeSGLang()
    try:
        reload = SafetensorsReload(pretrained, tmp_path / "policy", [engine.url], engine="sglang")
        publication = Publication(reload, version=0)
        publication.load(other.variables, 7)
        assert engine.paths() == ["/update_weights_from_disk"]
        assert engine.loads == [{
            "model_path": str(tmp_path / "policy"), "flush_cache": True,
            "abort_all_requests": False, "weight_version": "7",
        }]  # fmt: skip
        assert publication.version == 7
        for fault, message in (("400", "success=False injected failure"),
                               ("success_false", "success=False")):  # fmt: skip
            engine.fail("/update_weights_from_disk", fault)
            with pytest.raises(PushFailed) as caught:
                publication.load(other.variables, 8)
            (failure,) = caught.value.failures.values()
            assert isinstance(failure, EngineRefused) and message in str(failure)
            assert publication.version == 7
    finally:
        engine.close()


def test_a_failed_stamp_keeps_the_version(pretrained, other, replicas, tmp_path):
    def stamp(version):
        if version == 2:
            raise EngineHTTPError("HTTP 503: 'gateway down'", "http://gateway/admin", 503)

    publication = Publication(
        SafetensorsReload(pretrained, tmp_path / "p", [replicas[0].url]), version=1, stamp=stamp
    )
    with pytest.raises(PushFailed, match="gateway down"):
        publication.load(other.variables, 2)
    assert publication.version == 1


def test_bad_arguments_are_named(pretrained, tmp_path):
    with pytest.raises(ValueError, match="engine: expected one of .* got 'tgi'"):
        SafetensorsReload(pretrained, tmp_path, ["http://127.0.0.1:1"], engine="tgi")
    with pytest.raises(ValueError, match="engines: expected a non-empty list of root URLs"):
        SafetensorsReload(pretrained, tmp_path, "http://127.0.0.1:1")
    with pytest.raises(
        ValueError, match="engines: expected http\\(s\\) root URLs, got '127.0.0.1'"
    ):
        SafetensorsReload(pretrained, tmp_path, ["127.0.0.1"])
    with pytest.raises(TypeError, match="pretrained: expected a Pretrained, got dict"):
        SafetensorsReload({}, tmp_path, ["http://127.0.0.1:1"])
    with pytest.raises(TypeError, match="push: expected a callable"):
        Publication(3)
    with pytest.raises(TypeError, match="version: expected an int, got float"):
        Publication(lambda v, n: None, version=1.0)
