#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k stare`.
# Tests that need Docker, vLLM or Ray skip with a reason when the component is missing, and fail
# instead when CI=true. `.ci/run` provisions a Docker engine first (scripts/provision_docker.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
"$PY" -m ruff check .
exec "$PY" -m pytest "$@"
