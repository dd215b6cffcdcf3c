"""Where the learner ranks of a process group meet: a private file on one machine, rank 0's node address on a
cluster; gloo's and NCCL's sockets kept on loopback when every rank is local (train/distributed.py uses these)."""

from __future__ import annotations

import datetime
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import torch.distributed as dist

from stare_agents.rollout.weight_sync import is_loopback, listening_store

RENDEZVOUS_PREFIX = "stare-rendezvous-"
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=10)  # the ranks' wait for each other at the rendezvous


def rendezvous_address(host: str) -> str:
    """Where the ranks of a process group meet, made by rank 0 on its node `host`. On a local Ray (node IP
    127.0.0.1, so every rank is on this machine) a store file in a fresh private folder (0700): nothing
    listens for it (torch's TCPStore binds to all interfaces whatever the host); so on any loopback address
    (127.0.0.0/8: nodes of a rehearsal on one machine, see the README's cluster section). On a cluster, rank 0's
    store listens on a port of its node's address only (`LearnerWorker.address`), the `tcp://` address."""
    if not is_loopback(host):
        raise ValueError(
            f"rendezvous_address is for loopback hosts; {host!r} is not (see LearnerWorker.address)"
        )
    import tempfile

    return "file://" + str(Path(tempfile.mkdtemp(prefix=RENDEZVOUS_PREFIX)) / "store")


def loopback_interface() -> str:
    """The name of this machine's loopback interface ("lo" on Linux, "lo0" on macOS and the BSDs)."""
    names = {name for _, name in socket.if_nameindex()}
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise RuntimeError(
        f"no loopback interface among {sorted(names)}: cannot keep the learners' sockets local"
    )


def join_process_group(address: str, backend: str, rank: int, world_size: int, *, store: Any = None) -> None:
    """`dist.init_process_group` for one rank. Where every rank is on this machine (a `file://` rendezvous),
    gloo's and NCCL's own sockets are bound to the loopback interface first: left alone, gloo binds to the
    address the hostname resolves to (a LAN address on many cluster and cloud nodes), unauthenticated. On a
    cluster (`tcp://`) rank 0's store listens on its node's address only (`store`: the one `LearnerWorker.address`
    opened; made here when not given) and the other ranks connect to it."""
    if address.startswith("file://"):
        interface = loopback_interface()
        os.environ["GLOO_SOCKET_IFNAME"] = interface  # read when the gloo group makes its device
        os.environ["NCCL_SOCKET_IFNAME"] = interface  # NCCL's bootstrap and, between processes, its sockets
    if address.startswith("tcp://"):
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        if store is None and rank == 0:  # an address given without its store: it listens from here
            store = listening_store(host, world_size, RENDEZVOUS_TIMEOUT, port=int(port))
        elif store is None:
            store = dist.TCPStore(host, int(port), world_size, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
        return
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world_size)


def remove_rendezvous(address: str) -> None:
    """Remove the folder of a `file://` rendezvous (`rendezvous_address`'s) once every rank has left."""
    if address.startswith("file://"):
        folder = Path(address.removeprefix("file://")).parent
        if folder.name.startswith(RENDEZVOUS_PREFIX):
            shutil.rmtree(folder, ignore_errors=True)
