#!/usr/bin/env bash
# The README's main command: set everything up, then run a real heterogeneous
# speculative-decoding batch job (defaults: SmolLM2-135M drafting for Qwen2.5-Coder-1.5B,
# plain and speculative decoding alternating over 2 rounds; see harness/hetero_harness/main_job.py).
# Extra arguments go to `python -m hetero_harness` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
echo "[hetero] set-up: venv, vLLM, this package, the two models (first run on a machine: minutes of installs and conversions; afterwards: seconds)"
scripts/setup.sh smollm2-135m qwen2.5-coder-1.5b
echo "[hetero] set-up done in $((SECONDS - start)) s"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m hetero_harness "$@"
