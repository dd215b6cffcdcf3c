"""Two data-parallel gloo workers (Ray actors) take the same update as one learner on the same batch.

Tolerance: parameters within 2e-6 after one AdamW step at lr 1e-3 (Adam eps 1e-5) and metrics within a
relative 1e-5. The workers sum gradients in another order than one learner accumulating them, so the
floats differ in the last bits; a real difference (a lost micro-batch, a wrong normaliser) moves
parameters by ~1e-3.
"""

import pytest
import torch
from learner_support import assert_same_metrics, make_learner, max_param_diff, rollouts, step_inputs

from stare_agents.algo import AlgorithmConfig, StareConfig
from stare_agents.train.distributed import DistributedConfig, LearnerGroup, deal_micro_batches
from stare_agents.train.learner import Learner, LearnerConfig
from stare_agents.train.policy import OptimizerConfig, split_step


@pytest.fixture(scope="module")
def ray_cluster(local_ray):
    """The folder's shared local Ray (tests/conftest.py)."""
    return local_ray


def _config():
    return LearnerConfig(optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), micro_batch_tokens=100)


@pytest.mark.parametrize(("scope", "fsdp"), [("micro-batch", False), ("batch", True)])
def test_two_gloo_workers_take_the_same_update_as_one_learner(
    ray_cluster, tiny_model_dir, tmp_path, scope, fsdp
):
    """Plain data parallel (gradients summed by the learner) and FSDP2 on CPU (sharded parameters,
    gradients reduce-scattered); scope "batch" also gathers the surprisal of both workers. Sharded checkpoints:
    each worker writes its own shards (torch.distributed.checkpoint, nothing through the driver), and a new group
    that loads them takes the same next step as the group that wrote them."""
    _, batch, advantages = step_inputs(14, groups=3)
    algorithm = AlgorithmConfig(stare=StareConfig(scope=scope, target_entropy=100.0, variant="C2"))
    distributed = DistributedConfig(num_workers=2, fsdp=fsdp)
    group = LearnerGroup(tiny_model_dir, algorithm, _config(), distributed)
    try:
        single = Learner.from_pretrained(tiny_model_dir, algorithm, _config())
        for step in range(3):  # later steps start from the synchronised replicas
            if step == 2:  # the shards after two steps, for the resumed group below
                small = group.save_shards(tmp_path / "shards")
                assert small["step_count"] == 2 and "model" not in small and "optimizer" not in small
                assert any((tmp_path / "shards").iterdir())
                # and a checkpoint round trip through the driver changes nothing
                group.load_state_dict(group.state_dict())
            record = step == 1  # per-token records for saved rollouts
            expected = single.step(batch, advantages, record_tokens=record)
            got = group.step(batch, advantages, record_tokens=record)
            assert got["learner/micro_batches"] >= 3 and got["stare/gate_on"] == 1.0
            assert_same_metrics(expected, got, rel=1e-5)
            assert group.gate_on is single.gate_on is True
            assert got.gate_on is expected.gate_on is True
            assert bool(got.token_records) is record
            assert_same_token_records(expected.token_records, got.token_records)
        replica = make_learner(algorithm)
        weights = group.model_state_dict()
        replica.model.load_state_dict(weights)
        assert max_param_diff(single.model, replica.model) < 2e-6
        assert group.state_dict()["step_count"] == 3
    finally:
        group.close()
    resumed = LearnerGroup(tiny_model_dir, algorithm, _config(), distributed)
    try:
        resumed.load_shards(tmp_path / "shards", small)
        again = resumed.step(batch, advantages)  # AdamW's moments came back too: the same update
        assert_same_metrics(got, again, rel=1e-6)
        state = resumed.model_state_dict()
        assert max(float((weights[k] - state[k]).abs().max()) for k in weights) < 1e-7
    finally:
        resumed.close()


def assert_same_token_records(expected: dict, got: dict) -> None:
    """Every row from one of the workers (FSDP's all-masked fillers never overwrite a row), the same
    log-probs to float noise and the same STARE selection but for tokens at the quantile's edge."""
    assert sorted(got) == sorted(expected)
    tokens = agree = 0
    for row, record in expected.items():
        other = got[row]
        assert torch.allclose(
            torch.tensor(other.learner_logprobs), torch.tensor(record.learner_logprobs), atol=1e-4
        )
        tokens += len(record.selection)
        agree += sum(a == b for a, b in zip(record.selection, other.selection, strict=True))
        assert all(
            abs(a - b) < 1e-6 or sa != sb
            for a, b, sa, sb in zip(
                record.stare_weights, other.stare_weights, record.selection, other.selection, strict=True
            )
        )
    assert agree >= 0.99 * tokens


@pytest.mark.parametrize("fsdp", [False, True])
def test_sft_on_two_gloo_workers_takes_the_same_steps_as_one_trainer_and_resumes_from_its_shards(
    ray_cluster, tiny_model_dir, tmp_path, fsdp
):
    """SFT for a model that does not fit one device: each step's micro-batches dealt to the workers (FSDP: an
    all-masked filler evens them out), gradients summed. The group's fit is stopped mid-epoch (max_steps), its
    sharded checkpoint read into a new group (as after a crash), and the two groups together take the steps, epoch
    figures and weights of one trainer's uninterrupted fit."""
    from stare_agents.train.checkpoint import load_checkpoint
    from stare_agents.train.distributed import SFTGroup
    from stare_agents.train.sft import SFTConfig, SFTTrainer

    trajectories = rollouts(
        3, groups=3, group_size=5
    )  # 15 traces, 2 steps of 8 an epoch (the last one short)
    config = SFTConfig(
        optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), epochs=2, batch_size=8, micro_batch_tokens=60
    )
    single = SFTTrainer.from_pretrained(tiny_model_dir, config)
    expected_steps: list[dict] = []
    expected = single.fit(trajectories, on_step=expected_steps.append)
    path = tmp_path / "sft_checkpoint"
    got_steps: list[dict] = []
    first = SFTGroup(tiny_model_dir, config, DistributedConfig(num_workers=2, fsdp=fsdp))
    try:
        history = first.fit(
            trajectories, max_steps=3, on_step=got_steps.append
        )  # epoch 1, epoch 2's first step
        assert [h["epoch"] for h in history] == [1.0] and first.fitting
        first.save_checkpoint({"traces": "x"}, path, tokenizer_dir=tiny_model_dir)
    finally:
        first.close()
    second = SFTGroup(tiny_model_dir, config, DistributedConfig(num_workers=2, fsdp=fsdp))
    try:
        second.resume(path, load_checkpoint(path))
        assert second.fitting
        rest = second.fit(trajectories, on_step=got_steps.append)
        assert [h["epoch"] for h in rest] == [2.0] and not second.fitting
        assert len(got_steps) == len(expected_steps) == 4
        for a, b in zip([*expected, *expected_steps], [*history, *rest, *got_steps], strict=True):
            for key in ("loss", "entropy", "action_tokens", "tokens", "grad_norm"):
                assert b[key] == pytest.approx(a[key], rel=1e-5), key
        replica = make_learner()
        replica.model.load_state_dict(second.model_state_dict())
        assert max_param_diff(single.model, replica.model) < 2e-6
    finally:
        second.close()


def test_micro_batches_are_dealt_round_robin_and_padded_for_fsdp():
    _, batch, advantages = step_inputs(15)
    plan = split_step(batch, advantages, mini_batches=1, micro_batch_tokens=60)
    parts = deal_micro_batches(plan, 2, equal_counts=False)
    assert [mb.rows for mb in parts[0][0]] == [mb.rows for mb in plan[0][0::2]]
    assert [mb.rows for mb in parts[1][0]] == [mb.rows for mb in plan[0][1::2]]
    odd = [plan[0][:3]]
    padded = deal_micro_batches(odd, 2, equal_counts=True)
    assert [len(p[0]) for p in padded] == [2, 2]
    assert padded[1][0][1].filler and padded[1][0][1].num_action_tokens == 0
    assert torch.equal(padded[1][0][1].batch.input_ids, odd[0][0].batch.input_ids)


def test_distributed_config_is_checked():
    with pytest.raises(ValueError, match="backend"):
        DistributedConfig(backend="mpi")
    with pytest.raises(ValueError, match="num_workers"):
        DistributedConfig(num_workers=0)
    assert DistributedConfig().resolved_backend == "gloo"
    assert DistributedConfig(num_gpus_per_worker=1).resolved_backend == "nccl"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fsdp_half_precision_keeps_float32_master_weights_and_computes_in_half(
    ray_cluster, tiny_model_dir, precision
):
    """precision bf16 or fp16 under FSDP: every sharded module all-gathers its parameters in the half dtype and
    reduce-scatters gradients in float32; the sharded master weights stay float32 (fp16: gradients of the
    scaled loss, unscaled before clipping). The step lands near the float32 step."""
    import sys

    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    _, batch, advantages = step_inputs(14, groups=3)
    algorithm = AlgorithmConfig(stare=StareConfig(scope="batch", target_entropy=100.0, variant="C2"))
    config = LearnerConfig(
        optimizer=OptimizerConfig(lr=1e-3, eps=1e-5), micro_batch_tokens=100, precision=precision
    )
    group = LearnerGroup(tiny_model_dir, algorithm, config, DistributedConfig(num_workers=2, fsdp=True))
    try:
        policies = ray_cluster.get([w.__ray_call__.remote(_mixed_precision) for w in group.workers])
        half = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[precision]
        assert policies == [(half, "torch.float32", "torch.float32")] * 2
        got = group.step(batch, advantages)
        assert got["learner/loss_scale"] == (2.0**16 if precision == "fp16" else 1.0)
        assert got["learner/skipped_updates"] == 0.0
        single = Learner.from_pretrained(tiny_model_dir, algorithm, _config())  # float32
        expected = single.step(batch, advantages)
        assert got["learner/loss"] == pytest.approx(expected["learner/loss"], rel=0.05, abs=1e-3)
        replica = make_learner(algorithm)
        replica.model.load_state_dict(group.model_state_dict())
        assert all(t.dtype == torch.float32 for t in group.model_state_dict().values())
        # Adam at lr 1e-3 moves each weight by up to ~1e-3: bf16 rounding may flip the sign of a tiny gradient
        # (at most 2e-3 apart), but on average the two steps are the same step
        a, b = single.model.state_dict(), replica.model.state_dict()
        diffs = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
        moved = torch.cat([(a[k] - make_learner(algorithm).model.state_dict()[k]).abs().flatten() for k in a])
        assert float(diffs.max()) < 2.5e-3 and float(diffs.mean()) < 0.2 * float(moved.mean()), (
            float(diffs.mean()),
            float(moved.mean()),
        )
    finally:
        group.close()


def _mixed_precision(worker) -> tuple[str, str, str]:
    """(param dtype, reduce dtype) of the first decoder layer's FSDP policy and the dtype of its master shard."""
    layer = worker.learner.policy.decoder.layers[0]
    policy = layer._get_fsdp_state()._mp_policy
    shard = next(layer.parameters()).to_local()
    return str(policy.param_dtype), str(policy.reduce_dtype), str(shard.dtype)
