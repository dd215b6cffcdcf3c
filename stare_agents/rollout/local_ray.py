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

Attaching runs the cluster's code in this process (Ray unpickles what its tasks return), so a run attaches only
to a cluster the user named (`rollout.ray_address`, RAY_ADDRESS) or one whose address file on this node is the
user's own and writable by no one else: Ray's shared temp folder (/tmp/ray) is writable by every local user, and
any of them could otherwise plant `ray_current_cluster` there naming a cluster of theirs
(`address_file_problem`). And it attaches only with token authentication: with RAY_AUTH_MODE=token (set here
when unset; RAY_AUTH_MODE=disabled is refused), to a cluster that refuses a request without the token
(`answers_without_token`: one started without token authentication runs code for whoever reaches it).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import stat
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


def address_file_problem(info: os.stat_result, uid: int) -> str | None:
    """Why an address file with these stats is not to be trusted by user `uid`, or None: it must be a plain file
    of that user's, with one link, that no one else may write (`ray start` writes it 0644 under a umask of 022).
    Another user's file, or one others may write, names whatever cluster they chose."""
    if not stat.S_ISREG(info.st_mode):
        return "it is not a plain file"
    if info.st_uid != uid:
        return f"it belongs to {_user_name(info.st_uid)} (uid {info.st_uid}), not to you (uid {uid})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return f"others may write it (mode {mode:04o})"
    if info.st_nlink != 1:
        return f"it has {info.st_nlink} hard links"
    return None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name!r}"
    except (ImportError, KeyError):
        return "another user"


def read_address_file(file: Path) -> tuple[str, str | None]:
    """(the address `file` names, why it is not to be trusted or None); ("", None) when there is no file. Opened
    without following a symbolic link, and judged by the stats of what was opened (`address_file_problem`)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "", None
    except OSError as error:  # ELOOP: a symbolic link; EACCES: someone else's folder
        return "", f"it cannot be opened as a plain file ({error.strerror})"
    with os.fdopen(fd, "rb") as handle:
        problem = address_file_problem(os.fstat(handle.fileno()), os.getuid())
        if problem is not None:
            return "", problem
        return handle.read(256).decode("utf-8", "replace").strip(), None


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
    else $RAY_ADDRESS; else the cluster `ray start` runs on this node (the address file it writes, when the file
    is this user's and no one else's to write, and its GCS answers). (None, why) means: start a private local
    instance. "local" in either setting asks for the local instance; "auto" asks for this node's `ray start`
    cluster and is an error when there is none (or its file is not to be trusted)."""
    source = "rollout.ray_address"
    if not address:
        address, source = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"
    if address == LOCAL:
        return None, f"{source}={LOCAL}"
    if address and address != AUTO:
        return address, source
    file = started_cluster_file()
    found, problem = read_address_file(file)
    if problem is not None:
        why = (
            f"{file} is not to be trusted: {problem}. It names the cluster `ray start` runs on this node, and "
            "any local user can write Ray's shared temp folder"
        )
        remedy = (
            "give the cluster you mean by RAY_ADDRESS=HOST:PORT, remove the file if it is not yours, or `chmod "
            "go-w` it if it is"
        )
        if address == AUTO:
            raise ConnectionError(f"{source}={AUTO}: {why}; {remedy}, or use {LOCAL}")
        logger.warning("%s: not attaching to it; a private local Ray starts instead (%s)", why, remedy)
        return None, f"{file} not trusted"
    if found and _answers(found):
        return found, f"`ray start` on this node ({file})"
    if address == AUTO:
        why = f"its address file {file} names {found}, which does not answer" if found else f"no {file}"
        raise ConnectionError(
            f"{source}={AUTO}: no Ray cluster started with `ray start` runs on this node ({why}); start one, "
            f"give its address (RAY_ADDRESS=HOST:PORT), or use {LOCAL}"
        )
    if found:
        logger.warning(
            "%s names the Ray cluster %s, which does not answer (stopped without `ray stop`?): starting a "
            "private local Ray instead; give RAY_ADDRESS=HOST:PORT to attach to a cluster",
            file,
            found,
        )
    return None, "no cluster to attach to"


def answers_without_token(address: str, timeout_s: float = 10.0) -> bool | None:
    """Whether the Ray cluster at host:port answers a request that carries no authentication token: True for
    one started without token authentication (RAY_AUTH_MODE=disabled), False for one that refuses it, None when
    it cannot be told (nothing answers there, or no Ray GCS does)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    target = address.removeprefix("ray://")
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.CheckAlive(gcs_service_pb2.CheckAliveRequest(), timeout=timeout_s)  # no metadata: no token
        except grpc.RpcError as error:
            return False if error.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def require_token_auth(target: str, source: str) -> None:
    """Attach with token authentication only: this process sends its token (RAY_AUTH_MODE=token, set when unset)
    and the cluster must refuse a request without one. Raises ConnectionError naming the setting and the remedy."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.strip().lower() != "token":
        raise ConnectionError(
            f"RAY_AUTH_MODE={mode}: a run attaches to a Ray cluster (here {target}, from {source}) only with token "
            f"authentication; unset RAY_AUTH_MODE or set it to token, with the cluster's token in "
            f"~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN, or use RAY_ADDRESS={LOCAL} for a private Ray"
        )
    if mode is None:
        os.environ["RAY_AUTH_MODE"] = "token"
        from ray._raylet import Config

        Config.initialize("")  # Ray read the mode when it was imported: read it again (as ray.init does)
    if answers_without_token(target):
        raise ConnectionError(
            f"the Ray cluster at {target} (from {source}) answers requests without a token: it was started "
            "without token authentication, so whoever reaches it can run code as its users, and in this process "
            "through it. Start it with RAY_AUTH_MODE=token (the README's cluster section), or use "
            f"RAY_ADDRESS={LOCAL} for a private Ray"
        )


def init_ray(
    address: str | None = None, *, num_cpus: int | None = None, log_to_driver: bool = True
) -> str | None:
    """Ray for a run, unless this process has it already: attach to the cluster `cluster_address` finds (with
    token authentication, `require_token_auth`; without num_cpus/num_gpus, which a connecting driver may not
    give), else start the private local instance with `num_cpus` (default: this machine's CPUs, at least 2) and
    say so. Returns the address attached to, or None."""
    import ray

    if ray.is_initialized():
        return None
    target, source = cluster_address(address)
    if target is None:
        cpus = num_cpus or max(2, os.cpu_count() or 2)
        logger.info("starting a private Ray on %s with %d CPUs (%s)", LOOPBACK, cpus, source)
        init_local_ray(num_cpus=cpus, log_to_driver=log_to_driver)
        return None
    found_here = source.startswith("`ray start`")  # not asked for by name: say so where it shows
    log = logger.warning if found_here else logger.info
    log("attaching to the Ray cluster at %s (from %s)", target, source)
    require_token_auth(target, source)
    try:
        ray.init(address=target, log_to_driver=log_to_driver)
    except Exception as error:
        raise ConnectionError(
            f"cannot attach to the Ray cluster at {target} (from {source}): {type(error).__name__}: {error}. "
            "A run attaches with token authentication: the cluster's token must be here too "
            f"(~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN); RAY_ADDRESS={LOCAL} "
            "starts a private local Ray instead"
        ) from error
    return target


__all__ = [
    "AUTO",
    "LOCAL",
    "LOOPBACK",
    "SINGLE_MACHINE_ENV",
    "address_file_problem",
    "answers_without_token",
    "cluster_address",
    "forwarded_env",
    "init_local_ray",
    "init_ray",
    "private_auth_token",
    "private_temp_dir",
    "read_address_file",
    "require_token_auth",
    "started_cluster_file",
]
