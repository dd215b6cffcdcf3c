#!/usr/bin/env bash
# Make a Docker engine, the gVisor runtime and the sandbox image available on this machine. Idempotent;
# run as root:
#
#     bash scripts/provision_docker.sh
#
# 1. installs docker.io, runsc (gVisor), debootstrap, debian-archive-keyring and gpgv (for the offline image
#    build, which checks the archive's signatures) with apt-get if they are missing;
# 2. starts dockerd in the background if no engine answers (data root $STARE_DOCKER_DATA_ROOT, default
#    /var/lib/docker; log $STARE_DOCKERD_LOG, default /var/log/stare-dockerd.log) and waits for `docker info`;
# 3. registers runsc as the engine runtime "runsc" in /etc/docker/daemon.json (merged into what is there;
#    `--platform=ptrace` works without KVM, `--network=none` because sandbox containers have no network and
#    runsc refuses to start in the root network namespace otherwise) and sends SIGHUP to dockerd, which
#    reloads its runtimes without a restart; set STARE_GVISOR=0 to skip this step and the package;
# 4. builds the sandbox image offline (`stare-agents sandbox build --offline`: debootstrap from a Debian
#    mirror, no registry needed) if it is absent.
# Each step is skipped when its result is already there. Exit status is non-zero if any step fails.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA_ROOT="${STARE_DOCKER_DATA_ROOT:-/var/lib/docker}"
LOG="${STARE_DOCKERD_LOG:-/var/log/stare-dockerd.log}"
WAIT_S="${STARE_DOCKERD_WAIT_S:-60}"
GVISOR="${STARE_GVISOR:-1}"
DAEMON_JSON="${STARE_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"

say() { echo "[provision_docker] $*"; }

# one provisioning at a time on this machine (several shells may run this script at once), with the lock in a
# folder only this user can write (scripts/_lock.sh)
source "$(dirname "${BASH_SOURCE[0]}")/_lock.sh"
take_lock provision-docker

if [ "$(id -u)" -ne 0 ] && ! docker info >/dev/null 2>&1; then
    say "not root and no Docker engine answers: run this script as root (or start an engine yourself)"
    exit 1
fi

# --- 1. packages -------------------------------------------------------------------------------------
missing=()
command -v dockerd >/dev/null 2>&1 || [ -x /usr/sbin/dockerd ] || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
# debootstrap checks the archive's signature with these (the image build refuses to run without them)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
command -v gpgv >/dev/null 2>&1 || missing+=(gpgv)
if [ "$GVISOR" != 0 ]; then
    command -v runsc >/dev/null 2>&1 || [ -x /usr/bin/runsc ] || missing+=(runsc)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}" ca-certificates tar
else
    say "the packages are installed (docker.io, debootstrap$([ "$GVISOR" != 0 ] && echo ", runsc"))"
fi
export PATH="$PATH:/usr/sbin:/sbin"

# --- 2. engine ---------------------------------------------------------------------------------------
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

start_dockerd() {  # start_dockerd [extra dockerd flags...]; returns 0 once `docker info` works
    local pidfile=/var/run/docker.pid
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        rm -f "$pidfile"  # left by a dockerd that is gone
    fi
    mkdir -p "$DATA_ROOT" "$(dirname "$LOG")"
    say "starting dockerd${*:+ $*} (data root $DATA_ROOT, log $LOG)"
    nohup dockerd --data-root "$DATA_ROOT" "$@" >>"$LOG" 2>&1 9>&- &  # 9>&-: not the lock
    local pid=$!
    for _ in $(seq "$WAIT_S"); do
        if engine_answers; then
            say "engine answers (dockerd pid $pid)"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            say "dockerd exited; last lines of $LOG:"
            tail -n 5 "$LOG" || true
            return 1
        fi
        sleep 1
    done
    say "dockerd did not answer within ${WAIT_S} s; stopping it"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
}

if engine_answers; then
    say "a Docker engine answers"
else
    # Sandbox containers use no network at all, so an engine without a bridge (hosts without iptables)
    # or with the vfs storage driver (hosts where overlayfs cannot mount) serves them just as well.
    start_dockerd \
        || start_dockerd --iptables=false --bridge=none \
        || start_dockerd --iptables=false --bridge=none --storage-driver=vfs \
        || { say "could not start dockerd; see $LOG"; exit 1; }
fi

# --- 3. gVisor runtime ------------------------------------------------------------------------------
register_runsc() {  # merges the runtime into daemon.json; prints "changed" when it wrote the file
    local py
    py="$(command -v python3 || true)"
    [ -n "$py" ] || py="$REPO/.venv/bin/python"
    "$py" - "$DAEMON_JSON" "$(command -v runsc || echo /usr/bin/runsc)" <<'PY'
import json, os, sys

path, runsc = sys.argv[1], sys.argv[2]
wanted = {"path": runsc, "runtimeArgs": ["--platform=ptrace", "--network=none"]}
config = {}
if os.path.exists(path):
    with open(path) as f:
        text = f.read()
    try:
        config = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        sys.exit(f"[provision_docker] {path} is not valid JSON ({exc}): fix it by hand, then run this again")
if config.get("runtimes", {}).get("runsc") == wanted:
    sys.exit(0)
config.setdefault("runtimes", {})["runsc"] = wanted
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(path + ".tmp", path)
print("changed")
PY
}

engine_has_runsc() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if [ "$GVISOR" != 0 ]; then
    changed="$(register_runsc)"
    if [ -n "$changed" ]; then
        say "registered runsc in $DAEMON_JSON"
    fi
    if ! engine_has_runsc; then
        dockerd_pid="$(cat /var/run/docker.pid 2>/dev/null || pidof dockerd || true)"
        if [ -z "$dockerd_pid" ]; then
            say "cannot find dockerd's pid to reload $DAEMON_JSON; restart the engine to get runsc"
            exit 1
        fi
        say "reloading dockerd's configuration (SIGHUP to pid $dockerd_pid)"
        kill -HUP $dockerd_pid
        for _ in $(seq 20); do
            engine_has_runsc && break
            sleep 0.5
        done
        engine_has_runsc || { say "dockerd did not pick up the runsc runtime; see $LOG"; exit 1; }
    fi
    say "the engine has the gVisor runtime runsc ($(runsc --version 2>/dev/null | head -n 1))"
fi

# --- 4. image ----------------------------------------------------------------------------------------
if [ -n "${STARE_AGENTS:-}" ]; then
    read -r -a cli <<<"$STARE_AGENTS"
elif [ -x "$REPO/.venv/bin/stare-agents" ]; then
    cli=("$REPO/.venv/bin/stare-agents")
elif command -v stare-agents >/dev/null 2>&1; then
    cli=(stare-agents)
else
    say "the stare-agents command is not installed: pip install -e '$REPO' first (or set STARE_AGENTS)"
    exit 1
fi
rootfs_args=()
[ -n "${STARE_SANDBOX_ROOTFS:-}" ] && rootfs_args=(--rootfs "$STARE_SANDBOX_ROOTFS")
# `build` does nothing when the image is already there
"${cli[@]}" sandbox build --offline "${rootfs_args[@]}"
say "ready: engine up$([ "$GVISOR" != 0 ] && echo ", runsc registered"), sandbox image present"
