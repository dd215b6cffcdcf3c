"""What one policy-gradient step does to the policy's entropy, predicted to first order and measured.

The paper's analysis (Section 3) works in logit space: a step dz = eta * A * w * (onehot(a) - p) on one token
changes that position's entropy by -eta * A * w * Phi(p, a), so the sign of A and of Phi decides the direction
(the four quadrants; Phi < 0 for high-surprisal tokens). A real model's step moves parameters, and every
token's gradient moves every position's logits. This probe measures both on a real batch:

    probe = EntropyProbe(policy, batch, advantages)     # one batch, its per-sequence advantages
    probe.predicted(weights, lr)    # -lr * <grad H, grad L_w>: the exact first-order change of the batch's
                                    # token-mean entropy under a plain gradient step on the weighted loss
    probe.measured(weights, lr)     # H(theta - lr grad L_w) - H(theta), re-scored
    probe.logit_space(weights)      # the paper's per-token formula, -(1/N) sum_t A_t w_t Phi_t (per unit eta)

L_w = -(1/N) sum_t A_t w_t log pi(a_t) over the action tokens (the clipped surrogate's gradient at ratio 1,
before any clip bites). The gradient is linear in the token weights, so the probe splits it once into parts:
the four quadrants (sign of A, sign of Phi), each split again into STARE's selection (L+ / L- at top_ratio)
and the rest (`quadrants=False`: only L+, L- and the rest, three gradients instead of eight). Any weighting that
is constant on each part (GRPO, STARE O1 or C2 at any W and M, a random-token control with the same P) is then a
combination of those gradients: `predicted` for it is a dot product, the W at which the first-order drift
changes sign is `critical_w`, and C2's M at which it does, at a given W, `critical_m`.

Training does not take that step: it takes AdamW's, whose direction is the gradient preconditioned by the
optimiser's moments (close to sign(g) on a first step; mostly the momentum of earlier steps later) and whose
size is the learning rate times about 1 per parameter. `AdamStep` computes exactly that step on a probe's
gradient from the optimiser's current state (the learner's, warmed up by replaying a run's steps), without
taking it:

    delta, norm = AdamStep(learner.optimizer, policy, max_grad_norm).delta(probe.direction(weights))
    probe.predicted_step(delta)     # <grad H, delta>: first order in the step training takes
    probe.measured_step(delta)      # H(theta + delta) - H(theta), re-scored
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from stare_agents.algo import sensitivity_from_statistics, stare_selection
from stare_agents.train.policy import PolicyModel, split_step
from stare_agents.trajectory import Batch

QUADRANTS = ("pos_high", "pos_low", "neg_high", "neg_low")  # sign of A, and Phi < 0 (high) or >= 0 (low)


def _dot(a: Tensor, b: Tensor, chunk: int = 1 << 22) -> float:
    """<a, b> accumulated in float64, a chunk at a time."""
    return sum(
        float(a[i : i + chunk].double() @ b[i : i + chunk].double()) for i in range(0, a.numel(), chunk)
    )


@dataclass
class PartWeights:
    """A token weighting constant on each part: `selected` multiplies STARE's L+ (positive advantage) and L-
    (negative advantage), `rest` every other action token."""

    pos_selected: float = 1.0
    neg_selected: float = 1.0
    rest: float = 1.0

    @classmethod
    def stare(cls, variant: str = "O1", w: float = 1.1, m: float = 0.9) -> PartWeights:
        return cls(pos_selected=w, neg_selected=m if variant == "C2" else 1.0)


class EntropyProbe:
    def __init__(
        self,
        policy: PolicyModel,
        batch: Batch,
        advantages: Tensor,
        *,
        top_ratio: float = 0.1,
        micro_batch_tokens: int = 4096,
        selection: tuple[Tensor, Tensor] | None = None,
        scope: str = "batch",
        quadrants: bool = True,
    ) -> None:
        """`selection`: (L+, L-) masks [B, R] to use instead of STARE's top-`top_ratio` by surprisal (e.g. a
        random control's); `scope`: STARE's selection over the whole batch ("batch") or over each micro-batch of
        the plan ("micro-batch", what the learner does by default); `quadrants`: split the gradient by quadrant
        (eight parts) or only into L+, L- and the rest (three)."""
        if scope not in ("batch", "micro-batch"):
            raise ValueError(f"scope must be 'batch' or 'micro-batch', got {scope!r}")
        self.policy, self.batch, self.quadrants = policy, batch, quadrants
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.plan = [
            mb
            for u in split_step(batch, advantages, mini_batches=1, micro_batch_tokens=micro_batch_tokens)
            for mb in u
        ]
        self.mask = batch.action_mask > 0
        self.count = float(self.mask.sum())
        self.advantages = (
            advantages[:, None].expand_as(self.mask).float() if advantages.dim() == 1 else advantages
        )
        policy.eval()
        with torch.no_grad():
            stats = policy(batch, want_collision=True)
        self.entropy_before = float(stats.entropy[self.mask].sum()) / self.count
        self.phi = sensitivity_from_statistics(
            {"logprob": stats.logprob, "entropy": stats.entropy, "collision": stats.collision}
        )
        if selection is None and scope == "batch":
            selection = stare_selection(
                -stats.logprob, self.advantages, batch.action_mask, top_ratio=top_ratio
            )
        elif selection is None:  # each micro-batch's own L+/L-, as the learner takes them
            lplus, lminus = torch.zeros_like(self.mask), torch.zeros_like(self.mask)
            for mb in self.plan:
                width = mb.batch.response_length
                chosen = stare_selection(
                    -stats.logprob[mb.rows][:, :width],
                    self.advantages[mb.rows][:, :width],
                    batch.action_mask[mb.rows][:, :width],
                    top_ratio=top_ratio,
                )
                for full, part in zip((lplus, lminus), chosen, strict=True):
                    full[mb.rows, :width] = part
            selection = (lplus, lminus)
        self.lplus, self.lminus = selection
        self.parts = self._parts()
        self.grad_entropy = self._gradient(self._entropy_sum)
        self.part_grads = {name: self._gradient(self._loss_sum(mask)) for name, mask in self.parts.items()}
        self.part_dots = {name: _dot(g, self.grad_entropy) for name, g in self.part_grads.items()}

    # ---- the parts ----
    def _parts(self) -> dict[str, Tensor]:
        a, phi, m = self.advantages, self.phi, self.mask
        if not self.quadrants:
            pos, neg = m & (a > 0) & self.lplus, m & (a < 0) & self.lminus
            return {"pos/selected": pos, "neg/selected": neg, "all/rest": m & (a != 0) & ~pos & ~neg}
        quadrant = {
            "pos_high": m & (a > 0) & (phi < 0),
            "pos_low": m & (a > 0) & (phi >= 0),
            "neg_high": m & (a < 0) & (phi < 0),
            "neg_low": m & (a < 0) & (phi >= 0),
        }
        parts = {}
        for name, q in quadrant.items():
            chosen = self.lplus if name.startswith("pos") else self.lminus
            parts[f"{name}/selected"] = q & chosen
            parts[f"{name}/rest"] = q & ~chosen
        return parts

    def part_weight(self, part: str, weights: PartWeights) -> float:
        if part.endswith("/rest"):
            return weights.rest
        return weights.pos_selected if part.startswith("pos") else weights.neg_selected

    def token_weights(self, weights: PartWeights) -> Tensor:
        out = torch.zeros_like(self.advantages)
        for name, mask in self.parts.items():
            out[mask] = self.part_weight(name, weights)
        return out

    # ---- gradients over micro-batches ----
    def _rows(self, mb, full: Tensor) -> Tensor:
        return full[mb.rows][:, : mb.batch.response_length]

    def _entropy_sum(self, mb, stats) -> Tensor:
        return (stats.entropy * (mb.batch.action_mask > 0)).sum() / self.count

    def _loss_sum(self, part: Tensor):
        def loss(mb, stats) -> Tensor:
            selected = self._rows(mb, part) & (mb.batch.action_mask > 0)
            return -(self._rows(mb, self.advantages) * stats.logprob * selected).sum() / self.count

        return loss

    def _gradient(self, objective) -> Tensor:
        self.policy.zero_grad(set_to_none=True)
        self.policy.train()
        for mb in self.plan:
            objective(mb, self.policy(mb.batch)).backward()
        self.policy.eval()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.flatten() for g in grads]).float()  # float32: 9 of them for a 135M model fit
        self.policy.zero_grad(set_to_none=True)
        return flat

    # ---- what a weighting does ----
    def direction(self, weights: PartWeights) -> Tensor:
        total = torch.zeros_like(self.grad_entropy)
        for name, g in self.part_grads.items():
            total += self.part_weight(name, weights) * g
        return total

    def predicted(self, weights: PartWeights, lr: float, parts: list[str] | None = None) -> float:
        """First-order change of the token-mean entropy of the batch under theta -= lr * grad L_w."""
        names = parts if parts is not None else list(self.part_dots)
        return -lr * sum(self.part_weight(n, weights) * self.part_dots[n] for n in names)

    def logit_space(self, weights: PartWeights, parts: list[str] | None = None) -> float:
        """The paper's per-token first-order formula, -(1/N) sum_t A_t w_t Phi_t, per unit logit step."""
        names = parts if parts is not None else list(self.parts)
        w = self.token_weights(weights)
        total = 0.0
        for name in names:
            mask = self.parts[name]
            total += float((self.advantages * w * self.phi)[mask].sum())
        return -total / self.count

    @torch.no_grad()
    def measured(self, weights: PartWeights, lr: float, parts: list[str] | None = None) -> float:
        """H after the step theta -= lr * grad L_w (only `parts`, when given) minus H before, re-scored."""
        step = torch.zeros_like(self.grad_entropy)
        for name in parts if parts is not None else list(self.part_grads):
            step += self.part_weight(name, weights) * self.part_grads[name]
        return self.measured_step(-lr * step)

    def predicted_step(self, delta: Tensor) -> float:
        """First-order change of the batch's token-mean entropy under theta += delta: <grad H, delta>."""
        return _dot(self.grad_entropy, delta)

    @torch.no_grad()
    def measured_step(self, delta: Tensor) -> float:
        """H after theta += delta minus H before, re-scored on the batch (the parameters are put back)."""
        saved = [p.detach().clone() for p in self.params]
        offset = 0
        for p in self.params:
            n = p.numel()
            p.add_(delta[offset : offset + n].view_as(p).to(p.dtype))
            offset += n
        try:
            return self.rescored()
        finally:
            for p, s in zip(self.params, saved, strict=True):
                p.copy_(s)

    @torch.no_grad()
    def rescored(self) -> float:
        """The batch's token-mean entropy under the policy's current parameters minus what it was when the probe
        was built (e.g. after a learner's own step)."""
        self.policy.eval()
        stats = self.policy(self.batch)
        return float(stats.entropy[self.mask].sum()) / self.count - self.entropy_before

    def critical_w(self, *, m: float = 1.0, variant: str = "O1") -> float:
        """The W at which the first-order entropy drift of STARE (m on L- for C2) changes sign: the drift is
        linear in W, -lr * (base + W * plus); W* = -base / plus (inf when L+ does not move the entropy)."""
        plus = sum(d for n, d in self.part_dots.items() if n.startswith("pos") and n.endswith("/selected"))
        base = sum(
            (m if (variant == "C2" and n.startswith("neg") and n.endswith("/selected")) else 1.0) * d
            for n, d in self.part_dots.items()
            if not (n.startswith("pos") and n.endswith("/selected"))
        )
        return -base / plus if plus else math.inf

    def critical_m(self, *, w: float) -> float:
        """The M at which C2's first-order drift at weight `w` on L+ changes sign: the drift is linear in M,
        -lr * (base + M * minus) with `minus` L-'s part; M* = -base / minus (inf when L- does not move the
        entropy). With M below M* (and minus > 0, L- pushing the entropy down) the step raises the entropy."""
        minus = sum(d for n, d in self.part_dots.items() if n.startswith("neg") and n.endswith("/selected"))
        base = sum(
            (w if n.startswith("pos") and n.endswith("/selected") else 1.0) * d
            for n, d in self.part_dots.items()
            if not (n.startswith("neg") and n.endswith("/selected"))
        )
        return -base / minus if minus else math.inf

    def quadrant_counts(self) -> dict[str, int]:
        a, high, m = self.advantages, self.phi < 0, self.mask
        pos, neg = m & (a > 0), m & (a < 0)
        masks = {
            "pos_high": pos & high,
            "pos_low": pos & ~high,
            "neg_high": neg & high,
            "neg_low": neg & ~high,
        }
        return {q: int(masks[q].sum()) for q in QUADRANTS}


class AdamStep:
    """The step AdamW would take on a given gradient from its current state, computed without taking it.

    `delta(gradient)` (the flat `gradient` in the order of `model.parameters()` that require grad, as
    `EntropyProbe.params`) clips it as training does (`clip_grad_norm_`: scaled by max_grad_norm / (norm + 1e-6)
    when that is below 1) and applies torch's AdamW update rule to each parameter with the optimiser's own state
    (its moments, step count, learning rate, betas, eps and each group's weight decay), reading the state and
    writing nothing: the change is -lr wd theta - lr / (1 - b1^t) m_t / (sqrt(v_t / (1 - b2^t)) + eps), with
    m_t = b1 m + (1 - b1) g, v_t = b2 v + (1 - b2) g^2, t = step + 1. (A copy of the state would cost two
    more model-sized buffers; tests hold this against the learner's real step.) AdamW only, without amsgrad.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, max_grad_norm: float
    ) -> None:
        if not isinstance(optimizer, torch.optim.AdamW) or any(
            g.get("amsgrad") or g.get("maximize") for g in optimizer.param_groups
        ):
            raise ValueError(
                f"AdamStep computes AdamW's update (no amsgrad, no maximize); got {optimizer!r:.200}"
            )
        self.optimizer, self.max_grad_norm = optimizer, max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        missing = [i for i, p in enumerate(self.params) if id(p) not in self.groups]
        if missing:
            raise ValueError(f"{len(missing)} trainable parameters of the model are not in the optimiser")

    @torch.no_grad()
    def delta(self, gradient: Tensor) -> tuple[Tensor, float]:
        """(the parameters' change as one float32 vector, the gradient's norm before clipping)."""
        total = sum(p.numel() for p in self.params)
        if gradient.numel() != total:
            raise ValueError(f"the gradient has {gradient.numel()} entries; the model's parameters {total}")
        norm = float(gradient.double().norm())
        scale = min(1.0, self.max_grad_norm / (norm + 1e-6)) if self.max_grad_norm > 0 else 1.0
        change = torch.empty(total, dtype=torch.float32)
        offset = 0
        for p in self.params:
            n, group = p.numel(), self.groups[id(p)]
            g = gradient[offset : offset + n].view_as(p).to(p.dtype) * scale
            (beta1, beta2), lr, eps = group["betas"], float(group["lr"]), group["eps"]
            state = self.optimizer.state.get(p, {})
            step = float(state["step"]) + 1 if "step" in state else 1.0
            m = state["exp_avg"] * beta1 + g * (1 - beta1) if "exp_avg" in state else g * (1 - beta1)
            v = (
                state["exp_avg_sq"] * beta2 + g * g * (1 - beta2)
                if "exp_avg_sq" in state
                else g * g * (1 - beta2)
            )
            denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
            update = -(lr / (1 - beta1**step)) * m / denom - lr * group["weight_decay"] * p.detach()
            change[offset : offset + n] = update.flatten().float()
            offset += n
        return change, norm
