"""Helpers of the learner tests: a tiny random Llama (fixed seed), synthetic tool-interleaved rollouts, and
comparisons of learner states and metrics."""

from __future__ import annotations

import math

import torch

from stare_agents.algo import AlgorithmConfig, compute_advantages
from stare_agents.train.learner import Learner, LearnerConfig
from stare_agents.train.policy import OptimizerConfig
from stare_agents.trajectory import Batch, Trajectory, collate

VOCAB = 512


def tiny_model(seed: int = 0, *, tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).float()


def rollouts(
    seed: int = 0, *, groups: int = 2, group_size: int = 4, max_prompt: int = 12, max_response: int = 40
):
    """Groups of trajectories with varied lengths: action spans, then an observation span (action_mask 0),
    then more action tokens; rollout log-probs near the policy's scale; binary rewards."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(groups):
        prompt = torch.randint(
            1, VOCAB, (int(torch.randint(3, max_prompt + 1, (1,), generator=gen)),), generator=gen
        )
        for i in range(group_size):
            length = int(torch.randint(6, max_response + 1, (1,), generator=gen))
            response = torch.randint(1, VOCAB, (length,), generator=gen).tolist()
            obs_start = int(torch.randint(1, max(2, length - 3), (1,), generator=gen))
            mask = [0 if obs_start <= j < obs_start + 3 else 1 for j in range(length)]
            logprobs = [(-float(torch.rand(1, generator=gen)) * 6.5 if bit else 0.0) for bit in mask]
            out.append(
                Trajectory(
                    prompt_ids=prompt.tolist(),
                    response_ids=response,
                    action_mask=mask,
                    rollout_logprobs=logprobs,
                    reward=float((g + i) % 2),
                    group_id=f"g{g}",
                    sample_index=i,
                    task_id=f"t{g}",
                )
            )
    return out


TIMING = {"learner/tokens_per_s", "learner/step_s", "learner/pre_update_s"}


def step_inputs(seed: int = 0, **kwargs) -> tuple[list[Trajectory], Batch, torch.Tensor]:
    trajectories = rollouts(seed, **kwargs)
    batch = collate(trajectories, pad_token_id=0)
    groups = [t.group_id for t in trajectories]
    advantages = compute_advantages(batch.rewards, groups, AlgorithmConfig.preset("grpo")).advantages
    return trajectories, batch, advantages


def make_learner(
    algorithm: AlgorithmConfig | str = "grpo-ds", *, seed: int = 0, lr: float = 1e-3, model=None, **config
):
    if isinstance(algorithm, str):
        algorithm = AlgorithmConfig.preset(algorithm)
    # Adam eps 1e-5 (not 1e-8): float summation noise on near-zero gradients must not flip whole updates
    optimizer = OptimizerConfig(lr=lr, **{"eps": 1e-5, **config.pop("optimizer", {})})
    model = tiny_model(seed) if model is None else model
    return Learner(model, algorithm, LearnerConfig(optimizer=optimizer, **config))


def peaked_model(seed: int = 0, scale: float = 20.0):
    """A tiny untied Llama whose LM head is scaled up: confident and surprising tokens, entropy ~2.6 nats, log-prob std ~3.5."""
    model = tiny_model(seed, tied=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def assert_same_metrics(a: dict, b: dict, *, rel: float = 0.0, ignore=()) -> None:
    assert a.keys() == b.keys()
    for key in a.keys() - TIMING - set(ignore):
        x, y = a[key], b[key]
        if math.isnan(x) or math.isnan(y):
            assert math.isnan(x) and math.isnan(y), key
        else:
            assert math.isclose(x, y, rel_tol=rel, abs_tol=rel * 1e-3), (key, x, y)


def max_param_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)
