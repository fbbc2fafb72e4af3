"""NCCLPush's HTTP choreography and chunked broadcast, with a recording NCCL library and
vLLM fakes. No GPU here: the real `CtypesNCCL` broadcast is not exercised."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from nccl_fakes import RecordingNCCL
from rollout_engine import tiny_pretrained
from rollout_fakes import FakeVLLM

from dew.rollout import EngineHTTPError, NCCLLibrary, NCCLPush, Publication, PushFailed

NCCL_SEQUENCE_HEAD = [
    "/get_world_size", "/init_weight_transfer_engine", "/pause", "/start_weight_update",
]  # fmt: skip
NCCL_SEQUENCE_TAIL = [
    "/finish_weight_update", "/reset_prefix_cache", "/update_weight_version", "/resume",
]  # fmt: skip


@pytest.fixture
def replicas():
    engines = [FakeVLLM(world_size=2), FakeVLLM(world_size=1)]
    yield engines
    for engine in engines:
        engine.close()


def test_push_choreography_and_chunks(pretrained, replicas):
    other = tiny_pretrained(seed=8)
    library = RecordingNCCL()
    assert isinstance(library, NCCLLibrary)
    exported = list(other.export("bfloat16"))
    largest = max(a.nbytes for _, a in exported)
    chunk_bytes = 40_000
    push = NCCLPush(pretrained, [e.url for e in replicas], library, chunk_bytes=chunk_bytes)
    publication = Publication(push, version=0)
    publication.load(other.variables, 1)
    assert publication.version == 1
    for engine, world in zip(replicas, (3, 2)):
        paths = engine.paths()
        updates = paths.count("/update_weights")
        assert updates >= 3  # several chunks, so the in-flight bound means something
        assert paths == NCCL_SEQUENCE_HEAD + ["/update_weights"] * updates + NCCL_SEQUENCE_TAIL
        init = engine.calls[1][2]["init_info"]
        assert init == {
            "nccl_unique_id_b64": base64.b64encode(bytes(range(128))).decode(), "rank_offset": 1,
            "world_size": world, "packed": False,
        }  # fmt: skip
        assert engine.calls[0][1] == {"include_dp": "false"}
        assert engine.calls[2][1] == {"mode": "wait"} and engine.version == "1"
        names = [n for info in engine.update_infos for n in info["names"]]
        assert names == [name for name, _ in exported]
        dtypes = {d for info in engine.update_infos for d in info["dtype_names"]}
        assert dtypes == {"bfloat16"}
        shapes = [s for info in engine.update_infos for s in info["shapes"]]
        assert shapes == [list(a.shape) for _, a in exported]
        for info in engine.update_infos:
            size = sum(int(np.prod(s)) * 2 for s in info["shapes"])
            assert size <= chunk_bytes or len(info["names"]) == 1
    joins = [e for e in library.events if e[0] == "join"]
    assert [(e[1], e[3]) for e in joins] == [(3, 0), (2, 0)]
    assert [e[1] for e in library.events if e[0] == "warm_up"] == ["comm1", "comm2"]
    for comm in ("comm1", "comm2"):
        sent = library.sent[comm]
        assert len(sent) == len(exported)
        for array, (_, want) in zip(sent, exported):
            np.testing.assert_array_equal(array.view(np.uint16), want.view(np.uint16))
    # at most two chunks (or two of the largest tensor) on the device at once
    assert library.peak_bytes <= 2 * max(chunk_bytes, largest)
    assert library.live_bytes == 0
    # a second push reuses the groups
    publication.load(pretrained.variables, 2)
    assert len([e for e in library.events if e[0] == "join"]) == 2
    assert replicas[0].paths().count("/init_weight_transfer_engine") == 1
    push.close()
    assert [e[1] for e in library.events if e[0] == "abort"] == ["comm1", "comm2"]


def test_a_failed_update_aborts_the_groups_and_keeps_the_version(pretrained, replicas):
    library = RecordingNCCL()
    push = NCCLPush(pretrained, [e.url for e in replicas], library, chunk_bytes=40_000)
    publication = Publication(push, version=5)
    replicas[1].fail("/update_weights", "500")
    with pytest.raises(PushFailed, match="push of version 6 failed") as caught:
        publication.load(pretrained.variables, 6)
    (failure,) = caught.value.failures.values()
    assert isinstance(failure, EngineHTTPError) and "HTTP 500" in str(failure)
    assert publication.version == 5 and library.live_bytes == 0
    assert sorted(e[1] for e in library.events if e[0] == "abort") == ["comm1", "comm2"]
    assert "/resume" not in replicas[1].paths()
    # the next push opens fresh groups and succeeds
    replicas[1].heal()
    publication.load(pretrained.variables, 7)
    assert publication.version == 7
    assert replicas[1].paths().count("/init_weight_transfer_engine") == 2
    push.close()


def test_reset_refusal_fails_the_push(pretrained, replicas):
    push = NCCLPush(pretrained, [replicas[0].url], RecordingNCCL())
    publication = Publication(push, version=0)
    replicas[0].fail("/reset_prefix_cache", "success_false")
    with pytest.raises(PushFailed, match="answered success=False"):
        publication.load(pretrained.variables, 1)
    assert publication.version == 0
    push.close()


def test_bad_arguments(pretrained):
    with pytest.raises(ValueError, match="chunk_bytes: expected a positive int, got 0"):
        NCCLPush(pretrained, ["http://127.0.0.1:1"], RecordingNCCL(), chunk_bytes=0)
    with pytest.raises(TypeError, match="pretrained: expected a Pretrained, got NoneType"):
        NCCLPush(None, ["http://127.0.0.1:1"], RecordingNCCL())
