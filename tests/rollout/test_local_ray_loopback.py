"""A local run's Ray and torch.distributed listen on loopback only (issue 21).

Starts Ray the way the rollout workers do (`init_local_ray`), runs an actor and a task, forms a two-rank gloo
group through the learner workers' rendezvous (`LearnerWorker.address`), and while all of that is alive
lists every listening TCP socket of this process and its descendants (the GCS, raylet, agents, workers):
each must be bound to a loopback address. A plain `ray.init()` fails this (its servers listen on `::`).
"""

from __future__ import annotations

import ipaddress

import pytest

pytestmark = pytest.mark.ray


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def listening_sockets() -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of this process and its descendants."""
    import psutil

    me = psutil.Process()
    found = []
    for process in [me, *me.children(recursive=True)]:
        try:
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN:
                    found.append((process.name(), connection.laddr.ip, connection.laddr.port))
        except psutil.Error:
            continue
    return found


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")


def test_local_ray_and_the_learners_process_group_listen_on_loopback_only(local_ray) -> None:
    ray = local_ray
    from stare_agents.train.distributed import LearnerWorker

    assert ray.util.get_node_ip_address() == "127.0.0.1"

    @ray.remote
    class Echo:
        def ping(self) -> str:
            return "pong"

    @ray.remote
    def gloo_rank(rank: int, address: str) -> list[tuple[str, str, int]]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)
        total = torch.ones(2)
        dist.all_reduce(total)
        assert total.tolist() == [2.0, 2.0]
        dist.barrier()
        import psutil  # this process's sockets while the group is up (the helper above is not shipped here)

        held = [
            (f"gloo rank {rank}", c.laddr.ip, c.laddr.port)
            for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        dist.barrier()
        dist.destroy_process_group()
        return held

    echo = Echo.remote()
    assert ray.get(echo.ping.remote()) == "pong"
    address = ray.get(ray.remote(LearnerWorker).remote(0, 2, 1).address.remote())
    assert address.startswith("file://"), address
    held = ray.get([gloo_rank.remote(rank, address) for rank in range(2)], timeout=120)
    sockets = listening_sockets() + [entry for group in held for entry in group]
    names = {name for name, _, _ in sockets}
    assert any("raylet" in name for name in names) and any("gcs" in name for name in names), sockets
    routable = [entry for entry in sockets if not is_loopback(entry[1])]
    assert routable == [], routable
