#!/usr/bin/env bash
# The README's test command: set everything up, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh smollm2-135m gemma3-270m qwen2.5-coder-0.5b
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export TOKENIZERS_PARALLELISM=false
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
# The whole suite in two passes: the tests that start no engine on both cores
# (pytest-xdist), then the e2e modules, two at a time (pytest-xdist, the groups and order
# of tests/conftest.py), their engines sharing the cores through leases
# (harness/hetero_harness/cores.py): never two engines on one core.
# Both passes always run; the exit status is the first failure's.
# Each pass ends with its slowest steps (--durations) and its seconds per module
# (tests/conftest.py), in CI's log too.
status=0
"${pytest[@]}" -m "not e2e" -n 2 --durations=15 || status=$?
"${pytest[@]}" -m e2e -n 2 --dist loadgroup --no-loadscope-reorder --durations=25 || { s=$?; [ "$status" -ne 0 ] || status=$s; }
exit "$status"
