"""The learner scores what the sampler sampled: logits divided by the rollout temperature. Rollout log-probs
of the real engines (HF; vLLM in float32) and the learner's recompute agree to engine precision at
temperature 0.7; the chunked head's gradient is that of log_softmax(logits / T); top_p < 1 is refused for
training where the config loads."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from stare_agents.rollout import SamplingParams, make_engine
from stare_agents.train.config import load_config
from stare_agents.train.policy import PolicyModel
from stare_agents.trajectory import Trajectory, collate


def sampled(engine, temperature: float, count: int = 4) -> list[Trajectory]:
    tokenizer = engine.tokenizer
    trajectories = []
    for i in range(count):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Question {i}: what is {i} + 7?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        generation = asyncio.run(engine.generate(prompt, SamplingParams(temperature, max_tokens=24), seed=i))
        n = len(generation.token_ids)
        trajectories.append(Trajectory(prompt, generation.token_ids, [1] * n, generation.logprobs))
    return trajectories


def learner_logprobs(model_dir, trajectories, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    policy = PolicyModel(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), temperature=temperature
    )
    batch = collate(trajectories, pad_token_id=0)
    with torch.no_grad():
        stats = policy(batch)
    mask = batch.action_mask > 0
    return stats.logprob[mask], batch.rollout_logprobs[mask]


def test_hf_rollout_and_learner_logprobs_agree_at_temperature_0_7(tiny_model):
    engine = make_engine("hf", str(tiny_model), dtype="float32", seed=0)
    try:
        trajectories = sampled(engine, 0.7)
    finally:
        engine.close()
    learner, rollout = learner_logprobs(tiny_model, trajectories, 0.7)
    assert torch.allclose(learner, rollout, atol=1e-4), (learner - rollout).abs().max()
    untempered, _ = learner_logprobs(tiny_model, trajectories, 1.0)  # what the learner used to compute
    assert (untempered - rollout).abs().max() > 1e-2


def test_the_chunked_heads_gradient_is_that_of_the_tempered_softmax(tiny_model):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    trajectory = Trajectory([5, 9, 11, 4], [7, 3, 8, 2, 6], [1, 1, 0, 1, 1], [-1.0, -1.0, 0.0, -1.0, -1.0])
    batch = collate([trajectory], pad_token_id=0)
    policy = PolicyModel(model, temperature=0.7, head_chunk_rows=2)  # several chunks
    stats = policy(batch)
    (stats.logprob.sum() + 0.5 * stats.entropy.sum()).backward()
    ours = model.lm_head.weight.grad.clone() if model.lm_head.weight.grad is not None else None
    ours_embed = model.get_input_embeddings().weight.grad.clone()
    model.zero_grad(set_to_none=True)

    logits = model(
        batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
    ).logits
    p = batch.prompt_length
    logp = torch.log_softmax(logits[0, p - 1 : p - 1 + batch.response_length].float() / 0.7, -1)
    mask = batch.action_mask[0] > 0
    chosen = logp.gather(1, batch.response_ids[0][:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(stats.logprob[0][mask], chosen[mask].detach(), atol=1e-5)
    (chosen[mask].sum() + 0.5 * entropy[mask].sum()).backward()
    assert torch.allclose(ours_embed, model.get_input_embeddings().weight.grad, atol=1e-5)
    if ours is not None:
        assert torch.allclose(ours, model.lm_head.weight.grad, atol=1e-5)


def test_the_learner_follows_the_rollout_temperature_and_top_p_is_refused_for_training():
    config = load_config(recipe="tiny", overrides=["rollout.temperature=0.7"])
    assert config.rl.learner.temperature == 0.7
    with pytest.raises(ValueError, match=r"rollout.top_p=0.9: RL training samples with top_p=1"):
        load_config(recipe="tiny", overrides=["rollout.top_p=0.9"])
    with pytest.raises(ValueError, match=r"rollout.temperature must be > 0"):
        load_config(recipe="tiny", overrides=["rollout.temperature=0"])
    # not a setting: one set on purpose was once silently replaced by rollout.temperature
    for value in ("0.5", "1.0", "0.7"):
        with pytest.raises(ValueError, match=r"rl.learner.temperature=.*not a setting.*rollout.temperature"):
            load_config(recipe="tiny", overrides=["rollout.temperature=0.7", f"rl.learner.temperature={value}"])
    with pytest.raises(ValueError, match=r"temperature must be finite and > 0"):
        PolicyModel(torch.nn.Linear(2, 2), temperature=0.0)
