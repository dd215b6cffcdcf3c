# Sourced by the provisioning scripts: `take_lock NAME` holds an exclusive lock on fd 9 for the rest of the
# script, so one provisioning of NAME runs at a time on this machine. The lock lives in a folder only this user
# can write (not world-writable /var/lock, where another user could plant a symlink that root would then open
# and truncate): /run/stare-agents as root, else ~/.cache/stare-agents; STARE_LOCK_DIR overrides. A folder
# that is a link, not ours, or writable by others is refused (the caller's `say` reports it).
take_lock() {
    local default_lock_dir lock_dir
    if [ "$(id -u)" -eq 0 ]; then default_lock_dir=/run/stare-agents; else default_lock_dir="$HOME/.cache/stare-agents"; fi
    lock_dir="${STARE_LOCK_DIR:-$default_lock_dir}"
    mkdir -p -m 700 "$lock_dir" 2>/dev/null || true
    if [ -L "$lock_dir" ] || [ ! -d "$lock_dir" ] || [ "$(stat -c %u "$lock_dir")" != "$(id -u)" ] \
        || [ -n "$(find "$lock_dir" -maxdepth 0 -perm /022)" ]; then
        say "refusing the lock folder $lock_dir: it must be a real folder owned by $(id -un) that no one else can write"
        exit 1
    fi
    exec 9>>"$lock_dir/$1.lock"
    flock 9
}
