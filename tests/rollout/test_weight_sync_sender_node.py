"""The weight-sync group is opened by the learner on its own node, never by the driver (issue 29, item 2).

The driver used to pick the group's port by binding learner rank 0's node address itself (`free_address`):
with the driver on another node that bind fails ("Cannot assign requested address") at the first sync, after
hours of SFT. Now the learner (rank 0's actor) opens the group in its own process, binds the store's port
there and reports the address; the driver only passes it on.
"""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path

import pytest
import torch

from stare_agents.algo import AlgorithmConfig
from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
from stare_agents.rollout.weight_sync import SyncGroup, address_towards, open_group
from stare_agents.train.learner import Learner, LearnerConfig


def test_a_group_on_a_network_address_listens_before_its_address_is_known() -> None:
    """Off loopback the sender's TCP store is bound (port 0: the kernel's pick) before the address leaves it."""
    import psutil

    found = [
        a.address
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not found:
        pytest.skip("this machine has no network address to open a TCP store on")
    here = found[0]
    address, store = open_group(here, 2, "gloo", 5.0)
    assert address.store_path is None and address.host == here and address.port > 0
    with socket.create_connection((here, address.port), timeout=5):  # already listening
        pass
    with socket.socket() as other, pytest.raises(OSError):
        other.bind((here, address.port))  # and nobody else can take the port
    del store


def test_a_member_binds_its_own_address_on_the_route_to_the_sender(monkeypatch) -> None:
    assert address_towards("127.0.0.1") == "127.0.0.1"
    made: list[dict] = []
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    import stare_agents.rollout.weight_sync as weight_sync

    # an in-process rollout worker of an earlier test in this process (with Ray up) sets its node's address here
    monkeypatch.delenv(weight_sync.NODE_ADDRESS_ENV, raising=False)

    monkeypatch.setattr(weight_sync, "address_towards", lambda host: "10.9.8.7")
    monkeypatch.setattr(
        weight_sync.dist.ProcessGroupGloo, "create_device", staticmethod(lambda **kw: made.append(kw))
    )
    remote = weight_sync.GroupAddress("10.1.1.1", 1234, 3, "gloo", 5.0)
    weight_sync.gloo_device(remote, 0)
    weight_sync.gloo_device(remote, 2)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth1,eth2")
    weight_sync.gloo_device(remote, 2)
    assert made == [{"hostname": "10.1.1.1"}, {"hostname": "10.9.8.7"}, {"interface": "eth1"}]


def test_the_sender_opens_the_group_and_joins_with_its_store(tiny_model: Path) -> None:
    learner = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    sender = learner.sender  # a ModelSender beside its receiver, in stare_agents.rollout.weight_sync
    address = sender.open(2, engines_on_gpu=True, timeout_s=30.0)  # a CPU learner: gloo
    assert address.backend == "gloo" and address.host == "127.0.0.1" and address.store_path is not None
    assert list(sender._stores) == [address.port]
    receiver: dict[int, SyncGroup] = {}
    joiner = threading.Thread(target=lambda: receiver.setdefault(1, SyncGroup(address, 1)))
    joiner.start()
    sender.join(address)
    joiner.join()
    assert sender._stores == {} and address.port in sender._groups
    sender.leave(address.port)
    assert sender._groups == {}
    receiver[1].close()


@pytest.mark.ray
def test_a_driver_that_cannot_bind_the_learners_address_still_syncs(local_ray, tiny_model, monkeypatch):
    """Learner rank 0 is a Ray actor; the driver (with an in-process engine) is made unable to bind the
    learner's node address, as a driver on another node is: the sync goes through, the engine holds the
    learner's weights."""
    ray = local_ray
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup

    learner = LearnerGroup(
        tiny_model,
        AlgorithmConfig.preset("grpo"),
        LearnerConfig(),
        DistributedConfig(num_workers=1, num_cpus_per_worker=0.5),
    )
    spec = WorkerSpec(model=str(tiny_model), engine="hf", dtype="float32", max_model_len=256, sandbox="none")
    group = RolloutWorkerGroup(spec, use_ray=False)
    learner_node = ray.get(
        learner.workers[0].__ray_call__.remote(lambda w: __import__("ray").util.get_node_ip_address())
    )
    real_bind = socket.socket.bind

    def bind(self, address):  # this process is "on another node": the learner's address is not one of its own
        if isinstance(address, tuple) and address[0] == learner_node:
            raise OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
        return real_bind(self, address)

    try:
        ray.get(
            learner.workers[0].__ray_call__.remote(
                lambda w: [p.data.add_(0.05) for p in w.learner.model.parameters()] and None
            )
        )
        with monkeypatch.context() as patch:
            patch.setattr(socket.socket, "bind", bind)
            assert group.update_weights_from(learner.sender) == 1
        sent = learner.model_state_dict()
        held = group._local.engine.model.state_dict()
        assert all(torch.equal(held[name], tensor) for name, tensor in sent.items() if name in held)
    finally:
        group.close()
        learner.close()
