#!/usr/bin/env bash
# Set up (idempotent) and run the default job. Extra arguments go to `stare-agents demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
exec "$PY" -m stare_agents.cli demo "$@"
