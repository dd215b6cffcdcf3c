"""Near-criticality simulation: a tabular softmax policy trained with GRPO or STARE on CPU in seconds.

The policy holds one logit vector per context. A rollout is a sequence of contexts with one sampled
token each; its reward is 1 with probability (1 - credit) / 2 + credit * the fraction of positions where the
policy emitted the context's preferred token (a reward that favours confident tokens; one token's credit is
credit / seq_len). Under GRPO the entropy collapses; with STARE's gate
and a target it holds in a band around the target, because the entropy drift of a group-normalised
policy gradient is a small difference of large opposing terms (on-policy, E_a[Phi] = 0), which a
weight slightly above 1 on the surprising positive-advantage tokens already outweighs
(`stare_agents.algo.criticality` measures where the drift turns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from stare_agents.algo.advantages import grpo_advantages
from stare_agents.algo.diagnostics import negative_sensitivity_fraction, sensitivity_from_statistics
from stare_agents.algo.logits import masked_mean, token_logprobs, token_statistics
from stare_agents.algo.losses import PolicyLossConfig, policy_loss
from stare_agents.algo.stare import Stare, StareConfig


@dataclass
class SimulationConfig:
    algorithm: str = "stare"  # "grpo" or "stare"
    steps: int = 300
    num_contexts: int = 64
    vocab_size: int = 32
    seq_len: int = 256  # long responses: per-token credit of a binary outcome reward is weak (near-critical)
    # kappa: P(reward) = (1 - kappa) / 2 + kappa * hit rate, so one token moves it by kappa / seq_len (its credit)
    credit: float = 1.0
    num_prompts: int = 8
    group_size: int = 8
    lr: float = 500.0  # plain SGD on the logits of a token-mean loss
    init_scale: float = 6.0  # initial logits ~ N(0, init_scale^2): mean entropy ~0.7 nats at V = 32
    seed: int = 0
    variant: str = "O1"
    top_ratio: float = 0.1
    w: float = 1.1
    m: float = 0.9
    target_entropy: float = 0.3
    gated: bool = True


@dataclass
class SimulationResult:
    config: SimulationConfig
    entropy: list[float] = field(default_factory=list)  # pre-update mean entropy over action tokens
    reward: list[float] = field(default_factory=list)
    gate_on: list[bool] = field(default_factory=list)
    lplus_negative_phi: list[float] = field(default_factory=list)  # fraction of L+ with Phi < 0


@dataclass
class Rollouts:
    """One step's batch: `num_prompts` groups of `group_size` sequences of `seq_len` (context, token) pairs."""

    contexts: torch.Tensor  # [batch, seq_len] context index of each position
    tokens: torch.Tensor  # [batch, seq_len] the sampled token
    rewards: torch.Tensor  # [batch] binary outcome reward
    reward_probability: torch.Tensor  # [batch] the probability each reward was drawn with


def initial_policy(config: SimulationConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """(logits [num_contexts, vocab_size] ~ N(0, init_scale^2), the token each context rewards (its argmax), the
    generator the run continues to draw from), all from `config.seed`."""
    if not (0.0 < config.credit <= 1.0 and config.seq_len >= 1):
        raise ValueError(
            f"need 0 < credit <= 1 and seq_len >= 1; got credit={config.credit}, seq_len={config.seq_len}"
        )
    gen = torch.Generator().manual_seed(config.seed)
    logits = torch.randn(config.num_contexts, config.vocab_size, generator=gen) * config.init_scale
    return logits, logits.argmax(dim=-1), gen


def sample_rollouts(
    logits: torch.Tensor, preferred: torch.Tensor, config: SimulationConfig, gen: torch.Generator
) -> Rollouts:
    """Sample a batch from the policy `logits`; a sequence's reward is 1 with probability
    (1 - credit) / 2 + credit * (its share of positions where the context's preferred token was emitted)."""
    prompts = torch.randint(0, config.num_contexts, (config.num_prompts, config.seq_len), generator=gen)
    contexts = prompts.repeat_interleave(config.group_size, dim=0)  # [batch, seq_len]
    with torch.no_grad():
        probs = torch.softmax(logits[contexts], dim=-1)
        tokens = torch.multinomial(probs.view(-1, config.vocab_size), 1, generator=gen).view(contexts.shape)
    hit_rate = (tokens == preferred[contexts]).float().mean(dim=1)
    reward_probability = (1.0 - config.credit) / 2 + config.credit * hit_rate
    rewards = torch.bernoulli(reward_probability, generator=gen)
    return Rollouts(contexts, tokens, rewards, reward_probability)


def simulate(config: SimulationConfig, initial_logits: torch.Tensor | None = None) -> SimulationResult:
    """Run the simulation; `initial_logits` [num_contexts, vocab_size] continues from a given policy."""
    if config.algorithm not in ("grpo", "stare"):
        raise ValueError(f"algorithm must be 'grpo' or 'stare', got {config.algorithm!r}")
    base, preferred, gen = initial_policy(config)
    logits = (initial_logits.clone() if initial_logits is not None else base).requires_grad_(True)
    optimizer = torch.optim.SGD([logits], lr=config.lr)
    loss_config = PolicyLossConfig(aggregation="token-mean")
    stare = Stare(
        StareConfig(
            variant=config.variant,
            top_ratio=config.top_ratio,
            w=config.w,
            m=config.m,
            target_entropy=config.target_entropy,
            gated=config.gated,
        )
    )
    result = SimulationResult(config)
    batch = config.num_prompts * config.group_size

    for _ in range(config.steps):
        rollouts = sample_rollouts(logits, preferred, config, gen)
        contexts, tokens, rewards = rollouts.contexts, rollouts.tokens, rollouts.rewards
        advantages = grpo_advantages(rewards, config.group_size)
        action_mask = torch.ones(batch, config.seq_len)

        step_logits = logits[contexts]
        stats = token_statistics(step_logits, tokens)
        mean_entropy = float(masked_mean(stats["entropy"], action_mask))
        gate_on = config.algorithm == "stare" and stare.update(mean_entropy)
        weights = None
        if gate_on:
            top_pos, top_neg = stare.selection(-stats["logprob"], advantages, action_mask)
            weights = stare.weights_from_selection(top_pos, top_neg)
            result.lplus_negative_phi.append(
                negative_sensitivity_fraction(top_pos, sensitivity_from_statistics(stats))
            )

        logprobs = token_logprobs(step_logits, tokens)
        loss, _ = policy_loss(
            logprobs, logprobs.detach(), advantages, action_mask, loss_config, token_weights=weights
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        result.entropy.append(mean_entropy)
        result.reward.append(float(rewards.mean()))
        result.gate_on.append(gate_on)
    return result
