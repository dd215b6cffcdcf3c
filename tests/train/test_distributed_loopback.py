"""A local learner group listens on loopback only, wherever the hostname resolves (issue 32, item 4).

gloo binds its sockets to the address the machine's hostname resolves to; on many cluster and cloud nodes that
is a LAN address, and a "single-machine" run's ranks then listen there, unauthenticated. The test gives a
child a mount namespace of its own whose /etc/hosts maps the hostname to a non-loopback address of this
machine, forms a two-rank gloo group there the way the learner workers do on a local Ray (the rendezvous
`LearnerWorker.address` makes for node 127.0.0.1, `join_process_group`, `LearnerWorker.close`), lists every
listening TCP socket of each rank, and then removes the rendezvous as the group's close does.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
import sys

import pytest
from support import require

RANK = r"""
import ipaddress, json, os, sys
import torch
import torch.distributed as dist
from stare_agents.train.distributed import LearnerWorker, join_process_group

rank, address = int(sys.argv[1]), sys.argv[2]
worker = LearnerWorker(rank, 2, 1)
join_process_group(address, "gloo", rank, 2)
total = torch.ones(1)
dist.all_reduce(total)
mine = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        mine.add(target[8:-1])
listening = []
for table, size in (("/proc/self/net/tcp", 4), ("/proc/self/net/tcp6", 16)):
    for line in open(table).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in mine:  # LISTEN, one of this process's sockets
            raw = bytes.fromhex(fields[1].split(":")[0])
            host = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            listening.append(str(ipaddress.ip_address(host)))
dist.barrier()
worker.close()
print(json.dumps({"sum": total.item(), "listening": listening}))
"""

GROUP = r"""
import json, os, socket, subprocess, sys
from stare_agents.train.distributed import remove_rendezvous, rendezvous_address

address = rendezvous_address("127.0.0.1")  # what LearnerWorker.address gives on a local Ray
folder = os.path.dirname(address.removeprefix("file://"))
ranks = [
    subprocess.Popen([sys.executable, sys.argv[1], str(rank), address], stdout=subprocess.PIPE, text=True)
    for rank in range(2)
]
reports = [json.loads(rank.communicate(timeout=240)[0].splitlines()[-1]) for rank in ranks]
private = oct(os.stat(folder).st_mode & 0o777)
remove_rendezvous(address)  # what the group's close has rank 0 do once every rank has left
print(json.dumps({
    "resolved": socket.gethostbyname(socket.gethostname()),
    "ranks": reports,
    "folder": folder,
    "mode": private,
    "left": os.path.exists(folder),
}))
"""


def ipv4_addresses() -> list[str]:
    """This machine's IPv4 addresses, one per interface that has one."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # SIOCGIFADDR: no IPv4 address on it
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return found


def private_mount_namespace() -> list[str] | None:
    """The `unshare` prefix that gives a child its own mount namespace here, or None."""
    if shutil.which("unshare") is None:
        return None
    prefix = (
        ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    )
    probe = subprocess.run([*prefix, "true"], capture_output=True)
    return prefix if probe.returncode == 0 else None


def test_a_local_learner_group_listens_on_loopback_only_when_the_hostname_resolves_elsewhere(tmp_path):
    prefix = private_mount_namespace()
    require(prefix is not None, "a private mount namespace (root, or unprivileged user namespaces)")
    routable = [address for address in ipv4_addresses() if not ipaddress.ip_address(address).is_loopback]
    if not routable:
        pytest.skip("this machine has no non-loopback IPv4 address for the hostname to resolve to")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{routable[0]} {socket.gethostname()}\n")
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "group.py").write_text(GROUP)
    shell = f'mount --bind "{hosts}" /etc/hosts && exec "{sys.executable}" "{tmp_path}/group.py" "{tmp_path}/rank.py"'
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*prefix, "sh", "-c", shell], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["resolved"] == routable[0]  # the hostname does resolve elsewhere in there
    assert [rank["sum"] for rank in report["ranks"]] == [2.0, 2.0]
    listening = [address for rank in report["ranks"] for address in rank["listening"]]
    assert listening, report  # gloo's own listeners were found
    assert [a for a in listening if not ipaddress.ip_address(a).is_loopback] == [], report
    assert report["mode"] == "0o700" and not report["left"], report


@pytest.mark.ray
def test_a_local_learner_groups_rendezvous_folder_is_gone_after_close(local_ray, tiny_model_dir):
    """The real group on a local Ray (the folder's shared one, tests/conftest.py): rank 0 made the folder, and
    `close` removes it once every rank left."""
    import glob
    import tempfile

    from stare_agents.algo import AlgorithmConfig
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup
    from stare_agents.train.learner import LearnerConfig

    pattern = tempfile.gettempdir() + "/stare-rendezvous-*"
    before = set(glob.glob(pattern))
    group = LearnerGroup(
        str(tiny_model_dir), AlgorithmConfig.preset("grpo"), LearnerConfig(), DistributedConfig(num_workers=2)
    )
    made = set(glob.glob(pattern)) - before
    group.close()
    assert len(made) == 1 and [path for path in made if glob.glob(path)] == [], made
