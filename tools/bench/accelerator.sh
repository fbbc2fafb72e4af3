#!/usr/bin/env bash
# The SFT and generation benches at the Qwen3-0.6B shape in bfloat16 on one CUDA card, Dew (JAX's
# cuda platform) against a plain torch loop, TRL's SFTTrainer and transformers' generate (torch's
# cuda device) in the same interleaved rounds; tokens/s and MFU against --peak-tflops.
#
#   tools/bench/accelerator.sh [PEAK_TFLOPS]     (default 989: dense bf16 of an H100/H200 SXM)
#
# Runs with the machine's own python3 (it must import jax with a cuda plugin, torch with cuda,
# transformers, flax, optax, orbax-checkpoint); Dew is imported from packages/*/src. TRL and
# datasets, when the image lacks them, come from wheels in .whl/ (pip download them on a machine
# with an index: trl, datasets, dill, multiprocess). Records: tools/bench/results/sft_cuda.json
# and generation_cuda.json, copied to $OUT when that is set.
set -euo pipefail
cd "$(dirname "$0")/../.."
peak="${1:-989}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/dew-bench-site .whl/*.whl
    export PYTHONPATH="/tmp/dew-bench-site:${PYTHONPATH:-}"
fi
# DEW_BENCH_PACKAGES: another packages/ folder to import Dew from (e.g. one revision's git archive)
src=$(ls -d "$(realpath "${DEW_BENCH_PACKAGES:-packages}")"/*/src | tr '\n' ':')
export PYTHONPATH="${src}${PYTHONPATH:-}" PYTHONUNBUFFERED=1
DEW_REFERENCE_PYTHON="$(command -v python3)"
export DEW_REFERENCE_PYTHON
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
python3 tools/bench/bench_sft.py --device cuda --shape qwen3-0.6b --dtype bfloat16 \
    --batch 8 --seq 1024 --rounds 3 --steps 4 --peak-tflops "$peak"
python3 tools/bench/bench_generation.py --device cuda --shape qwen3-0.6b --dtype bfloat16 \
    --rounds 3 --repeats 2 --new-tokens 64 --no-compiles --peak-tflops "$peak"
if [ -n "${OUT:-}" ]; then
    cp tools/bench/results/sft_cuda.json tools/bench/results/generation_cuda.json "$OUT"/
fi
