"""A weight-sync collective that fails raises an error naming the group and the remedy, and leaves the process
usable; an NCCL group is built so that a timeout raises instead of killing the process (issue 29, item 6)."""

from __future__ import annotations

import os
import threading
from typing import ClassVar

import pytest
import torch
import torch.distributed as dist

from stare_agents.rollout import weight_sync
from stare_agents.rollout.weight_sync import SyncError, SyncGroup, WeightsPlan, open_group, receive_weights


def _pair(timeout_s: float) -> tuple[SyncGroup, SyncGroup]:
    address, store = open_group("127.0.0.1", 2, "gloo", timeout_s)
    groups: dict[int, SyncGroup] = {}
    joiner = threading.Thread(target=lambda: groups.setdefault(1, SyncGroup(address, 1)))
    joiner.start()
    groups[0] = SyncGroup(address, 0, store=store)
    joiner.join()
    return groups[0], groups[1]


def test_a_timeout_names_the_group_the_members_and_the_remedy_and_the_process_syncs_again():
    sender, receiver = _pair(timeout_s=2.0)
    plan = WeightsPlan.of([("w", (10,))], dtype=torch.float32, version=1)
    with pytest.raises(SyncError) as caught:
        list(receive_weights(receiver, plan))  # the sender never sends
    said = str(caught.value)
    address = receiver.address
    assert f"gloo group at 127.0.0.1:{address.port}" in said and "failed at rank 1" in said
    assert "rank 0 the learner, ranks 1-1 the engines" in said and "2 s timeout" in said
    assert "GLOO_SOCKET_IFNAME" in said and "the next sync forms a new one" in said
    sender.close(), receiver.close()
    sender, receiver = _pair(timeout_s=30.0)  # this process goes on: a new group syncs
    sent = torch.arange(10, dtype=torch.float32)
    thread = threading.Thread(target=weight_sync.send_weights, args=(sender, plan, [sent]))
    thread.start()
    received = dict(receive_weights(receiver, plan))
    thread.join()
    assert torch.equal(received["w"], sent)
    sender.close(), receiver.close()


class _FakeNCCL:
    """Records the environment an NCCL group is constructed in (NCCL reads its error handling there)."""

    seen: ClassVar[list[dict]] = []

    class Options:
        pass

    def __init__(self, store, rank, world_size, options) -> None:
        _FakeNCCL.seen.append({k: os.environ.get(k) for k in weight_sync.NCCL_SYNC_ERROR_HANDLING})


def test_an_nccl_sync_group_aborts_its_communicator_and_raises_instead_of_killing_the_process(monkeypatch):
    """NCCL's default error handling (3) tears the process down at a timeout: the learner's rank 0 died with
    its optimiser state. The group is built with CleanUpOnly (2) and blocking wait, unless the user set them."""
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _FakeNCCL, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for name in (*weight_sync.NCCL_SYNC_ERROR_HANDLING, "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT"):
        monkeypatch.delenv(name, raising=False)
    address, store = open_group("127.0.0.1", 2, "nccl", 5.0)
    _FakeNCCL.seen.clear()
    SyncGroup(address, 0, store=store)
    assert _FakeNCCL.seen == [{"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_BLOCKING_WAIT": "1"}]
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ  # only while the group is built
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # the user's choice stays
    SyncGroup(address, 0, store=store)
    assert _FakeNCCL.seen[-1] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_a_failed_send_draws_the_rest_of_the_weights_so_the_other_learner_ranks_are_not_left_waiting():
    """Under FSDP each tensor the sender draws is a gather every learner rank takes part in: a sender that
    stopped at the failed bucket left the others in their gather until the data-parallel group's timeout."""

    class Failing:
        rank = 0
        device = torch.device("cpu")

        def broadcast(self, tensor):
            raise SyncError("the group failed")

    plan = WeightsPlan.of(
        [(f"w{i}", (4,)) for i in range(6)], dtype=torch.float32, version=1, bucket_mb=16e-6
    )
    assert len(plan.buckets) > 2
    drawn = []

    def tensors():
        for i in range(6):
            drawn.append(i)
            yield torch.zeros(4)

    with pytest.raises(SyncError):
        weight_sync.send_weights(Failing(), plan, tensors())
    assert drawn == list(range(6))
