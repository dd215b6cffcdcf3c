#!/usr/bin/env bash
# Set up (idempotent) and run the default job: SmolLM2-135M-Instruct learns to use the sandboxed Python tool
# on ArithmeticTIR with STARE (`stare-agents train --recipe smollm2-arith`), on this machine's CPU, offline.
#
# As root on a Debian/Ubuntu host this also provisions Docker and the sandbox image (as scripts/test.sh
# does); elsewhere, or with STARE_PROVISION_DOCKER=0, Docker's engine and the image must already be there.
# The sandbox fails closed: without them the job refuses to start and says what is missing (model-written
# code runs on the host only when asked for: rollout.sandbox=local with STARE_ALLOW_LOCAL_SANDBOX=1).
#
# The run folder is runs/smollm2-arith (override with --out DIR). Running this again continues an
# interrupted run from its last checkpoint, or reprints the summary of a finished one. Extra arguments go
# to `stare-agents train`, e.g. `bash scripts/run.sh --compare grpo-ds` or `bash scripts/run.sh rl.steps=4`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh | tail -n 1)"
if [ "${STARE_PROVISION_DOCKER:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  STARE_AGENTS="$(dirname "$PY")/stare-agents" bash scripts/provision_docker.sh \
    || echo "[run] Docker could not be provisioned: the job refuses to start without it (the sandbox fails" \
      "closed; \`stare-agents sandbox doctor\` says what is missing)" >&2
fi
exec "$PY" -m stare_agents.cli train --recipe smollm2-arith --resume "$@"
