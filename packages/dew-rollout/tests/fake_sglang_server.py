"""A stand-in for `python -m sglang.launch_server`, launched by the tests in its place.

SGLang cannot be installed here, so `test_rollout_engines.py` points `launch.python` at
a wrapper that runs this file with the arguments `dew.rollout.launch.engine_command`
built. It parses them as SGLang does (flags named after the `ServerArgs` fields of
`python/sglang/srt/server_args.py`: `--model-path`, `--served-model-name`,
`--skip-tokenizer-init`, `--dtype`, `--context-length`, `--host`, `--port`; an unknown
flag exits with status 2, as argparse does there), and serves `rollout_fakes.FakeSGLang`
(its completions route and `/update_weights_from_disk`, the `update_weights_from_disk`
function of `python/sglang/srt/entrypoints/http_server.py`) on that port, plus:

* `GET /health`: 503 for the first half second, then 200, as `health_generate` in the
  same file answers 503 while the server status is `Starting`;
* `GET /v1/models`: the served name, as SGLang's OpenAI-compatible model list;
* `/update_weights_from_disk` answers 400 with `success: false` when `model_path` is not
  the directory it was launched on (SGLang would load a different checkpoint);
* `GET /fake/state`: the parsed arguments and every load's body, for the test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_fakes import FakeSGLang  # noqa: E402

STARTUP = 0.5


def parse(argv: list[str]) -> argparse.Namespace:
    if argv[:2] != ["-m", "sglang.launch_server"]:
        raise SystemExit(f"expected -m sglang.launch_server, got {argv[:2]}")
    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    parser.add_argument("--model-path", "--model", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float",
                                            "float32"], default="auto")  # fmt: skip
    parser.add_argument("--context-length", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    return parser.parse_args(argv[2:])


def main(argv: list[str]) -> None:
    args = parse(argv)
    engine = FakeSGLang(port=args.port)
    started = time.monotonic()
    load = engine.update_weights_from_disk

    def health(body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        return (200, b"") if time.monotonic() - started > STARTUP else (503, b"")

    def update(body: dict[str, Any], query: dict[str, str]) -> tuple[int, Any]:
        if body.get("model_path") != args.model_path:
            message = f"model_path {body.get('model_path')!r} is not the launch checkpoint"
            return 400, {"success": False, "message": message, "num_paused_requests": 0}
        return load(body, query)

    engine.routes.update({
        "/health": health,
        "/v1/models": lambda b, q: (200, {"object": "list", "data": [
            {"id": args.served_model_name or args.model_path, "object": "model"}]}),
        "/update_weights_from_disk": update,
        "/fake/state": lambda b, q: (200, {"args": vars(args), "loads": engine.loads}),
    })  # fmt: skip
    print(f"fake sglang serving {args.model_path} on {args.host}:{args.port}", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1:])
