#!/usr/bin/env bash
# Set up (idempotent) and run the lint and the test suite. Extra arguments go to pytest,
# e.g. `bash scripts/test.sh -k stare`.
#
# The sandbox tests need a Docker engine and the sandbox image. Run as root on a Debian/Ubuntu host,
# this script provisions both (scripts/provision_docker.sh: installs docker.io, starts dockerd, builds
# the image offline); set STARE_PROVISION_DOCKER=0 to leave Docker alone. Tests whose component
# (Docker, vLLM, Ray) is missing skip with the reason, or fail when CI=true.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
if [ "${STARE_PROVISION_DOCKER:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  STARE_AGENTS="$(dirname "$PY")/stare-agents" bash scripts/provision_docker.sh
fi
# headless Chromium for the viewer tests (Debian's chromium; STARE_PROVISION_BROWSER=0 leaves it alone)
if [ "${STARE_PROVISION_BROWSER:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/provision_browser.sh
fi
"$PY" -m ruff check .
# --durations=25: the 25 slowest by wall time, and (tests/cost_ratchet.py) the 25 costliest by CPU.
# Two workers, a test file each at a time (tests/conftest.py); `-n 0` after the command runs it in one process.
exec "$PY" -m pytest --durations=25 -n "${STARE_TEST_WORKERS:-2}" --dist loadfile "$@"
