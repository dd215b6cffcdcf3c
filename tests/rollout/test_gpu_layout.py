"""GPU engines and learners that do not collide (issue 50, item 3), on CPU with fake device counts: a local Ray
never hands the trainer's learner GPU to an engine; an engine sharded over several GPUs runs vLLM's
multiprocessing executor inside its Ray actor and is refused at load without the GPUs it shards over; a learner
in the trainer's process on a cluster that counts its GPU for the engines is refused at the pre-flight."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from stare_agents.rollout.gpu_layout import VISIBLE, gpus_hidden, visible_gpus
from stare_agents.rollout.vllm_engine import distributed_executor, engine_gpus
from stare_agents.train.config import load_config
from stare_agents.train.preflight import learner_gpus_in_driver, shared_gpu_problem, start_ray

GPU_ENGINES = ["rollout.use_ray=true", "rollout.engine=vllm", "rollout.num_gpus_per_worker=1"]


@pytest.fixture
def four_gpus(monkeypatch) -> None:
    """This process's torch sees four CUDA devices; no CUDA_VISIBLE_DEVICES."""
    monkeypatch.delenv(VISIBLE, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_the_learners_gpu_is_hidden_while_ray_starts_and_back_afterwards(four_gpus, monkeypatch):
    assert visible_gpus() == ["0", "1", "2", "3"]
    with gpus_hidden(1) as left:
        assert left == ["1", "2", "3"] and os.environ[VISIBLE] == "1,2,3"
    assert VISIBLE not in os.environ  # this process keeps its own devices
    monkeypatch.setenv(VISIBLE, "GPU-aa, GPU-bb")  # UUIDs, as a scheduler may set them
    with gpus_hidden(1) as left:
        assert left == ["GPU-bb"] and os.environ[VISIBLE] == "GPU-bb"
    assert os.environ[VISIBLE] == "GPU-aa, GPU-bb"
    with gpus_hidden(0):
        assert os.environ[VISIBLE] == "GPU-aa, GPU-bb"
    monkeypatch.setenv(VISIBLE, "")  # no GPU at all: nothing to hide
    with gpus_hidden(1) as left:
        assert left == [] and os.environ[VISIBLE] == ""


def test_a_run_starts_its_local_ray_without_the_learners_gpu_when_engines_take_gpus(four_gpus, monkeypatch):
    import ray

    import stare_agents.rollout.local_ray as local_ray

    seen: list[str | None] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(
        local_ray, "init_ray", lambda address=None, **kwargs: seen.append(os.environ.get(VISIBLE))
    )
    assert start_ray(load_config(recipe="tiny", overrides=GPU_ENGINES)) == (
        1,
        True,
    )  # one learner, here, on a GPU
    assert start_ray(load_config(recipe="tiny", overrides=["rollout.use_ray=true"])) == (
        0,
        True,
    )  # CPU engines
    learners = [
        "rl.learner_workers=2",
        "rl.learner_gpus_per_worker=1",
    ]  # learners as Ray workers: Ray places them
    assert start_ray(load_config(recipe="tiny", overrides=[*GPU_ENGINES, *learners])) == (0, True)
    assert seen == ["1,2,3", None, None] and VISIBLE not in os.environ
    assert (
        learner_gpus_in_driver(load_config(recipe="tiny", overrides=GPU_ENGINES), driver_has_gpu=False) == 0
    )


HIDDEN = r"""
import json, os, sys
import ray
from stare_agents.rollout.gpu_layout import gpus_hidden
from stare_agents.rollout.local_ray import init_local_ray

os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"  # a machine with four GPUs, as its driver sees them
with gpus_hidden(1) as left:  # num_gpus: what Ray would count from the list on a GPU machine (0 on this CPU)
    init_local_ray(num_cpus=1, num_gpus=len(left), log_to_driver=False)


@ray.remote(num_gpus=1, num_cpus=0)
class Engine:
    def devices(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES")


engines = [Engine.remote() for _ in range(3)]
print(json.dumps({"engines": sorted(ray.get([e.devices.remote() for e in engines])),
                  "gpus": ray.cluster_resources().get("GPU"), "driver": os.environ["CUDA_VISIBLE_DEVICES"]}))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_local_ray_started_without_the_learners_gpu_hands_out_only_the_others(tmp_path):
    """Ray itself: a node started inside gpus_hidden(1) counts 3 GPUs and gives its workers 1, 2 and 3, never the
    learner's device 0 (a fake count on this CPU machine: Ray takes the ids from CUDA_VISIBLE_DEVICES)."""
    import json

    script = tmp_path / "hidden.py"
    script.write_text(HIDDEN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said == {"engines": ["1", "2", "3"], "gpus": 3.0, "driver": "0,1,2,3"}


@pytest.mark.parametrize(
    ("hidden", "started_here", "node_gpus", "says"),
    [
        (0, False, 8.0, None),  # no learner in the trainer's process on a GPU
        (1, True, 3.0, None),  # a local Ray without the learner's GPU, three left for the engines
        (1, True, 0.0, "no GPU is left for the rollout workers"),  # a one-GPU machine
        (1, False, 0.0, None),  # attached, from a node whose `ray start` counts no GPU
        (1, False, 8.0, "an engine may be given the learner's GPU"),  # attached, from a GPU node
    ],
)
def test_a_learner_gpu_an_engine_could_share_is_refused_with_the_remedy(
    hidden, started_here, node_gpus, says
):
    problem = shared_gpu_problem(hidden, started_here, node_gpus)
    assert (problem is None) if says is None else (says in problem)
    if says and not started_here:
        assert "--num-gpus=0" in problem and "rl.learner_workers >= 2" in problem


def test_an_engine_sharded_over_gpus_runs_vllms_process_executor_in_its_actor():
    assert engine_gpus({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert distributed_executor(True, {"tensor_parallel_size": 2}) == "mp"
    assert distributed_executor(True, {"tensor_parallel_size": 1, "pipeline_parallel_size": 2}) == "mp"
    assert distributed_executor(True, {"tensor_parallel_size": 1}) is None  # one GPU: vLLM's own choice
    assert distributed_executor(False, {"tensor_parallel_size": 2}) is None  # CPU engines run "uni"
    assert (
        distributed_executor(True, {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}) is None
    )


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["rollout.tensor_parallel_size=2", "rollout.num_gpus_per_worker=1"],
            "set rollout.num_gpus_per_worker=2",
        ),
        (["rollout.tensor_parallel_size=2"], "its workers take none"),
        (["rollout.tensor_parallel_size=2", "rollout.num_gpus_per_worker=1.5"], "Ray gives the worker 1.5"),
        (
            [
                "rollout.tensor_parallel_size=2",
                "rollout.num_gpus_per_worker=2",
                "rollout.engine_kwargs={pipeline_parallel_size: 2}",
            ],
            "set rollout.num_gpus_per_worker=4",
        ),
        (
            ["rollout.num_gpus_per_worker=1", "rollout.engine_kwargs={pipeline_parallel_size: two}"],
            "allowed: an int >= 1",
        ),
        (
            ["rollout.num_gpus_per_worker=1", "rollout.engine_kwargs={pipeline_parallel_size: 0}"],
            "allowed: an int >= 1",
        ),
    ],
)
def test_an_engine_without_the_gpus_it_shards_over_is_refused_at_load(overrides, says):
    with pytest.raises(
        ValueError, match=r"rollout\.(tensor_parallel_size|engine_kwargs\.pipeline_parallel_size)"
    ) as caught:
        load_config(recipe="tiny", overrides=["rollout.engine=vllm", *overrides])
    assert says in str(caught.value)
    config = load_config(
        recipe="tiny",
        overrides=["rollout.engine=vllm", "rollout.tensor_parallel_size=2", "rollout.num_gpus_per_worker=2"],
    )
    assert config.worker_spec("m").engine_kwargs["tensor_parallel_size"] == 2
