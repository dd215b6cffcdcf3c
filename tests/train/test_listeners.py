"""The unauthenticated listeners of a multi-node run listen on the address their peers use, not on every
interface (issue 50, item 10): the weight-sync group's TCP store (opened by the learner's rank 0) and the learners'
`tcp://` rendezvous store (rank 0's). torch's TCPStore, given a host, still listens on all interfaces; here it is
handed a socket bound to the host. Checked on this machine's non-loopback address (a cluster node's), by listing
every listening TCP socket of the processes; with GLOO_SOCKET_IFNAME naming that address's interface, gloo's own
sockets are there too."""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import threading

import pytest
import torch

from stare_agents.rollout.weight_sync import (
    SyncGroup,
    WeightsPlan,
    listening_store,
    open_group,
    receive_weights,
    send_weights,
)

LISTENING = r"""
def listening():
    import ipaddress, os
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for table, size in (("/proc/self/net/tcp", 4), ("/proc/self/net/tcp6", 16)):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in mine:  # LISTEN, one of this process's sockets
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)
                host = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
                found.append([str(ipaddress.ip_address(host)), int(port, 16)])
    return found
"""
_defined: dict = {}
exec(LISTENING, _defined)  # the same function here and in the rank processes
listening = _defined["listening"]


def interfaces() -> dict[str, str]:
    """This machine's IPv4 addresses by interface name."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # SIOCGIFADDR: no IPv4 address on it
                continue
            found[name] = socket.inet_ntoa(packed[20:24])
    return found


@pytest.fixture
def node_address() -> tuple[str, str]:
    """(interface, address) of a non-loopback IPv4 address of this machine: a cluster node's."""
    routable = [(n, a) for n, a in interfaces().items() if not ipaddress.ip_address(a).is_loopback]
    if not routable:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return routable[0]


def test_a_store_listens_on_its_host_only(node_address):
    _, host = node_address
    store = listening_store(host, 2, datetime.timedelta(seconds=30))
    assert [address for address, port in listening() if port == store.port] == [host]  # not 0.0.0.0 or ::
    peer = torch.distributed.TCPStore(
        host, store.port, 2, is_master=False, timeout=datetime.timedelta(seconds=30)
    )
    peer.set("k", "v")
    assert store.get("k") == b"v"


def test_the_weight_sync_group_on_a_node_address_listens_there_only(node_address):
    _, host = node_address
    address, store = open_group(host, 2, "gloo", 60.0)
    assert address.store_path is None and address.host == host  # a TCP store: the node is not loopback
    tensors = {"w": torch.arange(6.0).reshape(2, 3)}
    plan = WeightsPlan.of(((n, t.shape) for n, t in tensors.items()), dtype=torch.float32, version=1)
    received = {}

    def engine() -> None:
        member = SyncGroup(address, 1)
        received.update((n, t.clone()) for n, t in receive_weights(member, plan))
        member.close()

    thread = threading.Thread(target=engine)
    thread.start()
    sender = SyncGroup(address, 0, store=store)
    send_weights(sender, plan, tensors.values())
    thread.join(60)
    on_store_port = [a for a, port in listening() if port == address.port]
    sender.close()
    assert torch.equal(received["w"], tensors["w"])
    assert on_store_port == [host]


RANK = (
    LISTENING
    + r"""
import json, sys
import torch
import torch.distributed as dist
from stare_agents.train.distributed import LearnerWorker, join_process_group

rank, host = int(sys.argv[1]), sys.argv[2]
worker = LearnerWorker(rank, 2, 1)
if rank == 0:  # what LearnerWorker.address does on a cluster node: the store, listening on the node's address
    import ray.util
    ray.util.get_node_ip_address = lambda: host
    address = worker.address()
    print(address, flush=True)
else:
    address = sys.stdin.readline().strip()
join_process_group(address, "gloo", rank, 2, store=worker._store)
total = torch.ones(1)
dist.all_reduce(total)
found = listening()
dist.barrier()
worker.close()
print(json.dumps({"sum": total.item(), "listening": found, "address": address}))
"""
)


def test_the_learners_tcp_rendezvous_listens_on_the_nodes_address_only(node_address, tmp_path):
    interface, host = node_address
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": interface}
    first = subprocess.Popen(
        [sys.executable, str(script), "0", host], stdout=subprocess.PIPE, text=True, env=env
    )
    address = first.stdout.readline().strip()
    assert address.startswith(f"tcp://{host}:"), address
    second = subprocess.Popen(
        [sys.executable, str(script), "1", host],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    second.stdin.write(address + "\n")
    second.stdin.flush()
    reports = [json.loads(p.communicate(timeout=240)[0].splitlines()[-1]) for p in (first, second)]
    assert [r["sum"] for r in reports] == [2.0, 2.0]
    listeners = [a for r in reports for a, _ in r["listening"]]
    assert listeners and set(listeners) == {host}, reports  # the store's and gloo's: none on every interface
