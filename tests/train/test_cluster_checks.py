"""Cluster configurations that fail hours in are refused or warned about where the config loads (issue 29,
item 4): two ranks of one NCCL group on one GPU, micro-batch normalisation over longest-first packing, and
the weight-sync ranks of tensor-parallel engines."""

from __future__ import annotations

import logging

import pytest
import torch

from stare_agents.rollout import RolloutWorkerGroup, WorkerSpec
from stare_agents.rollout.weight_sync import GroupAddress, VLLMSyncExtension, sync_ranks
from stare_agents.rollout.workers import receiving_processes
from stare_agents.train.config import (
    MICRO_BATCH_SKEW,
    gpu_sharing_problem,
    load_config,
    resolved_weight_sync,
)

GPU_LEARNERS = ["rl.learner_workers=2", "rl.learner_gpus_per_worker=1"]


@pytest.fixture
def driver_gpu(monkeypatch) -> None:
    """The trainer's machine has a GPU (what `torch.cuda.is_available()` says where the config loads)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["rollout.num_gpus_per_worker=0.5", *GPU_LEARNERS], "two engines of the sync group on one GPU"),
        (["rl.learner_workers=2", "rl.learner_gpus_per_worker=0.5"], "two ranks of the learners' NCCL group"),
        (
            ["rollout.num_gpus_per_worker=1", "rollout.weight_sync=collective"],
            "Ray does not count the trainer's GPU",
        ),
    ],
)
def test_two_nccl_ranks_on_one_gpu_are_refused_at_load(driver_gpu, overrides, says) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        load_config(recipe="tiny", overrides=overrides)
    assert "rollout.weight_sync=driver" in str(caught.value) or "whole GPUs" in str(caught.value)


def test_what_cannot_share_a_gpu_loads(driver_gpu) -> None:
    for overrides in (
        ["rollout.num_gpus_per_worker=1", *GPU_LEARNERS],  # the GPU recipes: whole GPUs everywhere
        ["rollout.num_gpus_per_worker=0.5", *GPU_LEARNERS, "rollout.weight_sync=driver"],  # no NCCL group
        ["rollout.num_gpus_per_worker=1"],  # one learner on the trainer's GPU: auto takes the driver path
    ):
        config = load_config(recipe="tiny", overrides=overrides)
        assert gpu_sharing_problem(config, driver_has_gpu=True) is None, overrides
    config = load_config(recipe="tiny", overrides=["rollout.num_gpus_per_worker=1"])
    assert resolved_weight_sync(config, driver_has_gpu=True) == "driver"
    load_config(recipe="qwen2.5-7b-tir-stare-c2")


def test_a_cpu_trainer_with_gpu_engines_syncs_over_gloo_and_loads() -> None:
    config = load_config(
        recipe="tiny", overrides=["rollout.num_gpus_per_worker=0.5", "rollout.weight_sync=collective"]
    )
    assert gpu_sharing_problem(config, driver_has_gpu=False) is None  # a CPU learner sends over gloo


def test_auto_weight_sync_resolves_by_who_holds_which_gpu() -> None:
    def mode(overrides: list[str], driver_has_gpu: bool) -> str:
        return resolved_weight_sync(
            load_config(recipe="tiny", overrides=overrides), driver_has_gpu=driver_has_gpu
        )

    assert mode([], False) == "driver"  # one CPU learner: measured faster
    assert mode([], True) == "collective"  # one GPU learner, CPU engines
    assert mode(["rollout.num_gpus_per_worker=1"], True) == "driver"  # the trainer's GPU is not Ray's
    assert mode(["rl.learner_workers=2"], False) == "collective"
    assert mode(["rollout.weight_sync=collective"], False) == "collective"


def test_micro_batch_normalisation_over_longest_first_packing_warns_with_its_effect(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        load_config(recipe="tiny", overrides=["rl.loss.normalization=micro-batch"])
    assert MICRO_BATCH_SKEW in caplog.text and "0.50" in caplog.text and "0.26" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stare_agents.train"):
        load_config(
            recipe="tiny",
            overrides=["rl.loss.normalization=micro-batch", "rl.learner.micro_batch_packing=balanced"],
        )
        load_config(recipe="tiny")  # global normalisation
        load_config(recipe="qwen2.5-7b-tir-stare-c2")  # micro-batch over verl packing
    assert MICRO_BATCH_SKEW not in caplog.text


def test_each_tensor_parallel_worker_is_a_rank_of_its_own() -> None:
    assert sync_ranks([1, 1]) == (3, [1, 2])  # two HF engines (or vLLM with TP 1)
    assert sync_ranks([2, 2]) == (5, [1, 3])  # two vLLM engines with TP 2: ranks 1-2 and 3-4
    assert sync_ranks([4]) == (5, [1])
    with pytest.raises(ValueError):
        sync_ranks([0])
    tp2 = WorkerSpec(model="m", engine="vllm", engine_kwargs={"tensor_parallel_size": 2}, num_gpus=2)
    assert receiving_processes(tp2) == 2
    assert receiving_processes(WorkerSpec(model="m", engine="hf")) == 1
    assert receiving_processes(WorkerSpec(model="m", engine="vllm")) == 1


def test_the_vllm_extension_joins_as_its_first_rank_plus_its_tp_rank(monkeypatch) -> None:
    import stare_agents.rollout.weight_sync as weight_sync

    joined: list[int] = []
    monkeypatch.setattr(weight_sync.SyncReceiver, "join", lambda self, address, rank: joined.append(rank))

    class Worker(VLLMSyncExtension):  # vLLM's worker class with the extension mixed in
        def __init__(self, rank: int) -> None:
            self.rank = rank

    address = {"host": "127.0.0.1", "port": 1, "world_size": 5}
    for tp_rank in (0, 1):  # the second engine of two with TP 2: first rank 3
        Worker(tp_rank).stare_sync_join(address, 3)
    assert joined == [3, 4]


def test_the_driver_gives_each_engine_its_first_rank_and_counts_every_tp_worker() -> None:
    group = RolloutWorkerGroup.__new__(RolloutWorkerGroup)  # the sync plumbing alone, without engines
    group.spec = WorkerSpec(model="m", engine="vllm", engine_kwargs={"tensor_parallel_size": 2}, num_gpus=2)
    group._local, group._sync_timeout_s = None, 5.0
    calls: list[tuple] = []

    def call(member, method, *args):
        calls.append((member, method, args))
        return lambda timeout: None

    class Sender:
        def open(self, world_size, *, engines_on_gpu, timeout_s):
            assert engines_on_gpu
            return GroupAddress("127.0.0.1", 1234, world_size, "gloo", timeout_s)

        def join(self, address):
            pass

    group._call, group._sender = call, Sender()
    address = group._form_group(["engine-0", "engine-1"])
    assert address.world_size == 5
    assert [(m, args[1]) for m, _, args in calls] == [("engine-0", 1), ("engine-1", 3)]
