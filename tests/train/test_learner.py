"""The RL learner on a tiny random Llama: log-probs, masking, micro-batching, STARE scope, gate, safety."""

import math

import pytest
import torch
from learner_support import (
    TIMING,
    assert_same_metrics,
    make_learner,
    max_param_diff,
    rollouts,
    step_inputs,
    tiny_model,
)

from stare_agents.algo import AlgorithmConfig, StareConfig
from stare_agents.algo.reweighting import SelectionSums
from stare_agents.train.learner import LEARNER_METRICS, Learner, LearnerConfig
from stare_agents.train.policy import (
    OptimizerConfig,
    PolicyModel,
    plan_micro_batches,
    slice_batch,
    split_step,
)
from stare_agents.trajectory import Trajectory, collate


def _naive_stats(model, batch):
    """Full-vocabulary log_softmax of the plain HF forward, at the action tokens."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.float()
    p, r = batch.prompt_length, batch.response_length
    logp = torch.log_softmax(logits[:, p - 1 : p - 1 + r], dim=-1)
    mask = batch.action_mask
    logprob = logp.gather(-1, batch.response_ids[..., None]).squeeze(-1) * mask
    entropy = -(logp.exp() * logp).sum(-1) * mask
    return logprob, entropy


@pytest.mark.parametrize("tied", [True, False])
def test_logprobs_entropy_and_their_gradients_match_a_naive_full_log_softmax(tied):
    _, batch, _ = step_inputs(1)
    model = tiny_model(3, tied=tied)
    policy = PolicyModel(model, head_chunk_rows=7)  # several chunks, the last one partial
    coef = torch.randn(batch.action_mask.shape, generator=torch.Generator().manual_seed(0))
    stats = policy(batch)
    (stats.logprob * coef + 0.3 * stats.entropy).sum().backward()
    chunked_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logprob, entropy = _naive_stats(model, batch)
    (logprob * coef + 0.3 * entropy).sum().backward()
    assert torch.allclose(stats.logprob, logprob, atol=1e-5)
    assert torch.allclose(stats.entropy, entropy, atol=1e-5)
    for name, param in model.named_parameters():
        assert torch.allclose(chunked_grads[name], param.grad, rtol=1e-4, atol=1e-6), name
    assert bool((stats.logprob[batch.action_mask == 0] == 0).all())  # observation/padding: exactly 0
    bf16 = PolicyModel(model, precision="bf16")(batch)
    assert (bf16.logprob - logprob).abs().max() < 0.05


def test_learner_token_stats_and_metrics_names():
    _, batch, advantages = step_inputs(0)
    learner = make_learner("stare")
    stats = learner.token_stats(batch)
    logprob, entropy = _naive_stats(learner.model, batch)
    assert torch.allclose(stats.logprob, logprob, atol=1e-5)
    mask = batch.action_mask > 0
    metrics = learner.step(batch, advantages)
    assert tuple(metrics) == LEARNER_METRICS
    # the gate's entropy: token-mean over the action tokens of the pre-update policy
    assert metrics["learner/entropy"] == pytest.approx(float(entropy.detach()[mask].mean()), rel=1e-5)
    assert metrics["learner/action_tokens"] == float(mask.sum())
    assert metrics["learner/tokens"] == float(batch.attention_mask.sum())
    assert metrics["stare/gate_on"] == 0.0  # a random model's entropy (~ln 512) is far above 0.3
    q = sum(metrics[f"quadrant/{k}"] for k in ("pos_high", "pos_low", "neg_high", "neg_low"))
    assert q == float((mask & (advantages[:, None] != 0)).sum())


def test_gate_is_updated_once_per_step_on_the_pre_update_entropy():
    _, batch, advantages = step_inputs(0)
    entropy = make_learner().step(batch, advantages)["learner/entropy"]
    for target, on in ((entropy + 0.01, 1.0), (entropy - 0.01, 0.0)):
        algorithm = AlgorithmConfig.preset("stare")
        algorithm.stare.target_entropy = target
        learner = make_learner(algorithm)
        metrics = learner.step(batch, advantages)
        assert metrics["stare/gate_on"] == on and metrics["learner/entropy"] == pytest.approx(entropy)
        assert learner.reweighting.method.gate.active is bool(on)


def _perturbed_observations(trajectories):
    """The same rollouts with a trailing observation span on every response (nothing after it is scored)."""
    out = []
    for t in trajectories:
        out.append(
            Trajectory(
                prompt_ids=t.prompt_ids,
                response_ids=[*t.response_ids, 7, 8, 9],
                action_mask=[*t.action_mask, 0, 0, 0],
                rollout_logprobs=[*t.rollout_logprobs, 0.0, 0.0, 0.0],
                reward=t.reward,
                group_id=t.group_id,
            )
        )
    return out


@pytest.mark.parametrize("old_logprobs", ["recompute", "rollout"])
def test_observation_tokens_never_reach_loss_gradient_or_metrics(old_logprobs):
    trajectories = _perturbed_observations(rollouts(2))
    batch = collate(trajectories, pad_token_id=0)
    gen = torch.Generator().manual_seed(0)
    advantages = torch.randn(batch.action_mask.shape, generator=gen)  # per token
    algorithm = AlgorithmConfig.preset("stare-c2")
    algorithm.stare.target_entropy = 100.0  # gate on: observation tokens must not be selected either
    algorithm.loss.entropy_coef = 1e-2  # the entropy term must not see them either
    extra = {"importance": {"cap": 2.0}} if old_logprobs == "recompute" else {}
    reference = make_learner(algorithm, old_logprobs=old_logprobs, micro_batch_tokens=100, **extra)
    metrics_a = reference.step(batch, advantages)

    hidden = batch.action_mask == 0
    changed = slice_batch(batch, range(batch.input_ids.shape[0]))  # a copy
    changed.rollout_logprobs = batch.rollout_logprobs.clone()
    changed.rollout_logprobs[hidden] = -1e9  # sentinel rollout log-probs on observation/padding
    changed.input_ids = batch.input_ids.clone()
    changed.input_ids[:, -3:][batch.action_mask[:, -3:] == 0] = 500  # trailing observation ids
    changed.input_ids[batch.attention_mask == 0] = 123  # padding ids
    advantages_b = advantages.clone()
    advantages_b[hidden] = 1e6
    other = make_learner(algorithm, old_logprobs=old_logprobs, micro_batch_tokens=100, **extra)
    metrics_b = other.step(changed, advantages_b)
    assert_same_metrics(metrics_a, metrics_b, rel=1e-6)
    assert max_param_diff(reference.model, other.model) < 1e-7


def test_per_micro_batch_stare_equals_per_step_stare_with_one_micro_batch():
    _, batch, advantages = step_inputs(3)
    runs = {}
    for scope in ("micro-batch", "batch"):
        for budget in (10_000, 60):
            algorithm = AlgorithmConfig(stare=StareConfig(scope=scope, target_entropy=100.0, variant="C2"))
            # unshared prompts: micro-batches cut by padded tokens, many small ones at budget 60
            learner = make_learner(algorithm, micro_batch_tokens=budget, share_prompts=False)
            runs[scope, budget] = (learner, learner.step(batch, advantages))
    one_mb, step = runs["micro-batch", 10_000], runs["batch", 10_000]
    assert one_mb[1]["learner/micro_batches"] == 1.0 and one_mb[1]["stare/gate_on"] == 1.0
    assert_same_metrics(one_mb[1], step[1])
    assert max_param_diff(one_mb[0].model, step[0].model) == 0.0
    # with several micro-batches the scope matters: k per micro-batch vs k over the step
    many_mb, many_step = runs["micro-batch", 60], runs["batch", 60]
    assert many_mb[1]["learner/micro_batches"] > 2
    assert many_mb[1]["stare/lplus_share"] > many_step[1]["stare/lplus_share"]
    assert many_step[1]["stare/lplus_share"] == step[1]["stare/lplus_share"]  # batch scope: budget-free
    assert max_param_diff(many_step[0].model, step[0].model) < 1e-6


@pytest.mark.parametrize("preset", ["grpo-ds", "grpo", "entropy-bonus"])
def test_gradient_accumulation_over_micro_batches_equals_one_big_batch(preset):
    _, batch, advantages = step_inputs(4)
    big = make_learner(preset, micro_batch_tokens=10_000)
    small = make_learner(preset, micro_batch_tokens=50)
    metrics_big, metrics_small = big.step(batch, advantages), small.step(batch, advantages)
    assert metrics_big["learner/micro_batches"] == 1 and metrics_small["learner/micro_batches"] >= 4
    assert_same_metrics(
        metrics_big,
        metrics_small,
        rel=1e-5,
        ignore={"learner/micro_batches", *SelectionSums.names()},  # L+/L- are taken per micro-batch
    )
    assert max_param_diff(big.model, small.model) < 1e-6


def test_an_all_masked_micro_batch_contributes_nothing():
    trajectories, _, _ = step_inputs(5)
    blanks = [
        Trajectory(
            prompt_ids=[5] * 30, response_ids=[9] * 60, action_mask=[0] * 60, rollout_logprobs=[0.0] * 60
        )
        for _ in range(2)
    ]
    clean, dirty = collate(trajectories, 0), collate(trajectories + blanks, 0)
    adv_clean = torch.linspace(-1, 1, len(trajectories))
    adv_dirty = torch.cat([adv_clean, torch.tensor([5.0, -5.0])])
    a, b = make_learner("stare", micro_batch_tokens=200), make_learner("stare", micro_batch_tokens=200)
    metrics_a, metrics_b = a.step(clean, adv_clean), b.step(dirty, adv_dirty)
    assert metrics_b["learner/micro_batches"] > metrics_a["learner/micro_batches"]  # the blanks got their own
    assert_same_metrics(metrics_a, metrics_b, rel=1e-6, ignore={"learner/micro_batches", "learner/tokens"})
    assert max_param_diff(a.model, b.model) < 1e-7
    # a step with no action token at all: loss 0, no NaN, no change without weight decay
    learner = make_learner("stare", optimizer={"weight_decay": 0.0})
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    metrics = learner.step(collate(blanks, 0), torch.tensor([1.0, -1.0]))
    assert metrics["learner/loss"] == 0.0 and metrics["learner/grad_norm"] == 0.0
    assert math.isnan(metrics["learner/entropy"]) and metrics["stare/gate_skipped"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())


@pytest.mark.parametrize("sentinel", [-1e9, float("-inf")])
@pytest.mark.parametrize("mode", [{"old_logprobs": "rollout"}, {"importance": {"cap": 2.0}}])
def test_sentinel_rollout_logprobs_give_no_nan(sentinel, mode):
    _, batch, advantages = step_inputs(6)
    batch.rollout_logprobs = torch.where(batch.action_mask > 0, sentinel, 0.0)
    learner = make_learner("stare-c2", **mode)
    metrics = learner.step(batch, advantages)
    for key in ("learner/loss", "learner/grad_norm", "policy/clipfrac", "policy/approx_kl"):
        assert math.isfinite(metrics[key]), key
    assert metrics["mismatch/logprob_abs_diff"] <= 20.0 and metrics["mismatch/ratio_outside"] == 1.0
    assert all(bool(torch.isfinite(p).all()) for p in learner.model.parameters())
    assert metrics["learner/skipped_updates"] == 0.0


def test_mismatch_metrics_and_truncated_importance_sampling_hand_computed():
    _, batch, advantages = step_inputs(7)
    probe = make_learner()
    learner_logprobs = probe.token_stats(batch).logprob
    mask = batch.action_mask > 0
    offsets = torch.zeros_like(learner_logprobs)
    flat = offsets[mask]
    flat[::2] = 0.2  # half of the tokens: rollout log-prob 0.2 above the learner's (ratio e^-0.2 = 0.82)
    offsets[mask] = flat
    batch.rollout_logprobs = torch.where(mask, learner_logprobs + offsets, 0.0)
    share = float((offsets[mask] != 0).float().mean())
    plain = make_learner().step(batch, advantages)
    assert plain["mismatch/logprob_abs_diff"] == pytest.approx(0.2 * share, rel=1e-4)
    assert plain["mismatch/ratio_outside"] == pytest.approx(share)
    assert plain["importance/capped_share"] == 0.0
    # TIS weights min(e^{learner - rollout}, C): e^-0.2 = 0.819 on half the tokens, 1 elsewhere; C = 0.9
    # caps the others at 0.9. At ratio 1 the loss is -sum(A w) / N, so it scales accordingly.
    tis = make_learner(importance={"cap": 0.9}).step(batch, advantages)
    assert tis["importance/capped_share"] == pytest.approx(1 - share)
    weights = torch.where(offsets[mask] != 0, math.exp(-0.2), 0.9)
    adv = advantages[:, None].expand_as(mask)[mask]
    assert tis["learner/loss"] == pytest.approx(float(-(adv * weights).sum() / mask.sum()), rel=1e-5)
    assert plain["learner/loss"] == pytest.approx(float(-adv.sum() / mask.sum()), rel=1e-5)


def test_non_finite_entropy_skips_the_gate_and_the_update_with_warnings():
    _, batch, advantages = step_inputs(8)
    learner = make_learner("stare", optimizer={"weight_decay": 0.0})
    learner.step(batch, advantages)
    gate_before = learner.reweighting.state_dict()
    with torch.no_grad():
        learner.model.get_output_embeddings().weight[3, 5] = float("nan")  # every logit row is NaN now
    with pytest.warns(RuntimeWarning) as caught:
        metrics = learner.step(batch, advantages)
    messages = " ".join(str(w.message) for w in caught)
    assert "entropy gate" in messages and "gradient norm" in messages
    assert metrics["stare/gate_skipped"] == 1.0 and metrics["learner/skipped_updates"] == 1.0
    assert learner.reweighting.state_dict()["gate"]["active"] == gate_before["gate"]["active"]
    assert learner.step_count == 2


def test_lr_schedule_warmup_then_cosine():
    config = OptimizerConfig(lr=1.0, warmup_steps=2, schedule="cosine", total_steps=6, min_lr_ratio=0.1)
    factors = [config.lr_factor(s) for s in range(8)]
    cosine = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert factors == pytest.approx([0.5, 1.0, *cosine, 0.1])
    _, batch, advantages = step_inputs(0)
    learner = make_learner(lr=1e-3, optimizer={"warmup_steps": 3})
    assert [learner.step(batch, advantages)["learner/lr"] for _ in range(4)] == pytest.approx(
        [1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3]
    )
    with pytest.raises(ValueError, match="total_steps"):
        OptimizerConfig(schedule="cosine", total_steps=0)
    with pytest.raises(ValueError, match="schedule"):
        OptimizerConfig(schedule="linear")


def test_options_bf16_checkpointing_and_mini_batches_run():
    _, batch, advantages = step_inputs(9)
    reference = make_learner("stare")
    checkpointed = make_learner("stare", gradient_checkpointing=True)
    assert_same_metrics(reference.step(batch, advantages), checkpointed.step(batch, advantages), rel=1e-5)
    assert max_param_diff(reference.model, checkpointed.model) < 1e-6
    bf16 = make_learner("stare", precision="bf16").step(batch, advantages)
    assert math.isfinite(bf16["learner/loss"]) and abs(bf16["learner/entropy"] - math.log(512)) < 0.1
    two_updates = make_learner("stare", mini_batches=2)
    metrics = two_updates.step(batch, advantages)
    assert two_updates.optimizer.state_dict()["state"][0]["step"] == 2  # two AdamW updates in one step
    assert metrics["policy/clipfrac"] >= 0.0 and two_updates.scheduler.last_epoch == 1


def test_micro_batch_plan_is_a_hand_checked_token_budget_packing():
    rows = [
        Trajectory(prompt_ids=[1] * p, response_ids=[2] * r, action_mask=[1] * r, rollout_logprobs=[0.0] * r)
        for p, r in ((2, 8), (3, 3), (1, 20), (4, 6), (2, 2))
    ]
    batch = collate(rows, 0)  # totals 10, 6, 21, 10, 4
    # longest first: [2] alone (21 > 20); then 0 and 3: 2 x (4 + 8) = 24 > 20 -> 0 alone; 3 and 1: 2 x 10 = 20;
    # 4 joins 3 and 1: 3 x 10 = 30 > 20 -> alone
    assert plan_micro_batches(batch, 20) == [[2], [0], [1, 3], [4]]
    part = slice_batch(batch, [1, 3])
    assert part.prompt_length == 4 and part.response_length == 6 and part.input_ids.shape == (2, 10)
    assert part.input_ids[0].tolist() == [0, 1, 1, 1, 2, 2, 2, 0, 0, 0]
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        plan_micro_batches(batch, 0)


def test_hostile_inputs_are_refused_with_the_value_and_the_remedy():
    _, batch, advantages = step_inputs(0)
    learner = make_learner()
    with pytest.raises(ValueError, match="advantages must be"):
        learner.step(batch, advantages[:-1])
    with pytest.raises(ValueError, match="finite"):
        learner.step(batch, advantages * float("nan"))
    with pytest.raises(ValueError, match="mini_batches"):
        split_step(batch, advantages, mini_batches=99, micro_batch_tokens=100)
    with pytest.raises(ValueError, match="old_logprobs='recompute'"):
        LearnerConfig(old_logprobs="rollout", importance={"cap": 2.0})
    with pytest.raises(ValueError, match="old_logprobs"):
        LearnerConfig(old_logprobs="vllm")
    with pytest.raises(ValueError, match="float32 master weights"):
        Learner(tiny_model().to(torch.bfloat16), AlgorithmConfig.preset("stare"))
    capped = tiny_model()
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        Learner(capped, AlgorithmConfig.preset("stare"))
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        Learner.from_pretrained("/nonexistent/model", AlgorithmConfig.preset("stare"))
    with pytest.raises(ValueError, match="precision"):
        LearnerConfig(precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        PolicyModel(tiny_model(), precision="fp8")


@pytest.mark.parametrize("scope", ["micro-batch", "batch"])
def test_one_forward_for_a_single_micro_batch_step_gives_the_two_pass_result(scope):
    _, batch, advantages = step_inputs(16)
    algorithm = AlgorithmConfig(stare=StareConfig(scope=scope, target_entropy=100.0, variant="C2"))
    fused = make_learner(algorithm, micro_batch_tokens=10_000)
    two_pass = make_learner(algorithm, micro_batch_tokens=10_000, fuse_single_micro_batch=False)
    for _ in range(2):
        assert_same_metrics(fused.step(batch, advantages), two_pass.step(batch, advantages), rel=1e-6)
    assert max_param_diff(fused.model, two_pass.model) < 1e-7


@pytest.mark.parametrize(
    "importance",
    [{"cap": 2.0}, {"mask": [0.5, 2.0]}, {"cap": 1.5, "mask": [0.8, 1.25], "level": "sequence"}],
)
def test_the_importance_correction_leaves_an_agreeing_step_bit_identical(importance):
    """fp32 engine and learner agree: the correction's weights are exactly 1 and the step is the same, bit
    for bit, as one without it."""
    _, batch, advantages = step_inputs(8)
    batch.rollout_logprobs = make_learner().token_stats(batch).logprob.clone()  # the learner's own
    plain, corrected = make_learner("stare-c2"), make_learner("stare-c2", importance=importance)
    plain_metrics, corrected_metrics = plain.step(batch, advantages), corrected.step(batch, advantages)
    for (name, a), b in zip(
        plain.model.state_dict().items(), corrected.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert corrected_metrics["importance/masked_share"] == corrected_metrics["importance/capped_share"] == 0.0
    assert plain_metrics["mismatch/kl"] == 0.0 and plain_metrics["mismatch/max_abs_log_ratio"] == 0.0
    for name, value in plain_metrics.items():
        if name not in TIMING:
            assert value == corrected_metrics[name] or (
                math.isnan(value) and math.isnan(corrected_metrics[name])
            )


def test_masked_importance_sampling_drops_the_forged_tokens_from_the_loss():
    _, batch, advantages = step_inputs(7)
    learner_logprobs = make_learner().token_stats(batch).logprob
    mask = batch.action_mask > 0
    offsets = torch.zeros_like(learner_logprobs)
    flat = offsets[mask]
    flat[::3] = 1.0  # a third of the tokens: the rollout 1 nat more confident (ratio e^-1 = 0.37)
    offsets[mask] = flat
    batch.rollout_logprobs = torch.where(mask, learner_logprobs + offsets, 0.0)
    forged = offsets[mask] != 0
    metrics = make_learner(importance={"mask": [0.5, 2.0]}).step(batch, advantages)
    assert metrics["importance/masked_share"] == pytest.approx(float(forged.float().mean()))
    assert metrics["mismatch/kl"] == pytest.approx(
        float(forged.float().mean()) * (math.exp(-1) - 1 + 1), rel=1e-4
    )
    assert metrics["mismatch/max_abs_log_ratio"] == pytest.approx(1.0, rel=1e-5)
    # at ratio 1 the loss is -sum(A w) / N with w = 0 on the forged tokens and 1 elsewhere
    adv = advantages[:, None].expand_as(mask)[mask]
    assert metrics["learner/loss"] == pytest.approx(float(-(adv * (~forged)).sum() / mask.sum()), rel=1e-5)


def test_the_gate_input_changes_what_the_gate_reads_and_nothing_else():
    """stare.gate_input="all": the gate reads the token mean over the trained batch and the untrained
    trajectories the learner scores itself (`others`); with none it reads what "trained" reads and the step is
    the same, bit for bit."""
    _, batch, advantages = step_inputs(9)
    _, others, _ = step_inputs(4)
    mask = batch.action_mask > 0
    probe = make_learner()
    kept_stats, other_stats = probe.token_stats(batch), probe.token_stats(others)
    kept_sum, kept_count = float(kept_stats.entropy[mask].sum()), float(mask.sum())
    kept = kept_sum / kept_count
    other_mask = others.action_mask > 0
    other_sum, other_count = float(other_stats.entropy[other_mask].sum()), float(other_mask.sum())

    def algorithm(gate_input: str) -> AlgorithmConfig:
        return AlgorithmConfig(stare=StareConfig(target_entropy=kept * 0.9, gate_input=gate_input))

    trained = make_learner(algorithm("trained"))
    reads_all = make_learner(algorithm("all"))
    a = trained.step(batch, advantages)
    b = reads_all.step(batch, advantages)  # no untrained trajectories: every sampled one is trained
    assert a["stare/gate_input"] == pytest.approx(kept, rel=1e-6) and a["stare/gate_on"] == 0.0
    assert b["stare/gate_input"] == pytest.approx(kept, rel=1e-6) and b["stare/gate_on"] == 0.0
    assert a["learner/entropy_all"] == pytest.approx(kept, rel=1e-6)
    for (name, x), y in zip(trained.model.state_dict().items(), reads_all.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    # the learner scores the others itself: the gate reads the mean over both, and so does entropy_all
    c = make_learner(algorithm("all")).step(batch, advantages, others=others, record_tokens=True)
    expected = (kept_sum + other_sum) / (kept_count + other_count)
    assert c["stare/gate_input"] == pytest.approx(expected, rel=1e-5)
    assert c["learner/entropy_all"] == pytest.approx(expected, rel=1e-5)
    assert c["learner/entropy"] == pytest.approx(a["learner/entropy"])  # the trained batch's entropy is unchanged
    # their per-token statistics, in the trained ones' record format, without weights or selection
    assert sorted(c.other_records) == list(range(others.input_ids.shape[0]))
    record = c.other_records[0]
    n = int(others.attention_mask[0, others.prompt_length :].sum())
    assert len(record.learner_logprobs) == len(record.entropy) == len(record.phi) == n
    assert record.stare_weights is None and record.selection == []
    assert record.learner_logprobs == pytest.approx(other_stats.logprob[0, :n].tolist(), abs=1e-5)
    # a trained trajectory's record has its Phi too
    assert len(c.token_records[0].phi) == len(c.token_records[0].learner_logprobs)


def test_a_step_with_nothing_to_train_scores_the_others_and_changes_nothing():
    _, others, _ = step_inputs(4)
    learner = make_learner()
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    mask = others.action_mask > 0
    expected = float(learner.token_stats(others).entropy[mask].mean())
    result = learner.step(None, torch.zeros(0), others=others, record_tokens=True)
    assert result["learner/entropy_all"] == pytest.approx(expected, rel=1e-5)
    assert math.isnan(result["learner/loss"]) and math.isnan(result["stare/gate_on"]) and result.other_records
    assert learner.step_count == 0
    assert all(torch.equal(before[k], v) for k, v in learner.model.state_dict().items())
    # without score_untrained (logging.entropy_all off) nothing is scored
    quiet = make_learner(score_untrained=False)
    assert math.isnan(quiet.step(None, torch.zeros(0), others=others)["learner/entropy_all"])


def test_the_mechanism_figures_are_the_pre_update_policys_over_the_step_batch():
    """phi_mass/*, phi_neg_share/* and quadrant/* are the pre-update policy's Phi over the step batch's action
    tokens, summed over micro-batches; mismatch/lplus|lminus_abs_diff are the mean |log pi_learner - log
    pi_rollout| over the tokens the step selected, as its token records show them."""
    from stare_agents.algo import sensitivity_from_statistics
    from stare_agents.algo.diagnostics import phi_sums

    _, batch, advantages = step_inputs(3)
    stats = make_learner("stare").token_stats(batch)
    phi = sensitivity_from_statistics({"logprob": stats.logprob, "entropy": stats.entropy, "collision": stats.collision})
    expected = phi_sums(advantages, phi, batch.action_mask, batch.rewards).figures(measured={"phi"})
    result = make_learner("stare", micro_batch_tokens=120).step(batch, advantages, record_tokens=True)
    assert result["learner/micro_batches"] > 1
    for name, value in expected.items():
        if math.isnan(value):
            assert math.isnan(result[name]), name
        else:
            assert result[name] == pytest.approx(value, rel=1e-3, abs=1e-3), name
    assert result["phi_mass/pos_high"] < 0 < result["phi_mass/pos_low"]
    for sign, name in ((1, "mismatch/lplus_abs_diff"), (-1, "mismatch/lminus_abs_diff")):
        diffs = [
            abs(lp - rp)
            for row, record in result.token_records.items()
            for lp, rp, chosen in zip(
                record.learner_logprobs, batch.rollout_logprobs[row].tolist(), record.selection, strict=False
            )
            if chosen == sign
        ]
        assert diffs and result[name] == pytest.approx(sum(diffs) / len(diffs), rel=1e-4), name
