"""The rollout servers refuse a canvas generator: it fills a masked canvas and records no
per-token autoregressive likelihoods, which every draw must carry."""

from __future__ import annotations

import pytest

from dew.inference.canvas import Canvas, NotAutoregressive
from dew.rollout import NativeRolloutServer, OpenAIRolloutServer, VLLMGenerateServer

CANVAS = Canvas(mask_id=11, real_tokens=11, steps=4)
MESSAGE = "gives no per-token autoregressive likelihoods"


def test_native_server_refuses_a_canvas() -> None:
    with pytest.raises(NotAutoregressive, match=f"server: NativeRolloutServer needs .*{MESSAGE}"):
        NativeRolloutServer(CANVAS)  # type: ignore[arg-type]


def test_http_servers_refuse_a_canvas_as_sampling() -> None:
    with pytest.raises(NotAutoregressive, match=f"sampling: OpenAIRolloutServer needs .*{MESSAGE}"):
        OpenAIRolloutServer(object(), CANVAS)  # type: ignore[arg-type]
    with pytest.raises(NotAutoregressive, match=f"sampling: VLLMGenerateServer needs .*{MESSAGE}"):
        VLLMGenerateServer("http://127.0.0.1:1", CANVAS)  # type: ignore[arg-type]
