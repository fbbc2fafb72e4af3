#!/usr/bin/env bash
# Build (once) the isolated CPU virtualenv the fixture recorders in tools/ run in:
# torch 2.13.0 CPU from pip's local find-links folder, verl 0.9.1 (no deps, plus the
# few packages its loss modules import, and what its agent loop imports: hydra-core, pillow,
# cachetools, fastapi, uvicorn), TRL 1.16.0, PEFT 0.21.2 (tools/parity_lora.py) and transformers.
# None of these is a dependency of any Dew distribution.
# Usage: tools/reference_env.sh  -> prints the venv's python path on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${DEW_REFERENCE_ENV:-$here/.envs/reference}"
links="$(python3 -m pip config get global.find-links 2>/dev/null || echo /opt/wheels)"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    uv venv --quiet --python 3.11 "$venv"
    uv pip install --quiet --compile-bytecode --python "$venv/bin/python" --find-links "$links" \
        'torch==2.13.0' packaging numpy omegaconf codetiming orjson ray 'tensordict==0.10.0' \
        'transformers>=5.5.3,!=5.6.0,<5.11' 'trl==1.16.0' 'peft==0.21.2' safetensors tokenizers \
        hydra-core pillow cachetools fastapi uvicorn
    uv pip install --quiet --compile-bytecode --python "$venv/bin/python" --no-deps 'verl==0.9.1'
    touch "$venv/.complete"
fi
if ! "$venv/bin/python" -c "import peft, sys; sys.exit(peft.__version__ != '0.21.2')" 2>/dev/null; then
    # a virtualenv built before the PEFT pin: add PEFT alone, torch held at the CPU build
    uv pip install --quiet --compile-bytecode --python "$venv/bin/python" --find-links "$links" \
        'peft==0.21.2' 'torch==2.13.0'
fi
echo "$venv/bin/python"
