#!/usr/bin/env bash
# The README's main command: set everything up, then run a real heterogeneous
# speculative-decoding batch job (defaults: SmolLM2-135M drafting for Qwen2.5-Coder-1.5B).
# Extra arguments go to `python -m hetero_harness` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh smollm2-135m qwen2.5-coder-1.5b
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
export TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m hetero_harness "$@"
