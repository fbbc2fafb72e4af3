#!/usr/bin/env bash
# The SFT and generation benches at the Qwen3-0.6B shape in bfloat16 on one CUDA card, Dew (JAX's
# cuda platform) against a plain torch loop, TRL's SFTTrainer and transformers' generate (torch's
# cuda device) in the same interleaved rounds; tokens/s and MFU against --peak-tflops.
#
#   tools/bench/accelerator.sh [PEAK_TFLOPS [BENCH...]]
#
# PEAK_TFLOPS defaults to 989 (dense bf16 of an H100/H200 SXM); BENCH is any of sft, generation
# and first_step (default: all three). first_step times `dew train lm --steps 1` processes at the
# same shape (a checkpoint written first): a warm compilation cache, and --scan-layers cold/warm.
#
# Runs with the machine's own python3 (it must import jax with a cuda plugin, torch with cuda,
# transformers, flax, optax, orbax-checkpoint); Dew is imported from packages/*/src. TRL and
# datasets, when the image lacks them, come from wheels in .whl/ (pip download them on a machine
# with an index: trl, datasets, dill, multiprocess). Records: tools/bench/results/sft_cuda.json
# generation_cuda.json and first_step_cuda.json, copied to $OUT when that is set.
set -euo pipefail
cd "$(dirname "$0")/../.."
peak="${1:-989}"
benches="${*:2}"
benches="${benches:-sft generation first_step}"
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
for bench in $benches; do
    case "$bench" in
    sft)
        python3 tools/bench/bench_sft.py --device cuda --shape qwen3-0.6b --dtype bfloat16 \
            --batch 8 --seq 1024 --rounds 3 --steps 4 --peak-tflops "$peak" ;;
    generation)
        python3 tools/bench/bench_generation.py --device cuda --shape qwen3-0.6b \
            --dtype bfloat16 --rounds 3 --repeats 2 --new-tokens 64 --no-compiles \
            --peak-tflops "$peak" ;;
    first_step)
        python3 - <<'PY'
import sys
sys.path.insert(0, "tools/bench")
from _shapes import SHAPES
from transformers import Qwen3Config, Qwen3ForCausalLM
config = Qwen3Config(**SHAPES["qwen3-0.6b"], tie_word_embeddings=True, max_position_embeddings=4096)
Qwen3ForCausalLM(config).save_pretrained("/tmp/dew-bench-qwen3-0.6b")
PY
        python3 tools/bench/bench_first_step.py --device cuda --rounds 3 --batch 4 --seq-len 512 \
            --model-args "--pretrained /tmp/dew-bench-qwen3-0.6b --dtype bfloat16" \
            --contenders "warm,cold scan,warm scan" ;;
    *) echo "accelerator.sh: unknown bench '$bench' (expected sft, generation, first_step)" >&2
       exit 2 ;;
    esac
    if [ -n "${OUT:-}" ]; then
        cp "tools/bench/results/${bench}_cuda.json" "$OUT"/
    fi
done
