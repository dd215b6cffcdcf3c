"""A Ray cluster started with `ray start`, as a cluster user starts one, and stopped again without touching any
other Ray on the machine.

`ray stop` ends every Ray process of the machine (it matches them by name), other runs' included; `stop_cluster`
ends only the processes whose command line names this cluster's temp folder (its GCS, raylet, agents and
monitors), with their children (the workers), by process id.

Every node is on loopback (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: Ray otherwise advertises the machine's network
address) and token authentication is on, with a token file of the test's own (RAY_AUTH_TOKEN_PATH): the same
environment (`cluster_env`) lets a driver attach.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def short_folder() -> Path:
    """A fresh folder under /tmp: Ray's socket paths under its temp folder must fit in 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="srt-", dir="/tmp"))


def cluster_env(folder: Path) -> dict[str, str]:
    """The environment of the cluster's nodes and of a driver attaching to it: token authentication with a
    token file in `folder` (made here, 0600), every node on loopback, no RAY_ADDRESS from outside."""
    token = folder / "auth_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return env


def start_head(folder: Path, *, num_cpus: int = 2, token: bool = True, timeout_s: float = 180.0) -> str:
    """`ray start --head` on 127.0.0.1 with its temp folder `folder`/ray (and token authentication unless
    `token` is False); returns the cluster's address (the one `ray start` writes to
    `folder`/ray/ray_current_cluster)."""
    temp_dir = folder / "ray"
    command = [
        RAY,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={free_port()}",
        f"--num-cpus={num_cpus}",
        "--num-gpus=0",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    env = {**cluster_env(folder), **({} if token else {"RAY_AUTH_MODE": "disabled"})}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        stop_cluster(folder)
        raise RuntimeError(f"ray start --head failed ({done.returncode}): {done.stderr[-3000:]}")
    address = (temp_dir / "ray_current_cluster").read_text().strip()
    (folder / "gcs_address").write_text(address)  # its Ray client server names only this (see stop_cluster)
    return address


def mount_namespace_prefix() -> list[str] | None:
    """The `unshare` prefix that runs a command in a mount namespace of its own here (root, or an unprivileged
    user namespace mapping this user to root), or None where neither is allowed."""
    if shutil.which("unshare") is None:
        return None
    prefix = (
        ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    )
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@contextlib.contextmanager
def loopback_only_network() -> Iterator[list[str] | None]:
    """A network namespace whose one interface is loopback (brought up), held open by a sleeping process for the
    block; yields the prefix that runs a command in it, or None where this machine allows no such namespace. What
    listens in it, on any address, listens on loopback only (`unshare -rn`; as root `unshare -n`, the same
    without a user namespace, so that the nodes' files keep their owners). Its processes share the machine's
    process ids, files and mounts: only the network is private."""
    if not all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip")):
        yield None
        return
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    holder = subprocess.Popen(
        ["unshare", *user, "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep 86400"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        if holder.stdout.readline().strip() != "up":
            yield None
            return
        enter = ["nsenter", f"--target={holder.pid}", "--net"]
        yield enter if not user else [*enter, "--user", "--preserve-credentials"]
    finally:
        holder.kill()
        holder.wait()


def start_node(
    folder: Path,
    name: str,
    *,
    ip: str,
    head: str | None = None,
    num_cpus: int = 2,
    resources: dict[str, float] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 180.0,
    hidden: tuple[Path, ...] = (),
    network: list[str] = (),
) -> str:
    """`ray start` for one node of a multi-node cluster on this machine: the head (`head` None) or a node joining
    the head at `head`, with node address `ip` (a loopback address other than 127.0.0.1, which Ray maps to the
    machine's network address once multi-node is on), temp folder `folder`/`name`/ray and working directory
    `folder`/`name`, custom `resources`, `cluster_env` plus `env`. Returns the cluster's address.

    `hidden`: folders this node does not share with the others: its processes run in a mount namespace of their
    own with an empty tmpfs over each (storage a node of a real cluster does not mount). `network`: the prefix that
    runs the node in a network namespace (`loopback_only_network`)."""
    node = folder / name
    node.mkdir(parents=True, exist_ok=True)
    command = [
        RAY,
        "start",
        f"--node-ip-address={ip}",
        f"--num-cpus={num_cpus}",
        "--num-gpus=0",
        f"--temp-dir={node / 'ray'}",
        f"--resources={json.dumps(resources or {})}",
        "--disable-usage-stats",
    ]
    if head is None:
        command += ["--head", f"--port={free_port(ip)}", f"--ray-client-server-port={free_port(ip)}"]
        command += ["--include-dashboard=false"]
    else:
        command += [f"--address={head}"]
    if hidden:
        prefix = mount_namespace_prefix()
        if prefix is None:
            raise RuntimeError("no private mount namespace here (needs root or unprivileged user namespaces)")
        mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(path))}" for path in hidden)
        command = [*prefix, "sh", "-c", f"{mounts} && exec {shlex.join(command)}"]
    command = [*network, *command]
    environment = {**cluster_env(folder), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", **(env or {})}
    done = subprocess.run(
        command, env=environment, cwd=node, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        stop_cluster(folder)
        raise RuntimeError(f"ray start ({name}) failed ({done.returncode}): {done.stderr[-3000:]}")
    address = head or (node / "ray" / "ray_current_cluster").read_text().strip()
    (folder / "gcs_address").write_text(address)
    return address


def stop_cluster(folder: Path, grace_s: float = 3.0) -> list[int]:
    """End this cluster's processes only: those whose command line names `folder` or, for the Ray client server
    a head starts, the cluster's GCS address (recorded in `folder`/gcs_address), and their descendants (never
    this process or its ancestors), with SIGTERM, then SIGKILL for what is alive `grace_s` later (a test cluster's
    state goes with its folder; some of its processes outlive SIGTERM, and waiting 15 s for them cost each
    two-node test 16 s of teardown). Returns their ids."""
    import psutil

    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    marks = [str(folder)]
    if (folder / "gcs_address").is_file():
        marks.append(f"--address={(folder / 'gcs_address').read_text().strip()}")
    mine: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = process.info["cmdline"] or ()
            if process.pid not in spared and any(m in a for m in marks for a in cmdline):
                mine[process.pid] = process
                mine.update((c.pid, c) for c in process.children(recursive=True))
        except psutil.Error:
            continue
    for process in mine.values():
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(list(mine.values()), timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return sorted(mine)


def remove(folder: Path) -> None:
    stop_cluster(folder)
    shutil.rmtree(folder, ignore_errors=True)
