#!/usr/bin/env bash
# The README's test command: set everything up, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh smollm2-135m gemma3-270m qwen2.5-coder-0.5b
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING="${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
