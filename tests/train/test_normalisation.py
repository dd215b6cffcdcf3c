"""Loss normalisation over gradient-accumulation micro-batches ("global" vs the official "micro-batch") and
token-balanced micro-batch packing, on a tiny random Llama."""

import copy
import dataclasses

import pytest
import torch
from learner_support import make_learner, rollouts

from stare_agents.algo import AlgorithmConfig, PolicyLossConfig
from stare_agents.train.learner import LearnerConfig
from stare_agents.train.policy import plan_micro_batches, row_lengths
from stare_agents.trajectory import Trajectory, collate

# 7 rows, prompts of 4 tokens, responses of these lengths. Longest-first with a budget of 40 padded tokens:
# 34 alone (2 x 34 > 40), 26 alone, 18 + 16 (2 x 18 = 36), 12 + 11 + 10 (3 x 12 = 36): four micro-batches of
# 1, 1, 2 and 3 rows and unequal token counts
RESPONSES = (30, 22, 14, 12, 8, 7, 6)
GROUPS = [[0], [1], [2, 3], [4, 5, 6]]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.8, -1.2, 0.3, 0.6, -0.9])


def _batch():
    gen = torch.Generator().manual_seed(3)
    rows = []
    for i, r in enumerate(RESPONSES):
        mask = [0 if i % 2 and 2 <= j < 5 else 1 for j in range(r)]  # odd rows hold a 3-token observation
        rows.append(
            Trajectory(
                prompt_ids=torch.randint(1, 512, (4,), generator=gen).tolist(),
                response_ids=torch.randint(1, 512, (r,), generator=gen).tolist(),
                action_mask=mask,
                rollout_logprobs=[0.0] * r,
            )
        )
    return collate(rows, pad_token_id=0)


def _logprobs(model, batch):
    """log pi(a) at the response tokens from the plain HF forward (0 off the action tokens)."""
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits.float()
    p, r = batch.prompt_length, batch.response_length
    logp = torch.log_softmax(logits[:, p - 1 : p - 1 + r], dim=-1)
    return logp.gather(-1, batch.response_ids[..., None]).squeeze(-1) * batch.action_mask


def _with_rollout_logprobs(model, batch):
    """Rollout log-probs within +-0.4 of the model's, so that ratios differ from 1 and some clips bind."""
    with torch.no_grad():
        logp = _logprobs(model, batch)
    noise = (torch.rand(logp.shape, generator=torch.Generator().manual_seed(5)) - 0.5) * 0.8
    return dataclasses.replace(batch, rollout_logprobs=(logp + noise) * batch.action_mask)


def _official_gradients(model, batch, groups):
    """The official semantics, written out: per micro-batch the clipped surrogate (eps 0.2 / 0.28, dual clip
    10) averaged over its own action tokens, times rows_mb / rows_update, backward, accumulated."""
    model = copy.deepcopy(model)
    rows_total = sum(len(g) for g in groups)
    for rows in groups:
        mask = batch.action_mask[rows].float()
        logp = _logprobs(
            model, dataclasses.replace(batch, **{k: getattr(batch, k)[rows] for k in _ROW_FIELDS})
        )
        ratio = torch.exp((logp - batch.rollout_logprobs[rows]) * mask)
        adv = ADVANTAGES[rows][:, None]
        per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 10.0), per_token)
        mean = (per_token * mask).sum() / mask.sum()
        (mean * len(rows) / rows_total).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


_ROW_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_ids",
    "action_mask",
    "rollout_logprobs",
)


def _learner_gradients(batch, normalization, budget):
    algorithm = AlgorithmConfig.preset("grpo-ds")
    algorithm.loss.normalization = normalization
    learner = make_learner(
        algorithm, old_logprobs="rollout", micro_batch_tokens=budget, optimizer={"max_grad_norm": 0.0}
    )
    before = copy.deepcopy(learner.model)
    metrics = learner.step(batch, ADVANTAGES)
    return before, {n: p.grad.clone() for n, p in learner.model.named_parameters()}, metrics


def _assert_close(got, expected):
    for name, g in expected.items():
        assert (got[name] - g).abs().max() <= 1e-6 + 1e-4 * g.abs().max(), name


def _relative_difference(a, b):
    diff = sum(float((a[n] - b[n]).pow(2).sum()) for n in a) ** 0.5
    return diff / sum(float(b[n].pow(2).sum()) for n in b) ** 0.5


def test_micro_batch_normalisation_matches_the_official_semantics_and_differs_from_global():
    batch = _with_rollout_logprobs(make_learner().model, _batch())  # make_learner's model: tiny_model(0)
    assert plan_micro_batches(batch, 40) == GROUPS
    before, micro, metrics = _learner_gradients(batch, "micro-batch", 40)
    assert metrics["learner/micro_batches"] == 4.0
    _assert_close(micro, _official_gradients(before, batch, GROUPS))
    _, global_, _ = _learner_gradients(batch, "global", 40)
    assert _relative_difference(global_, micro) > 0.02  # the two normalisations differ on this batch
    # one micro-batch: both are the token mean of the whole update, and equal the official one
    _, one_micro, _ = _learner_gradients(batch, "micro-batch", 10_000)
    _, one_global, _ = _learner_gradients(batch, "global", 10_000)
    _assert_close(one_micro, one_global)
    _assert_close(one_micro, _official_gradients(before, batch, [list(range(7))]))


def test_the_loss_each_normalisation_reports_by_hand():
    # recomputed pi_old: every ratio is 1 and every per-token loss is -A, so the loss is a weighted advantage
    batch = _batch()
    counts = batch.action_mask.sum(-1).tolist()  # 30, 19, 14, 9, 8, 4, 6 action tokens
    assert counts == [30, 19, 14, 9, 8, 4, 6]
    adv = ADVANTAGES.tolist()
    global_ = -sum(a * n for a, n in zip(adv, counts, strict=True)) / sum(counts)
    micro = sum(
        -sum(adv[i] * counts[i] for i in rows) / sum(counts[i] for i in rows) * len(rows) / 7
        for rows in GROUPS
    )
    assert abs(global_ - micro) > 0.01
    for normalization, expected in (("global", global_), ("micro-batch", micro)):
        algorithm = AlgorithmConfig.preset("grpo-ds")
        algorithm.loss.normalization = normalization
        metrics = make_learner(algorithm, micro_batch_tokens=40).step(batch, ADVANTAGES)
        assert metrics["learner/loss"] == pytest.approx(expected, rel=1e-5)
    # seq-mean-token-mean: each micro-batch's mean of row means times its row share is the mean over all rows
    losses = []
    for normalization in ("global", "micro-batch"):
        algorithm = AlgorithmConfig.preset("grpo-ds")
        algorithm.loss = PolicyLossConfig(aggregation="seq-mean-token-mean", normalization=normalization)
        losses.append(make_learner(algorithm, micro_batch_tokens=40).step(batch, ADVANTAGES)["learner/loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0] == pytest.approx(
        -sum(adv) / 7, rel=1e-5
    )
    with pytest.raises(ValueError, match="normalization must be one of"):
        PolicyLossConfig(normalization="token")


def _padded(batch, group):
    prompts, responses = row_lengths(batch)
    return len(group) * (max(prompts[i] for i in group) + max(max(responses[i] for i in group), 1))


def test_balanced_packing_by_hand_evens_out_what_longest_first_leaves_skewed():
    # a 16-token row and nine 6-token rows (1 prompt token each), budget 24: longest-first fills 4 + 4 sixes
    # and leaves one alone (24, 24, 6 beside the 16). Balanced keeps its 4 micro-batches: the 16 takes no
    # partner (2 x 16 > 24) and the sixes go round the other three, the least loaded first
    rows = [(16, 0)] + [(6, i) for i in range(1, 10)]
    batch = collate(
        [
            Trajectory(
                prompt_ids=[1],
                response_ids=[5] * (n - 1),
                action_mask=[1] * (n - 1),
                rollout_logprobs=[0.0] * (n - 1),
            )
            for n, _ in rows
        ],
        pad_token_id=0,
    )
    longest = plan_micro_batches(batch, 24)
    balanced = plan_micro_batches(batch, 24, packing="balanced")
    assert longest == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert balanced == [[0], [1, 4, 7], [2, 5, 8], [3, 6, 9]]
    assert [_padded(batch, g) for g in longest] == [16, 24, 24, 6]
    assert [_padded(batch, g) for g in balanced] == [16, 18, 18, 18]
    with pytest.raises(ValueError, match="micro_batch_packing"):
        plan_micro_batches(batch, 24, packing="random")
    with pytest.raises(ValueError, match="micro_batch_packing"):
        LearnerConfig(micro_batch_packing="random")


@pytest.mark.parametrize("budget", [1, 30, 60, 100, 250, 10_000])
def test_balanced_packing_takes_every_row_once_within_the_budget(budget):
    batch = collate(rollouts(4, groups=4, group_size=6), pad_token_id=0)  # 24 rows of 9 to 52 tokens
    rows = list(range(3, 21))  # a sub-range, as one optimiser update of several
    longest = plan_micro_batches(batch, budget, rows)
    balanced = plan_micro_batches(batch, budget, rows, packing="balanced")
    assert sorted(i for g in balanced for i in g) == rows
    assert all(g == sorted(g) for g in balanced)
    assert all(_padded(batch, g) <= budget or len(g) == 1 for g in balanced)
    assert len(balanced) >= len(
        longest
    )  # it starts from longest-first's count and adds one where a row fits none
    assert plan_micro_batches(batch, budget, rows, packing="balanced") == balanced  # deterministic


def test_the_learner_steps_on_balanced_micro_batches():
    batch = collate(rollouts(4, groups=2, group_size=4), pad_token_id=0)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 0.7, -0.7])
    balanced = make_learner(micro_batch_tokens=100, micro_batch_packing="balanced")
    metrics = balanced.step(batch, advantages)
    assert metrics["learner/micro_batches"] == float(len(plan_micro_batches(batch, 100, packing="balanced")))
    # one micro-batch either way: the same update
    a = make_learner(micro_batch_tokens=10_000, micro_batch_packing="balanced").step(batch, advantages)
    b = make_learner(micro_batch_tokens=10_000).step(batch, advantages)
    assert a["learner/loss"] == pytest.approx(b["learner/loss"], rel=1e-6)


def test_the_paper_recipes_train_as_the_official_code_and_the_others_keep_the_defaults():
    from stare_agents.train.config import load_config

    for name in (
        "qwen2.5-7b-tir-stare-c2",
        "qwen2.5-7b-tir-grpo-ds",
        "qwen2.5-7b-zero-tir-grpo-ds",
        "short-cot-qwen2.5-math-7b",
    ):
        config = load_config(recipe=name)
        algorithm = config.algorithm()
        assert (algorithm.loss.normalization, algorithm.one_member_groups) == ("micro-batch", "keep"), name
        assert config.rl.learner.micro_batch_packing == "verl", name  # the official script's own
        assert algorithm.stare is None or algorithm.stare.initial_on, name
    tiny = load_config(recipe="tiny")
    algorithm = tiny.algorithm()
    assert (algorithm.loss.normalization, algorithm.one_member_groups, algorithm.stare.initial_on) == (
        "global",
        "drop",
        False,
    )
    assert tiny.rl.learner.micro_batch_packing == "longest-first"
