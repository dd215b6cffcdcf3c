"""DockerSandbox: a pool of warm, locked-down containers, each running the sandbox runner as PID 1."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, fields
from importlib import metadata
from typing import Any

from stare_agents.sandbox.backend import RUNNER_PATH
from stare_agents.sandbox.channel import (
    DEFAULT_GRACE_S,
    DEFAULT_LEASE_TIMEOUT_S,
    HOST_SLACK_S,
    MEMORY_RANGE_MB,
    PREIMPORT,
    START_WAIT_S,
    Channel,
    Runner,
)
from stare_agents.sandbox.errors import ChannelTimeout, SandboxError
from stare_agents.sandbox.local import ALLOW_LOCAL_ENV
from stare_agents.sandbox.pool import PooledSandbox
from stare_agents.sandbox.runner import DEFAULT_TIMEOUT_S

logger = logging.getLogger("stare_agents.sandbox")

LABEL = "stare-agents.sandbox"  # every sandbox container carries it
OWNER_LABEL = "stare-agents.sandbox.owner"  # "<host>:<pid>:<process start time>" of the process that made it
INSTANCE_LABEL = "stare-agents.sandbox.instance"  # one DockerSandbox object (a process may hold several)
# the cgroup that `DockerLimits.low_priority` containers live under (docker's --cgroup-parent); with docker's
# systemd cgroup driver it is a slice, LOW_PRIORITY_PARENT + ".slice"
LOW_PRIORITY_PARENT = "stare-sandbox"
# its CPU weight, a 16th of a normal process's (cgroup v1 cpu.shares 1024, v2 cpu.weight 100): beside a busy
# engine the code gets ~6% of a core, enough that a container still starts and answers beside a process that
# never yields (with the minimum weight, 2, it did not start in 60 s), little enough not to slow the engine
LOW_PRIORITY_SHARES = 64


def _version() -> str:
    try:
        return metadata.version("stare-agents")
    except metadata.PackageNotFoundError:
        return "0.1.0"


DEFAULT_IMAGE = f"stare-agents/sandbox:{_version()}"


# the range each size of DockerLimits must lie in (inclusive): outside it a limit no longer limits, or the
# runner cannot start
LIMIT_RANGES: dict[str, tuple[int | float, int | float]] = {
    "memory_mb": MEMORY_RANGE_MB,
    "pids": (1, 4096),
    "cpus": (0.01, 1024),  # the engine's smallest quota is a 100th of a CPU
    "tmpfs_mb": (1, 65_536),
    "nofile": (64, 65_536),
}
MAX_ID = 2**31 - 1  # uids and gids above it are not portable (and 2**32 - 1 is "no user")


@dataclass(frozen=True)
class DockerLimits:
    """Per-container limits. Every one is always on; only the sizes are configurable, each within
    LIMIT_RANGES, and the user is a numeric uid:gid other than root's (checked where the limits are built)."""

    memory_mb: int = 512  # RAM; swap is set equal, so there is none on top
    pids: int = 128  # processes + threads in the container
    cpus: float = 1.0  # CPU quota
    tmpfs_mb: int = 64  # the only writable folder, /tmp (the root is read-only)
    nofile: int = 1024  # open files per process
    user: str = "1000:1000"  # non-root, matches the `sandbox` user of the image
    # the host CPUs the containers may run on (docker's --cpuset-cpus, e.g. "1" or "2-7,10"); None: any. Keeps
    # the model's code off the cores an inference engine runs on (see rollout.env_cpus)
    cpuset: str | None = None
    # the containers under a cgroup of their own (LOW_PRIORITY_PARENT) with a 16th of a normal process's CPU
    # weight: the model's code then runs mostly on CPU time the host's other processes (an inference engine on
    # the same cores) leave idle, instead of slowing every step of the engine's threads. The CPU limit
    # counts only the CPU time the code gets; the wall-clock cap ends code starved long enough. Needs
    # root for the cgroup; where the weight cannot be set the containers run at normal priority, with a warning
    low_priority: bool = False

    @classmethod
    def from_mapping(cls, values: Any) -> DockerLimits:
        """The limits a config gives as a mapping ({memory_mb: 1024, cpuset: "1"}), each checked."""
        if not isinstance(values, dict):
            raise ValueError(f"limits must be a mapping of {[f.name for f in fields(cls)]}, got {values!r}")
        unknown = sorted(set(values) - {f.name for f in fields(cls)}, key=str)
        if unknown:
            raise ValueError(f"{unknown} are not limits; allowed: {[f.name for f in fields(cls)]}")
        return cls(**values)

    def __post_init__(self) -> None:
        for name, (low, high) in LIMIT_RANGES.items():
            value = getattr(self, name)
            kinds = (int, float) if name == "cpus" else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
                what = "a number" if name == "cpus" else "an int"
                raise ValueError(f"{name} must be {what} in [{low}, {high}], got {value!r}")
        ids = re.fullmatch(r"([0-9]+):([0-9]+)", self.user) if isinstance(self.user, str) else None
        if ids is None or not all(1 <= int(n) <= MAX_ID for n in ids.groups()):
            raise ValueError(
                f"user must be a numeric uid:gid, neither of them 0 (root), such as '1000:1000' (the image's "
                f"`sandbox` user), got {self.user!r}"
            )
        if not isinstance(self.low_priority, bool):
            raise ValueError(f"low_priority must be true or false, got {self.low_priority!r}")
        if self.cpuset is not None and not (
            isinstance(self.cpuset, str) and re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", self.cpuset)
        ):
            raise ValueError(
                f"cpuset must be a CPU list such as '1' or '0-3,6', or None, got {self.cpuset!r}"
            )


def lower_cpu_weight(pid: int, cgroup_root: str = "/sys/fs/cgroup") -> str:
    """Give the cgroup above process `pid`'s own a low CPU weight (LOW_PRIORITY_SHARES as cgroup v1
    `cpu.shares`, the same share of v2's `cpu.weight`) and return the file written. That parent must be
    LOW_PRIORITY_PARENT (or its slice): a container elsewhere (docker's own parent, the root) raises
    ValueError rather than lower what others share."""
    with open(f"/proc/{pid}/cgroup") as handle:
        lines = [line.split(":", 2) for line in handle.read().splitlines() if line.count(":") >= 2]
    v1 = next(((c, p) for _, c, p in lines if "cpu" in c.split(",")), None)  # the cpu controller's hierarchy
    if v1 is not None:
        controllers, path = v1
        mounts = [f"{cgroup_root}/{controllers}", f"{cgroup_root}/cpu", f"{cgroup_root}/cpu,cpuacct"]
        mount = next((m for m in mounts if os.path.isdir(m)), None)
        if mount is None:
            raise ValueError(f"no cgroup v1 cpu hierarchy under {cgroup_root}")
        name, value = "cpu.shares", str(LOW_PRIORITY_SHARES)
    else:  # cgroup v2: one hierarchy, "0::/path"
        path = next((p for hierarchy, c, p in lines if hierarchy == "0" and not c), None)
        if path is None:
            raise ValueError(f"process {pid} is in no cgroup with a cpu controller")
        mount, name, value = cgroup_root, "cpu.weight", str(max(1, round(LOW_PRIORITY_SHARES * 100 / 1024)))
    parent = os.path.dirname(os.path.join(mount, path.strip("/")))
    if os.path.basename(parent) not in (LOW_PRIORITY_PARENT, LOW_PRIORITY_PARENT + ".slice"):
        raise ValueError(f"the container's cgroup {path} is not under {LOW_PRIORITY_PARENT}")
    target = os.path.join(parent, name)
    with open(target, "w") as handle:
        handle.write(value)
    return target


# the weight files of LOW_PRIORITY_PARENT that may exist (cgroup v1 with either driver, v2), under the cgroup root
_WEIGHT_FILES = (
    ("cpu", "cpu.shares", "1024", str(LOW_PRIORITY_SHARES)),
    ("cpu,cpuacct", "cpu.shares", "1024", str(LOW_PRIORITY_SHARES)),
    ("", "cpu.weight", "100", str(max(1, round(LOW_PRIORITY_SHARES * 100 / 1024)))),
)
_starting = 0  # containers of this process starting now (under _starting_lock)
_starting_lock = threading.Lock()


def _set_parent_weight(normal: bool, cgroup_root: str) -> None:
    for mount, name, normal_value, low_value in _WEIGHT_FILES:
        for parent in (LOW_PRIORITY_PARENT, LOW_PRIORITY_PARENT + ".slice"):
            target = os.path.join(cgroup_root, mount, parent, name)
            if os.path.isfile(target):
                try:
                    with open(target, "w") as handle:
                        handle.write(normal_value if normal else low_value)
                except OSError as exc:  # not root, or a read-only cgroup mount: the weight stays as it is
                    logger.debug("could not write %s: %s", target, exc)


@contextlib.contextmanager
def normal_weight_while_starting(cgroup_root: str = "/sys/fs/cgroup") -> Iterator[None]:
    """While a container of this process starts its runner, the low-priority containers' parent cgroup runs at a
    normal CPU weight, and at LOW_PRIORITY_SHARES again once no start is in flight. Starting a runner is the
    sandbox's own work, not the model's code: at a 16th of the weight, beside processes that keep every core
    busy, a pool's containers did not start in START_WAIT_S and the run stopped ("no containers left"). Other
    processes' sandboxes under the same parent are not counted: one may lower the weight while another starts."""
    global _starting
    with _starting_lock:
        _starting += 1
        if _starting == 1:
            _set_parent_weight(True, cgroup_root)
    try:
        yield
    finally:
        with _starting_lock:
            _starting -= 1
            if _starting == 0:
                _set_parent_weight(False, cgroup_root)


def _process_start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def owner_tag(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start_time(pid)}"


def _owner_alive(tag: str) -> bool:
    host, _, rest = tag.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname():
        return True  # another machine's container: not ours to judge
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return os.path.exists(f"/proc/{pid}") and _process_start_time(pid) == start


def docker_client(timeout_s: float = 30.0):
    """A docker SDK client for the engine in the environment (DOCKER_HOST or the default socket)."""
    try:
        import docker
    except ImportError as exc:  # a declared dependency; only a broken install gets here
        raise SandboxError("the `docker` Python package is missing: pip install 'docker>=7'") from exc
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as exc:
        raise SandboxError(
            f"no Docker engine answers ({exc}); start one (as root: `bash scripts/provision_docker.sh`) "
            f"or use LocalSandbox"
        ) from exc
    return client


RUNTIMES_HINT = (
    "for gVisor, run `bash scripts/provision_docker.sh` as root: it installs Debian's `runsc` package and "
    'registers it in /etc/docker/daemon.json as {"runtimes": {"runsc": {"path": "/usr/bin/runsc", '
    '"runtimeArgs": ["--platform=ptrace", "--network=none"]}}} (then SIGHUP to dockerd)'
)


def engine_runtimes(client: Any) -> list[str]:
    """The OCI runtimes the engine has registered (e.g. ["runc", "runsc"])."""
    return sorted((client.info().get("Runtimes") or {}).keys())


def missing_runtime(client: Any, runtime: str | None) -> str:
    """ "" when the engine can run containers with `runtime` (None: its default), else what is wrong."""
    if runtime is None:
        return ""
    runtimes = engine_runtimes(client)
    if runtime in runtimes:
        return ""
    return f"the Docker engine has no runtime {runtime!r} (it has {', '.join(runtimes) or 'none'}); {RUNTIMES_HINT}"


def is_gvisor(client: Any, runtime: str | None) -> bool:
    """Whether containers of `runtime` (None: the engine's default) run under gVisor (runsc)."""
    info = client.info()
    name = runtime or info.get("DefaultRuntime") or "runc"
    path = str(((info.get("Runtimes") or {}).get(name) or {}).get("path") or name)
    return os.path.basename(path).startswith("runsc")


# Under gVisor the container's pids cgroup also holds the sentry (the user-space kernel, a Go program with
# a few dozen OS threads) and, on the ptrace platform, one host task per thread of the code. The sentry
# dies when it cannot start a thread, so it gets this many on top of `DockerLimits.pids`.
GVISOR_EXTRA_PIDS = 128
_described: set[str] = set()  # the limits this process has logged (DockerSandbox.describe)


def docker_status(image: str = DEFAULT_IMAGE, runtime: str | None = None) -> tuple[bool, str]:
    """(True, "") when an engine answers, `image` exists and so does `runtime` (None: the engine's
    default), else (False, what is missing)."""
    try:
        client = docker_client(timeout_s=10)
    except SandboxError as exc:
        return False, str(exc)
    try:
        import docker.errors

        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            return (
                False,
                f"the image {image} is missing: build it with `stare-agents sandbox build [--offline]`",
            )
        problem = missing_runtime(client, runtime)
        return not problem, problem
    finally:
        client.close()


def sandbox_containers(
    client: Any, owner: str | None = None, instance: str | None = None
) -> list[dict[str, Any]]:
    """The engine's records ({"Id", "Labels", "State", ...}) of sandbox containers, optionally only one
    owner process's or one DockerSandbox's (`instance`).

    Uses the plain list call: the SDK's `containers.list` inspects each container afterwards and fails
    when one is removed in between, which auto-removed containers do all the time.
    """
    labels = [LABEL]
    if owner is not None:
        labels.append(f"{OWNER_LABEL}={owner}")
    if instance is not None:
        labels.append(f"{INSTANCE_LABEL}={instance}")
    return client.api.containers(all=True, filters={"label": labels})


def sweep_stale_containers(client: Any) -> int:
    """Remove sandbox containers whose owner process is gone (e.g. it was killed). Returns how many."""
    removed = 0
    for record in sandbox_containers(client):
        owner = (record.get("Labels") or {}).get(OWNER_LABEL, "")
        if _owner_alive(owner):
            continue
        try:
            client.api.remove_container(record["Id"], force=True)
            removed += 1
        except Exception as exc:  # already being removed (auto-remove) or gone
            logger.debug("could not remove stale container %s: %s", record["Id"][:12], exc)
    if removed:
        logger.warning("removed %d sandbox container(s) left behind by a process that ended", removed)
    return removed


class DockerChannel(Channel):
    """The container's stdin and stdout through the engine's attach stream (8-byte multiplexing headers)."""

    STDERR_LINES = 20  # the runner's stderr is logged up to this many times per container, then counted

    def __init__(self, sock: socket.socket, container: Any) -> None:
        super().__init__()
        self.sock = sock
        self.container = container
        self._raw = bytearray()
        self._stderr_seen = 0

    def send(self, data: bytes, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ChannelTimeout("the container did not take the request in time")
        self.sock.settimeout(min(remaining, 30.0))
        try:
            self.sock.sendall(data)
        except TimeoutError as exc:
            raise ChannelTimeout("the container did not take the request in time") from exc

    def _recv_some(self, deadline: float | None) -> bytes:
        while True:
            if len(self._raw) >= 8:
                stream, size = struct.unpack(">BxxxL", self._raw[:8])
                if len(self._raw) >= 8 + size:
                    payload = bytes(self._raw[8 : 8 + size])
                    del self._raw[: 8 + size]
                    if stream == 1 and payload:
                        return payload
                    if stream == 2 and payload:  # a runner bug, or (gVisor) code writing to PID 1's stderr
                        self._stderr_seen += 1
                        if self._stderr_seen <= self.STDERR_LINES:
                            text = payload.decode(errors="replace").rstrip()[:2000]
                            logger.warning("sandbox runner stderr: %s", text)
                        elif self._stderr_seen == self.STDERR_LINES + 1:
                            logger.warning(
                                "sandbox runner stderr: more output of this container is not logged"
                            )
                    continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise ChannelTimeout("the container did not answer in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError as exc:
                # a cancel sent from another thread may have set a shorter timeout on the socket
                if deadline is None or time.monotonic() < deadline:
                    continue
                raise ChannelTimeout("the container did not answer in time") from exc
            if not chunk:
                return b""
            self._raw += chunk

    def peer_gone(self) -> bool:
        if self._raw or self._buffer:
            return False
        self.sock.settimeout(0.0)  # non-blocking: with a timeout set, Python would wait for data first
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            _remove_container(self.container)


def _remove_container(container: Any, wait_s: float = 20.0) -> None:
    """Force-remove a container and return once it is gone.

    When the engine's auto-remove is already under way, `remove` answers 409 while the container still
    exists for a moment; then wait for the removal to finish rather than return early. A paused container
    is unpaused first: force-removing a paused gVisor container takes the engine 10 s, unpausing 0.2 s.
    """
    try:
        container.reload()
        if container.status == "paused":
            container.unpause()
    except Exception as exc:  # gone already, or being removed: the remove below says which
        logger.debug("checking %s before its removal: %s", container.short_id, exc)
    try:
        container.remove(force=True)
        return
    except Exception as exc:
        if getattr(getattr(exc, "response", None), "status_code", None) == 404:
            return
        logger.debug("removing %s: %s; waiting for its removal", container.short_id, exc)
    try:
        container.wait(condition="removed", timeout=wait_s)
    except Exception as exc:  # gone already (404), or the engine is stuck: the label sweep catches it later
        logger.debug("waiting for the removal of %s: %s", container.short_id, exc)


class DockerSandbox(PooledSandbox):
    """Python sessions in a pool of warm Docker containers with hard limits.

    Each container: no network, `limits.memory_mb` of memory and no swap, at most `limits.pids` processes
    and threads, `limits.cpus` CPUs, a read-only root with a `limits.tmpfs_mb` MB tmpfs at /tmp, a non-root
    user, every capability dropped, no-new-privileges, no host mounts and none of the host's environment.
    Sessions lease a container; when a session ends its container is wiped (fresh interpreter, empty /tmp,
    every process killed) and lent again. Containers are labelled and removed on close, at interpreter exit,
    when the owner's connection drops (the engine closes their stdin), and at the next start after the owner
    was killed.
    """

    runner_kind = "container"
    pins_cpus = True  # the engine's children, not this process's: kept on CPUs by `limits.cpuset`
    lowers_priority = True  # `limits.low_priority`
    # what a run's config may set (rollout.sandbox_kwargs): the image, runtime and limits, sizes and timeouts
    config_kwargs: frozenset[str] = frozenset(
        {
            "image",
            "limits",
            "runtime",
            "default_timeout_s",
            "max_output_bytes",
            "lease_timeout_s",
            "grace_s",
            "host_slack_s",
            "preimport",
        }
    )

    def __init__(
        self,
        pool_size: int = 4,
        *,
        image: str = DEFAULT_IMAGE,
        limits: DockerLimits | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int = 32 * 1024,
        lease_timeout_s: float | None = DEFAULT_LEASE_TIMEOUT_S,
        grace_s: float = DEFAULT_GRACE_S,
        host_slack_s: float = HOST_SLACK_S,
        preimport: tuple[str, ...] = PREIMPORT,
        runtime: str | None = None,
    ) -> None:
        super().__init__(
            pool_size=pool_size,
            default_timeout_s=default_timeout_s,
            max_output_bytes=max_output_bytes,
            lease_timeout_s=lease_timeout_s,
            grace_s=grace_s,
            host_slack_s=host_slack_s,
        )
        self.image = image
        # a mapping too (sandbox_kwargs from a YAML config: {limits: {memory_mb: 1024, cpuset: "1"}})
        if limits is None:
            limits = DockerLimits()
        elif not isinstance(limits, DockerLimits):
            limits = DockerLimits.from_mapping(limits)
        self.limits = limits
        self.preimport = tuple(preimport)
        if runtime is not None and (not isinstance(runtime, str) or not runtime):
            raise ValueError(
                f"runtime must be a runtime name such as 'runc' or 'runsc', or None, got {runtime!r}"
            )
        self.runtime = runtime
        self.gvisor = False  # known once the engine has been asked (start)
        self.client: Any = None
        self.owner = owner_tag()
        self.instance = uuid.uuid4().hex[:12]
        self.cgroup_driver = "cgroupfs"  # docker's (known once the engine has been asked)
        self.low_priority_set: bool | None = None  # low_priority: whether the weight was set (None: not yet)

    @classmethod
    def create(cls, pool_size: int = 4, **kwargs: Any) -> DockerSandbox:
        """A DockerSandbox once the engine answers and has the image and the runtime; else a SandboxError that
        says what is missing and how to provision it. Never the host instead."""
        cls.check(**kwargs)
        return cls(pool_size, **kwargs)

    @classmethod
    def check(cls, **kwargs: Any) -> None:
        available, reason = docker_status(kwargs.get("image", DEFAULT_IMAGE), kwargs.get("runtime"))
        if not available:
            raise SandboxError(
                f"the Docker sandbox is not ready: {reason}. Model-written code never runs on the host by "
                f"default: provision Docker (as root: `bash scripts/provision_docker.sh`; check with "
                f"`stare-agents sandbox doctor`), or ask for the local backend by name (sandbox 'local') and "
                f"acknowledge that it is no security boundary with {ALLOW_LOCAL_ENV}=1"
            )

    @classmethod
    def check_settings(cls, kwargs: dict[str, Any], where: str) -> None:
        super().check_settings(kwargs, where)
        limits = kwargs.get("limits")
        if limits is not None and not isinstance(limits, DockerLimits):
            try:
                DockerLimits.from_mapping(limits)
            except ValueError as exc:
                raise ValueError(f"{where}.limits: {exc}") from None

    @classmethod
    def with_cpus(cls, kwargs: dict[str, Any], cpus: str) -> dict[str, Any]:
        kwargs = dict(kwargs)
        limits = kwargs.get("limits") or DockerLimits()
        limits = DockerLimits.from_mapping(limits) if isinstance(limits, dict) else limits
        if limits.cpuset is None:
            kwargs["limits"] = dataclasses.replace(limits, cpuset=cpus)
        return kwargs

    @classmethod
    def with_low_priority(cls, kwargs: dict[str, Any], low: bool) -> dict[str, Any]:
        kwargs = dict(kwargs)
        limits = kwargs.get("limits")
        if not isinstance(limits, (dict, type(None))):
            return kwargs  # a DockerLimits object, which says it itself
        limits = dict(limits or {})
        limits.setdefault("low_priority", low)
        kwargs["limits"] = limits
        return kwargs

    def _before_start(self) -> None:
        import docker.errors

        self.client = docker_client()
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"the sandbox image {self.image} is missing: build it with `stare-agents sandbox build` "
                f"(or `--offline` without a registry)"
            ) from exc
        problem = missing_runtime(self.client, self.runtime)
        if problem:
            raise SandboxError(problem)
        self.gvisor = is_gvisor(self.client, self.runtime)
        if self.limits.low_priority:
            self.cgroup_driver = str(self.client.info().get("CgroupDriver") or "cgroupfs")
        sweep_stale_containers(self.client)
        summary = self.describe()
        if summary not in _described:  # once per process for each set of limits
            _described.add(summary)
            logger.info("sandbox: %s", summary)

    def describe(self) -> str:
        """The resolved limits of each container, in words (logged when the sandbox starts)."""
        limits = self.limits
        runtime = f"runtime {self.runtime or 'default'}" + (" (gVisor)" if self.gvisor else "")
        return (
            f"Docker image {self.image}, {runtime}; each container: {limits.memory_mb} MB of memory and no "
            f"swap, {limits.pids} processes and threads, {limits.cpus:g} CPUs on CPUs {limits.cpuset or 'any'} "
            f"at {'low' if limits.low_priority else 'normal'} priority, {limits.tmpfs_mb} MB writable /tmp, "
            f"{limits.nofile} open files, user {limits.user}, no network, no capabilities, read-only root"
        )

    def container_config(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(create_container kwargs, host config kwargs) of the engine API: every isolation setting here."""
        from docker.types import LogConfig, Ulimit

        limits = self.limits
        command = [
            "python3",
            "-I",
            "-c",
            RUNNER_PATH.read_text(),
            "--mode",
            "docker",
            "--workdir",
            "/tmp",
            "--max-output",
            str(self.max_output_bytes),
            "--grace",
            str(self.grace_s),
            "--memory-hint",
            f"{limits.memory_mb} MB",
            "--preimport",
            ",".join(self.preimport),
        ]
        create = {
            "image": self.image,
            "command": command,
            "stdin_open": True,
            # detach=False makes the engine set StdinOnce: it closes the container's stdin when our attach
            # drops (e.g. this process is killed), and the runner then exits and the container is removed
            "detach": False,
            "tty": False,
            "labels": {LABEL: "1", OWNER_LABEL: self.owner, INSTANCE_LABEL: self.instance},
            "user": limits.user,
            "environment": {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"},
            "working_dir": "/tmp",
            "hostname": "sandbox",
            "network_disabled": True,
        }
        host = {
            "auto_remove": True,
            "network_mode": "none",
            "mem_limit": f"{limits.memory_mb}m",
            "memswap_limit": f"{limits.memory_mb}m",
            "pids_limit": limits.pids + (GVISOR_EXTRA_PIDS if self.gvisor else 0),
            "nano_cpus": int(limits.cpus * 1e9),
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,noexec,size={limits.tmpfs_mb}m,mode=1777"},
            "shm_size": "16m",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ulimits": [
                Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile),
                Ulimit(name="core", soft=0, hard=0),
            ],
            "log_config": LogConfig(type="none"),  # the protocol goes through attach, never to disk
        }
        if limits.cpuset is not None:
            host["cpuset_cpus"] = limits.cpuset
        if limits.low_priority:
            systemd = self.cgroup_driver == "systemd"
            host["cgroup_parent"] = LOW_PRIORITY_PARENT + ".slice" if systemd else "/" + LOW_PRIORITY_PARENT
        if self.runtime is not None:
            host["runtime"] = self.runtime
        return create, host

    def _start_runner(self) -> Runner:
        create, host = self.container_config()
        api = self.client.api
        container_id = api.create_container(host_config=api.create_host_config(**host), **create)["Id"]
        container = self.client.containers.get(container_id)
        try:
            response_sock = self.client.api.attach_socket(
                container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            sock = getattr(response_sock, "_sock", response_sock)
            container.start()
            runner = Runner(DockerChannel(sock, container), f"container {container.short_id}")
        except BaseException:
            _remove_container(container)
            raise
        starting = normal_weight_while_starting() if self.limits.low_priority else contextlib.nullcontext()
        try:
            with starting:
                runner.start(time.monotonic() + START_WAIT_S)
        except Exception as exc:
            runner.close()
            raise SandboxError(f"container {container.short_id} did not start its runner: {exc}") from exc
        if self.limits.low_priority and self.low_priority_set is None:
            self._lower_priority(container)
        return runner

    def _lower_priority(self, container: Any) -> None:
        """Once per sandbox, with the first container up: the low CPU weight for their common parent."""
        self.low_priority_set = False
        try:
            container.reload()
            target = lower_cpu_weight(int(container.attrs["State"]["Pid"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning(
                "the sandbox's containers run at normal CPU priority: low_priority could not set the weight of "
                "their cgroup (%s)",
                exc,
            )
            return
        self.low_priority_set = True
        logger.info("sandbox containers at a low CPU weight (%s)", target)
