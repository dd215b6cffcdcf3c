#!/usr/bin/env bash
# Make a headless Chromium available for the trajectory viewer's browser tests. Idempotent; run as root:
#
#     bash scripts/provision_browser.sh
#
# Installs Debian's `chromium` package with apt-get if no Chromium is on the PATH. The tests drive it with
# Playwright (a Python package in the dev extras) through its executable path, so no browser is downloaded
# from anywhere but the distribution's mirror. Prints the executable's path last. Exit status is non-zero
# if no browser could be provided.
set -euo pipefail

say() { echo "[provision_browser] $*"; }

find_browser() {
    local name
    for name in chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
    done
    return 1
}

# one provisioning at a time on this machine (apt holds its own lock, but a second apt-get would fail on it),
# with the lock in a folder only this user can write (scripts/_lock.sh)
source "$(dirname "${BASH_SOURCE[0]}")/_lock.sh"
take_lock provision-browser

if browser="$(find_browser)"; then
    say "a browser is installed: $browser"
else
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        say "no Chromium found and cannot install one (needs root and apt-get): install chromium yourself"
        exit 1
    fi
    say "installing chromium with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
    browser="$(find_browser)" || { say "chromium was installed but is not on the PATH"; exit 1; }
fi
"$browser" --headless --no-sandbox --disable-gpu --version >/dev/null 2>&1 \
    || { say "$browser does not start headless"; exit 1; }
say "ready: $("$browser" --version 2>/dev/null)"
echo "$browser"
