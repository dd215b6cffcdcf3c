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

A multi-node run connects to a cluster started with `ray start` instead (`ray.init(address=...)`, see the
README's cluster section): this function is only for the local instance.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


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


__all__ = ["LOOPBACK", "SINGLE_MACHINE_ENV", "init_local_ray", "private_auth_token", "private_temp_dir"]
