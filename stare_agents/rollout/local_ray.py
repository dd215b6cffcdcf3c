"""A single-node Ray that listens on loopback only.

On Linux `ray.init()` takes the machine's routable address as its node IP, and the GCS, the raylet, the
runtime-env agent and every worker's gRPC server listen on all interfaces; whoever reaches the machine
could then talk to the cluster (Ray 2.60 turns token authentication on for a local `ray.init`, but a
listener on loopback is not reachable at all). `ray.init(_node_ip_address="127.0.0.1")` does not help: Ray
2.60 maps a loopback node address back to the routable one (`services.resolve_ip_for_localhost`). What
does is Ray's own single-machine switch, `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (the default on macOS and
Windows): the node IP becomes 127.0.0.1 and every server above binds to it. Ray reads it when `ray` is
imported, so it is set in the environment (for the processes Ray starts) and in Ray's constants (for this
process, which may have imported Ray already).

Ray 2.60 also turns token authentication on for a new local instance and writes the token it makes to
`~/.ray/auth_token` readable by everyone (0644): any local user could then authenticate to the run's Ray.
`private_auth_token` makes that file first, 0600, and makes an existing one 0600, so Ray uses it as it is.

Ray keeps its sockets, logs and session files under `/tmp/ray`, shared by every user of the machine, unless
told otherwise, and makes whatever temp folder it is given world-writable (0777): `init_local_ray` gives each
new instance `ray/` inside a fresh folder of its own, mode 0700 (`private_temp_dir`), which no other user can
enter. It stays after the run, as Ray's own does, for its logs.

A multi-node run attaches to a cluster started with `ray start` instead (see docs/cluster.md):
`init_ray` is what the trainer calls, and it starts the local instance only when there is no cluster to attach
to (`cluster_address`: `rollout.ray_address`, else RAY_ADDRESS, else the cluster `ray start` runs on this node).
Attaching gives Ray no resources: a cluster's nodes declared theirs when `ray start` started them, and Ray
refuses `num_cpus`/`num_gpus` from a driver that connects.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
from pathlib import Path
from typing import Any

SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"
LOCAL = "local"  # rollout.ray_address / RAY_ADDRESS: a private local instance even where a cluster runs
AUTO = "auto"  # rollout.ray_address: the cluster `ray start` runs on this node, or an error
logger = logging.getLogger("stare_agents.rollout")


def private_auth_token() -> Path | None:
    """The file of Ray's authentication token, readable and writable by this user only (0600): made here
    with a fresh token (as Ray would: 32 random bytes in hex) when there is none, else its mode set. None when
    Ray's token authentication is off (RAY_AUTH_MODE other than "token") or the token is in RAY_AUTH_TOKEN."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)
        return path
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))
    return path


def private_temp_dir() -> str:
    """A folder for one Ray instance's sockets, logs and session files: `ray/` in a fresh folder that is this
    user's only (0700; Ray makes `ray/` itself 0777), under $RAY_TMPDIR where that is set, else the temporary
    folder."""
    private = tempfile.mkdtemp(prefix="stare-ray-", dir=os.environ.get("RAY_TMPDIR") or None)
    return os.path.join(private, "ray")


def init_local_ray(**kwargs: Any) -> Any:
    """`ray.init(**kwargs)` for a new single-node instance whose servers listen on 127.0.0.1 only, in a
    temporary folder of its own (0700) unless `_temp_dir` is given; the dashboard stays off unless asked for
    (it too binds to loopback by default)."""
    if "address" in kwargs:
        raise ValueError(
            "init_local_ray starts a new local instance; connect to a cluster with ray.init(address=...)"
        )
    os.environ[SINGLE_MACHINE_ENV] = "0"  # the GCS, raylet, agents and workers Ray starts read it
    private_auth_token()  # before Ray would write one that every local user can read
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; this process may have imported ray already
    kwargs.setdefault("include_dashboard", False)
    if "_temp_dir" not in kwargs:
        kwargs["_temp_dir"] = private_temp_dir()
    return ray.init(**kwargs)


# the driver's settings for NCCL's and gloo's sockets (which interface, timeouts, debug output), forwarded to every
# worker the trainer starts: a worker on another node gets its raylet's environment, not the driver's
FORWARDED_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
FORWARDED_ENV_NAMES = ("GLOO_SOCKET_IFNAME",)


def forwarded_env() -> dict[str, str]:
    """The variables of this process's environment that the trainer's Ray workers get too (their
    `runtime_env`): NCCL_*, TORCH_NCCL_* and GLOO_SOCKET_IFNAME, e.g. NCCL_SOCKET_IFNAME=ib0."""
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith(FORWARDED_ENV_PREFIXES) or name in FORWARDED_ENV_NAMES
    }


def started_cluster_file() -> Path:
    """Where `ray start --head` records its cluster's address on this node (Ray's default temp folder:
    $RAY_TMPDIR/ray, else $TMPDIR/ray, else /tmp/ray); `ray stop` removes it."""
    from ray._common.utils import get_ray_address_file

    return Path(get_ray_address_file(None))


def _answers(address: str, timeout_s: float = 2.0) -> bool:
    """Whether something accepts a TCP connection at host:port (a GCS that is up)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def cluster_address(address: str | None = None) -> tuple[str | None, str]:
    """The Ray cluster a run attaches to, and where that came from: `address` (rollout.ray_address) when set;
    else $RAY_ADDRESS; else the cluster `ray start` runs on this node (the address file it writes, when its
    GCS answers). (None, why) means: start a private local instance. "local" in either setting asks for the
    local instance; "auto" asks for this node's `ray start` cluster and is an error when there is none."""
    source = "rollout.ray_address"
    if not address:
        address, source = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"
    if address == LOCAL:
        return None, f"{source}={LOCAL}"
    if address and address != AUTO:
        return address, source
    file = started_cluster_file()
    found = file.read_text().strip() if file.is_file() else ""
    if found and _answers(found):
        return found, f"`ray start` on this node ({file})"
    if address == AUTO:
        why = f"its address file {file} names {found}, which does not answer" if found else f"no {file}"
        raise ConnectionError(
            f"{source}={AUTO}: no Ray cluster started with `ray start` runs on this node ({why}); start one, "
            f"give its address (rollout.ray_address=HOST:PORT or RAY_ADDRESS), or use {LOCAL}"
        )
    if found:
        logger.warning(
            "%s names the Ray cluster %s, which does not answer (stopped without `ray stop`?): starting a "
            "private local Ray instead; give rollout.ray_address=HOST:PORT to attach to a cluster",
            file,
            found,
        )
    return None, "no cluster to attach to"


def init_ray(
    address: str | None = None, *, num_cpus: int | None = None, log_to_driver: bool = True
) -> str | None:
    """Ray for a run, unless this process has it already: attach to the cluster `cluster_address` finds (without
    num_cpus/num_gpus, which a connecting driver may not give), else start the private local instance with
    `num_cpus` (default: this machine's CPUs, at least 2). Returns the address attached to, or None."""
    import ray

    if ray.is_initialized():
        return None
    target, source = cluster_address(address)
    if target is None:
        init_local_ray(num_cpus=num_cpus or max(2, os.cpu_count() or 2), log_to_driver=log_to_driver)
        return None
    found_here = source.startswith("`ray start`")  # not asked for by name: say so where it shows
    log = logger.warning if found_here else logger.info
    log("attaching to the Ray cluster at %s (from %s)", target, source)
    try:
        ray.init(address=target, log_to_driver=log_to_driver)
    except Exception as error:
        raise ConnectionError(
            f"cannot attach to the Ray cluster at {target} (from {source}): {type(error).__name__}: {error}. "
            "A cluster started with token authentication needs RAY_AUTH_MODE=token and its token "
            "(~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN) here too; rollout.ray_address=local "
            "starts a private local Ray instead"
        ) from error
    return target


__all__ = [
    "AUTO",
    "LOCAL",
    "LOOPBACK",
    "SINGLE_MACHINE_ENV",
    "cluster_address",
    "forwarded_env",
    "init_local_ray",
    "init_ray",
    "private_auth_token",
    "private_temp_dir",
    "started_cluster_file",
]
