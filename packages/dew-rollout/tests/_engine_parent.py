"""A parent that launches a never-ready fake engine through `launch_engine` and waits.

Run as `python _engine_parent.py PYTHON DIRECTORY RUN_DIR`; the test SIGKILLs it while
`launch_engine` waits for the engine and then checks that the engine did not survive.
"""

from __future__ import annotations

import contextlib
import sys

from dew.rollout import launch_engine

if __name__ == "__main__":
    python, directory, run_dir = sys.argv[1:4]
    with contextlib.ExitStack() as stack:
        launch_engine("vllm", directory, run_dir=run_dir, stack=stack, max_model_len=64,
                      launch={"python": python, "ready_timeout": 600})  # fmt: skip
