"""Row packing (train/packing.py): a packed learner step is the padded one to float tolerance (log-probs, entropy,
gradients, the weights after the update), for Llama and for Qwen2 (grouped-query attention, biases, tied
embeddings), with gradient checkpointing too; it is on by default where the probe finds it exact; hostile
batches and models are refused by name."""

from __future__ import annotations

import logging

import pytest
import torch
from learner_support import VOCAB, rollouts, tiny_model

from stare_agents.algo import AlgorithmConfig, compute_advantages
from stare_agents.train import packing
from stare_agents.train.learner import Learner, LearnerConfig
from stare_agents.train.packing import PACKED_ATTENTION, pack_batch, packing_refusal, prompt_groups
from stare_agents.train.policy import OptimizerConfig, PolicyModel, plan_micro_batches, row_lengths
from stare_agents.trajectory import Batch, collate


def tiny_qwen2(seed: int = 0, **overrides):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        **overrides,
    )
    return Qwen2ForCausalLM(config).float()


def step_batch(seed: int = 0):
    trajectories = rollouts(seed, groups=3, group_size=4, max_prompt=14, max_response=48)
    batch = collate(trajectories, pad_token_id=0)
    groups = [t.group_id for t in trajectories]
    return batch, compute_advantages(batch.rewards, groups, AlgorithmConfig.preset("grpo")).advantages


def two_learners(make, *, micro_batch_tokens: int, share_prompts: bool = False, **config):
    """The same weights, one learner packing rows (sharing each group's prompt or not) and one padding them."""
    out = []
    for pack_rows in ("on", "off"):
        learner_config = LearnerConfig(
            optimizer=OptimizerConfig(lr=1e-3, eps=1e-5),
            micro_batch_tokens=micro_batch_tokens,
            pack_rows=pack_rows,
            share_prompts=share_prompts,
            **config,
        )
        out.append(Learner(make(), AlgorithmConfig.preset("stare"), learner_config))
    return out


@pytest.mark.parametrize(
    ("make", "config"),
    [
        (tiny_model, {}),
        (tiny_qwen2, {}),
        (tiny_qwen2, {"gradient_checkpointing": True}),
    ],
    ids=["llama", "qwen2-gqa", "qwen2-checkpointing"],
)
def test_a_packed_step_is_the_padded_step_to_float_tolerance(make, config):
    packed, padded = two_learners(make, micro_batch_tokens=256, **config)  # several micro-batches
    assert packed.policy.packed and not padded.policy.packed
    ma, mb = assert_same_step(packed, padded, *step_batch())
    assert ma["learner/micro_batches"] == mb["learner/micro_batches"] > 1


def assert_same_step(learner: Learner, padded: Learner, batch, advantages) -> tuple[dict, dict]:
    """The two learners' token statistics, step metrics and weights after the step agree to float tolerance."""
    a, b = learner.token_stats(batch), padded.token_stats(batch)
    for name in ("logprob", "entropy", "collision"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=2e-5, rtol=1e-5, msg=name)
    ma, mb = learner.step(batch, advantages), padded.step(batch, advantages)
    for name in ("learner/loss", "learner/grad_norm", "learner/entropy", "stare/lplus_share"):
        assert ma[name] == pytest.approx(mb[name], rel=1e-4, abs=1e-6), name
    for (name, p), q in zip(learner.model.named_parameters(), padded.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
    return ma, mb


@pytest.mark.parametrize("share", [False, True], ids=["packed", "shared-prompts"])
def test_packed_gradients_match_in_bf16_to_its_rounding(share):
    """bf16 autocast: the two paths round differently (other matmul shapes), but the gradient is the same one."""
    batch, _ = step_batch(1)
    grads = []
    for pack_rows in ("on", "off"):
        policy = PolicyModel(tiny_qwen2(), precision="bf16", pack_rows=pack_rows, share_prompts=share)
        stats = policy(batch)
        (stats.logprob.sum() + stats.entropy.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters()]))
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert float(cosine) > 0.999
    assert float((grads[0] - grads[1]).norm() / grads[1].norm()) < 0.03


def test_auto_packs_where_exact_and_the_model_stays_usable_padded():
    model = tiny_qwen2()
    policy = PolicyModel(model)  # pack_rows "auto"
    assert policy.packed and model.config._attn_implementation == PACKED_ATTENTION
    reference = tiny_qwen2()  # the same weights, SDPA
    batch, _ = step_batch(2)
    with torch.no_grad():  # the model called as Hugging Face's (a padded batch with its mask): SDPA's result
        ours = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
        theirs = reference(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
    keep = batch.attention_mask > 0
    torch.testing.assert_close(ours.logits[keep], theirs.logits[keep], atol=1e-5, rtol=1e-5)


def test_the_probe_catches_attention_that_leaks_between_rows(monkeypatch):
    def leaky(query, key, value, segments, scaling, dropout):  # one causal sequence: rows see earlier rows
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, scale=scaling, is_causal=True, enable_gqa=query.shape[1] != key.shape[1]
        )
        return out.transpose(1, 2).contiguous()

    monkeypatch.setattr(packing, "_segment_attention", leaky)
    model = tiny_qwen2()
    reason = packing_refusal(model)
    assert reason is not None and "differs from the padded one" in reason
    assert model.config._attn_implementation == "sdpa"  # left as it was
    with pytest.raises(ValueError, match="pack_rows=on, but packing is not exact here"):
        PolicyModel(tiny_qwen2(), pack_rows="on")


def test_sliding_window_models_are_padded_and_say_why(caplog):
    make = lambda: tiny_qwen2(use_sliding_window=True, sliding_window=8, max_window_layers=0)  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="stare_agents.train.packing"):
        assert not PolicyModel(make()).packed
    assert "sliding-window attention (window 8)" in caplog.text and "padded, not packed" in caplog.text
    with pytest.raises(ValueError, match="sliding-window"):
        PolicyModel(make(), pack_rows="on")
    with pytest.raises(ValueError, match="pack_rows must be one of"):
        PolicyModel(tiny_qwen2(), pack_rows="yes")


def test_hostile_batches_are_refused_by_row():
    batch, _ = step_batch(3)
    holed = batch.attention_mask.clone()
    holed[2, batch.prompt_length + 1] = 0  # a hole inside row 2's response
    with pytest.raises(ValueError, match=r"rows \[2\] have no real tokens or gaps"):
        pack_batch(Batch(**{**batch.__dict__, "attention_mask": holed}))
    empty = batch.attention_mask.clone()
    empty[1] = 0
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        pack_batch(Batch(**{**batch.__dict__, "attention_mask": empty}))
    # an action token past the end of its row's response: scored from a padding position
    lengths = batch.attention_mask[:, batch.prompt_length :].sum(-1)
    row = int(lengths.argmin())
    action = batch.action_mask.clone()
    action[row, int(lengths[row]) + 1 :] = 1
    policy = PolicyModel(tiny_model(), pack_rows="on")
    with pytest.raises(ValueError, match="scored from a padding position"):
        policy(Batch(**{**batch.__dict__, "action_mask": action}))


def test_packing_drops_exactly_the_padding():
    batch, _ = step_batch(4)
    packed = pack_batch(batch)
    real = int(batch.attention_mask.sum())
    assert packed.tokens == real < batch.attention_mask.numel()
    assert packed.segments.bounds[-1][1] == real and len(packed.segments.bounds) == batch.input_ids.shape[0]
    keep = batch.attention_mask > 0
    assert torch.equal(packed.input_ids[0], batch.input_ids[keep])
    assert torch.equal(packed.input_ids[0][packed.index[keep]], batch.input_ids[keep])
    for a, b in packed.segments.bounds:  # positions restart at 0 in every row
        assert packed.position_ids[0, a:b].tolist() == list(range(b - a))


# ---- shared prompts: a group's prompt runs once -------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "config", "budget"),
    [
        (tiny_model, {}, 4096),
        (tiny_model, {}, 160),
        (tiny_qwen2, {}, 160),
        (tiny_qwen2, {"gradient_checkpointing": True}, 160),
    ],
    ids=["llama-one-micro-batch", "llama", "qwen2-gqa", "qwen2-checkpointing"],
)
def test_a_step_with_shared_prompts_is_the_padded_step_to_float_tolerance(make, config, budget):
    shared, padded = two_learners(make, micro_batch_tokens=budget, share_prompts=True, **config)
    assert shared.policy.share_prompts and not padded.policy.share_prompts
    ma, _ = assert_same_step(shared, padded, *step_batch())
    if budget > 1000:
        assert ma["learner/micro_batches"] == 1  # the fused step: the update's forward is the pre-update pass
    else:
        assert ma["learner/micro_batches"] > 1


def test_each_prompt_runs_once_and_each_response_continues_it():
    batch, _ = step_batch(4)
    prompts, responses = row_lengths(batch)
    groups = prompt_groups(batch)
    assert [len(g) for g in groups] == [4, 4, 4]
    packed = pack_batch(batch, share_prompts=True)
    assert packed.tokens == sum(prompts[g[0]] for g in groups) + sum(responses)
    assert packed.tokens < pack_batch(batch).tokens
    keep = batch.attention_mask > 0
    # every real (row, column) reads a packed position holding its own id and position
    assert torch.equal(packed.input_ids[0][packed.index[keep]], batch.input_ids[keep])
    assert torch.equal(packed.position_ids[0][packed.index[keep]], batch.position_ids[keep])
    segments = packed.segments
    assert segments.shared and len(segments.bounds) == len(groups) + batch.input_ids.shape[0]
    assert segments.bounds[0][0] == 0 and segments.bounds[-1][1] == packed.tokens
    assert all(
        a[1] == b[0] for a, b in zip(segments.bounds[:-1], segments.bounds[1:], strict=True)
    )  # in order
    for (a, b), prefix in zip(segments.bounds, segments.prefixes, strict=True):
        if prefix is None:  # a prompt: positions from 0
            assert packed.position_ids[0, a:b].tolist() == list(range(b - a))
        else:  # a response: positions continue its prompt's
            length = prefix[1] - prefix[0]
            assert packed.position_ids[0, a:b].tolist() == list(range(length, length + b - a))


def test_only_identical_prompts_are_shared():
    """Prompts that differ in one token, or where one is a prefix of the other, each run on their own, and the
    forward is still the padded one (nothing leaks between groups)."""
    trajectories = rollouts(5, groups=2, group_size=3, max_prompt=10, max_response=20)
    base = list(trajectories[0].prompt_ids)
    trajectories[1].prompt_ids = [*base[:-1], (base[-1] % (VOCAB - 1)) + 1]  # the last token differs
    trajectories[2].prompt_ids = [*base, 7]  # one token longer
    batch = collate(trajectories, pad_token_id=0)
    groups = prompt_groups(batch)
    assert sorted(map(sorted, groups)) == [[0], [1], [2], [3, 4, 5]]
    packed = pack_batch(batch, share_prompts=True)
    assert sum(prefix is not None for prefix in packed.segments.prefixes) == 3
    torch.manual_seed(0)
    shared = PolicyModel(tiny_model(), pack_rows="on", share_prompts=True)
    padded = PolicyModel(tiny_model(), pack_rows="off")
    a, b = shared(batch), padded(batch)
    torch.testing.assert_close(a.logprob, b.logprob, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(a.entropy, b.entropy, atol=2e-5, rtol=1e-5)
    # the same prompt ids at other positions (a hand-built batch): not the same context, so not shared
    shifted = batch.position_ids.clone()
    shifted[4] += 3
    moved = Batch(**{**batch.__dict__, "position_ids": shifted})
    assert sorted(map(sorted, prompt_groups(moved))) == [[0], [1], [2], [3, 5], [4]]
    torch.testing.assert_close(shared(moved).logprob, padded(moved).logprob, atol=2e-5, rtol=1e-5)


def test_the_planner_keeps_groups_together_within_the_budget():
    batch, _ = step_batch(6)
    prompts, responses = row_lengths(batch)
    groups = [set(g) for g in prompt_groups(batch)]

    def cost(rows):
        return sum(prompts[min(g & set(rows))] for g in groups if g & set(rows)) + sum(
            responses[i] for i in rows
        )

    whole = max(prompts[min(g)] + sum(responses[i] for i in g) for g in groups)
    plan = plan_micro_batches(batch, whole, shared_prompts=True)
    assert sorted(i for rows in plan for i in rows) == list(range(batch.input_ids.shape[0]))
    assert all(cost(rows) <= whole for rows in plan)
    for g in groups:  # a group that fits stays in one micro-batch
        assert sum(bool(g & set(rows)) for rows in plan) == 1
    small = max(p + r for p, r in zip(prompts, responses, strict=True))  # forces cutting groups
    plan = plan_micro_batches(batch, small, shared_prompts=True)
    assert sorted(i for rows in plan for i in rows) == list(range(batch.input_ids.shape[0]))
    assert all(cost(rows) <= small for rows in plan)
    # fewer packed tokens than the unshared plan would run
    unshared = plan_micro_batches(batch, small)
    assert sum(cost(rows) for rows in plan) < sum(
        prompts[i] + responses[i] for rows in unshared for i in rows
    )
