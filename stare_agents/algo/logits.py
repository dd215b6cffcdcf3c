"""Token log-probabilities and entropy from logits, without materialising the [B, T, V] softmax twice.

`token_logprobs` uses log pi(a) = z_a - logsumexp(z): the forward pass keeps only [B, T] results and
autograd reuses the logits it already holds. `token_entropy` walks the rows in chunks, so at most one
chunk's probabilities exist at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log pi(tokens) for logits [..., V] and tokens [...]; float32, differentiable."""
    logits = logits.float()
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _chunked_rows(logits: Tensor, chunk_size: int):
    flat = logits.reshape(-1, logits.shape[-1])
    for start in range(0, flat.shape[0], chunk_size):
        yield flat[start : start + chunk_size].float()


def token_entropy(logits: Tensor, *, chunk_size: int = 1024, grad: bool = False) -> Tensor:
    """H = -sum_k p_k log p_k per position, computed in chunks of `chunk_size` rows.

    With `grad=False` (diagnostics, the entropy gate) no graph is kept; with `grad=True` (entropy
    bonus) each chunk's graph is kept for backward.
    """
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        parts = []
        for rows in _chunked_rows(logits, chunk_size):
            logp = torch.log_softmax(rows, dim=-1)
            parts.append(-(logp.exp() * logp).sum(-1))
        entropy = torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32)
    return entropy.view(logits.shape[:-1])


@torch.no_grad()
def token_statistics(logits: Tensor, tokens: Tensor, *, chunk_size: int = 1024) -> dict[str, Tensor]:
    """Detached per-position statistics in one chunked pass.

    Returns `logprob` (log p_a), `entropy` (H) and `collision` C = sum_k p_k^2 (log p_k + H), the
    token-independent part of the entropy sensitivity Phi (see `diagnostics.entropy_sensitivity`).
    """
    flat_tokens = tokens.reshape(-1).long()
    logprob, entropy, collision = [], [], []
    offset = 0
    for rows in _chunked_rows(logits, chunk_size):
        logp = torch.log_softmax(rows, dim=-1)
        p = logp.exp()
        h = -(p * logp).sum(-1)
        idx = flat_tokens[offset : offset + rows.shape[0]]
        logprob.append(logp.gather(-1, idx[:, None]).squeeze(-1))
        entropy.append(h)
        collision.append((p * p * (logp + h[:, None])).sum(-1))
        offset += rows.shape[0]
    shape = logits.shape[:-1]
    return {
        "logprob": torch.cat(logprob).view(shape),
        "entropy": torch.cat(entropy).view(shape),
        "collision": torch.cat(collision).view(shape),
    }


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over positions where mask is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
