"""The model side shared by the RL learner and SFT: a Hugging Face causal LM scoring response tokens,
token-budget micro-batches (`train/micro_batches.py`, re-exported here), and the optimiser with its
learning-rate schedule.

    policy = PolicyModel(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    stats = policy(micro_batch)        # TokenStats: log pi(a), entropy H (and Phi's collision term) [b, R]

Only the action tokens (action_mask 1) are scored: the LM head runs on their hidden states alone, in
chunks of rows, so neither a [B, T, V] logit tensor nor its log-softmax is ever held; backward recomputes
each chunk's logits. Observation, prompt and padding positions get 0 and carry no gradient.

Rows are packed (`train/packing.py`, `pack_rows`: "auto" by default): the decoder runs on the micro-batch's real
tokens only, as one sequence attended row by row, where a probe finds that exact for the model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

import torch
from torch import Tensor, nn

from stare_agents.hardware import resolve_precision
from stare_agents.train.bf16_emulation import emulated_bf16, round_bf16_product
from stare_agents.train.micro_batches import (  # noqa: F401  (re-exported: the learner's, SFT's and callers' imports)
    PACKINGS,
    MicroBatch,
    Packing,
    plan_micro_batches,
    row_lengths,
    shared_prompt_planning,
    slice_batch,
    split_step,
)
from stare_agents.train.packing import pack_batch, packed_hidden_states, resolve_pack_rows
from stare_agents.trajectory import Batch

# bf16: autocast around the model, fp32 master weights and optimiser state; "fast": bf16 where the device
# computes it fast, else fp32 (stare_agents.hardware); "bf16-emulated": bf16 autocast's rounding computed in
# fp32, to study bf16 on CPUs without bf16 units (train/bf16_emulation.py; as slow as fp32, not faster);
# "fp16": fp16 autocast with fp32 master weights and a dynamic loss scale (`LossScaler`), as the official STARE
# runs train (fp16's 11 significant bits round logits and log-probs 8x finer than bf16's 8, in a range of 6.5e4)
Precision = Literal["fp32", "bf16", "fast", "bf16-emulated", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the autocast dtype of each half precision
LRSchedule = Literal["constant", "cosine"]
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)


@dataclass
class OptimizerConfig:
    """AdamW with gradient-norm clipping and a linear warm-up, then a constant or cosine learning rate."""

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float = 1.0  # <= 0: no clipping (the norm is still measured)
    warmup_steps: int = 0  # the LR rises linearly over this many steps: lr * (step + 1) / warmup_steps
    schedule: LRSchedule = "constant"  # after warm-up: "constant" or "cosine" (to min_lr_ratio * lr at total_steps)
    total_steps: int = 0  # cosine: the step at which the decay ends
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"optimizer.schedule must be one of {LR_SCHEDULES}, got {self.schedule!r}")
        if not (self.lr > 0 and self.warmup_steps >= 0 and 0 <= self.min_lr_ratio <= 1 and self.eps > 0):
            raise ValueError(
                f"need lr > 0, warmup_steps >= 0, 0 <= min_lr_ratio <= 1, eps > 0; got {self.lr=}, "
                f"{self.warmup_steps=}, {self.min_lr_ratio=}, {self.eps=}"
            )
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"a cosine schedule needs total_steps > warmup_steps, got total_steps={self.total_steps}, "
                f"warmup_steps={self.warmup_steps}: set optimizer.total_steps to the run's step count"
            )

    def lr_factor(self, step: int) -> float:
        """Multiplier of `lr` at 0-based `step`."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(
    model: nn.Module, config: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters (no weight decay on biases and norm weights) and its schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_factor)


@dataclass
class LossScaler:
    """Dynamic loss scaling for fp16 (what `torch.amp.GradScaler` does, written for the learner's own step and its
    data-parallel reduction): the loss is multiplied by `scale` before backward, so that small fp16 gradients do
    not flush to zero; the gradients are divided by it before clipping. A step whose gradient norm is not finite
    (an fp16 overflow) is skipped and the scale halved; after `growth_interval` finite steps in a row it doubles.
    Disabled (scale 1, never changes) for every precision but fp16."""

    enabled: bool = False
    scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    min_scale: float = 1.0  # an overflow at this scale is one of the gradients themselves: the callers warn
    finite_steps: int = 0  # finite steps since the last change
    overflows: int = 0  # steps skipped for an overflow, in all

    def __post_init__(self) -> None:
        if not self.enabled:
            self.scale = 1.0
        if not (self.scale > 0 and self.growth_factor > 1 and 0 < self.backoff_factor < 1):
            raise ValueError(
                f"a loss scaler needs scale > 0, growth_factor > 1 and 0 < backoff_factor < 1, got {self}"
            )

    @classmethod
    def for_precision(cls, precision: str) -> LossScaler:
        return cls(enabled=precision == "fp16")

    def unscale_(self, params: Sequence[nn.Parameter]) -> None:
        if self.enabled and self.scale != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(self.scale)

    def absorbs(self, scale_before: float) -> bool:
        """Whether a skipped step taken at `scale_before` was an fp16 overflow this scaler deals with (backing off),
        rather than non-finite gradients of their own, which the caller warns about as in any precision."""
        return self.enabled and scale_before > self.min_scale

    def update(self, finite: bool) -> None:
        """After a step: back off on an overflow, grow after `growth_interval` clean steps."""
        if not self.enabled:
            return
        if not finite:
            self.overflows += 1
            self.finite_steps = 0
            self.scale = max(self.min_scale, self.scale * self.backoff_factor)
            return
        self.finite_steps += 1
        if self.finite_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.finite_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "finite_steps": self.finite_steps, "overflows": self.overflows}

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        if state is None:  # a checkpoint from before the scaler: the start values
            return
        self.scale = float(state["scale"])
        self.finite_steps, self.overflows = int(state["finite_steps"]), int(state["overflows"])


def clip_and_step(
    optimizer: torch.optim.Optimizer,
    params: list[nn.Parameter],
    max_grad_norm: float,
    scaler: LossScaler | None = None,
) -> float:
    """Unscale the gradients (fp16's `scaler`), clip them to `max_grad_norm` (<= 0: measure only) and take the
    optimiser step; returns the norm before clipping. A non-finite norm skips the step (and clears the
    gradients): the caller counts it, and the scaler backs off."""
    if scaler is not None:
        scaler.unscale_(params)
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm > 0 else float("inf"))
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: a DTensor
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.update(math.isfinite(grad_norm))
    return grad_norm


def step_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Advance the LR schedule after an update, taken or skipped (a skipped one still counts, as with torch's
    GradScaler). Quiet about a skipped first update: torch warns that the schedule moved before the optimiser."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before", category=UserWarning)
        scheduler.step()


class PolicyCore(NamedTuple):
    """What the RL learner and SFT both train: the device, the policy (the model behind the chunked LM head, in
    its precision, wrapped in place by `shard` when given: FSDP), its AdamW, its LR schedule and its loss
    scaler (enabled in fp16 only)."""

    device: torch.device
    policy: PolicyModel
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: LossScaler

    @classmethod
    def build(
        cls,
        model: nn.Module,
        config: Any,
        *,
        temperature: float = 1.0,
        fp32_head: bool = False,
        shard: Any = None,
    ) -> PolicyCore:
        """From a learner's or SFT's config (its `optimizer`, `device`, `precision`, `head_chunk_rows` and
        `gradient_checkpointing`, `pack_rows`). `shard`, when given, wraps the policy in place before the optimiser
        is built."""
        target = torch.device(config.device)
        model.to(target)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = PolicyModel(
            model,
            precision=config.precision,
            head_chunk_rows=config.head_chunk_rows,
            temperature=temperature,
            fp32_head=fp32_head,
            pack_rows=config.pack_rows,
            share_prompts=getattr(config, "share_prompts", False),
        )
        if shard is not None:
            shard(policy)
        scaler = LossScaler.for_precision(resolve_precision(config.precision, target.type))
        return cls(target, policy, *build_optimizer(model, config.optimizer), scaler)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    max_grad_norm: float,
    collective: Any = None,
    scaler: LossScaler | None = None,
) -> float:
    """The optimiser step SFT and RL share, for this worker's part of a data-parallel `collective` (the
    learner's `Collective`; None: one worker). A parameter without a gradient gets zeros (every worker then
    reduces the same list) and the workers' gradients are summed, unless FSDP shards them (it reduces them
    itself); then `clip_and_step` (with fp16's `scaler`: every worker sees the same reduced norm, so all skip or
    step together). Returns the norm before clipping (not finite: the step was skipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if collective is None or not collective.shards_gradients:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if collective is not None:
            collective.reduce_gradients(params)
    return clip_and_step(optimizer, params, max_grad_norm, scaler)


def autocast(device: torch.device, precision: str):
    """bf16 or fp16 autocast around the model's forward (or bf16's emulation), or nothing for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    resolved = resolve_precision(precision, device.type)
    if resolved == "fp32":
        return nullcontext()
    if resolved == "bf16-emulated":
        return emulated_bf16()
    return torch.autocast(device_type=device.type, dtype=HALF_DTYPES[resolved])


@dataclass
class TokenStats:
    """Per response position [b, R]: log pi(a) and the entropy H (with grad when computed with grad), and
    the collision term C = sum_k p_k^2 (log p_k + H) of the entropy sensitivity Phi (detached; zeros
    unless asked for). 0 wherever action_mask is 0."""

    logprob: Tensor
    entropy: Tensor
    collision: Tensor


class _ActionTokenHead(torch.autograd.Function):
    """log p(a), H and C of softmax(hidden @ W^T + b) for N rows, in chunks of rows.

    Forward keeps only per-row results (and the logsumexp); backward recomputes each chunk's logits and uses
    d log p_a / dz = onehot(a) - p and dH / dz = -p (log p + H).
    """

    @staticmethod
    def forward(
        ctx,
        hidden,
        weight,
        bias,
        tokens,
        chunk_rows,
        compute_dtype,
        want_collision,
        temperature=1.0,
        emulate=False,
    ):
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        out = {
            k: hidden.new_zeros(n, dtype=torch.float32) for k in ("logprob", "entropy", "collision", "lse")
        }
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(compute_dtype)
            for start in range(0, n, chunk_rows):
                rows = slice(start, start + chunk_rows)
                logits = _logits(hidden[rows], w, bias, compute_dtype, temperature, emulate)
                lse = torch.logsumexp(logits, dim=-1)
                logp = logits.sub_(lse[:, None])
                p = logp.exp()
                h = -(p * logp).sum(-1)
                out["lse"][rows], out["entropy"][rows] = lse, h
                out["logprob"][rows] = logp.gather(1, tokens[rows, None]).squeeze(1)
                if want_collision:
                    out["collision"][rows] = (p * p * (logp + h[:, None])).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, tokens, out["lse"], out["entropy"])
        ctx.chunk_rows, ctx.compute_dtype, ctx.temperature = chunk_rows, compute_dtype, temperature
        ctx.emulate = emulate
        ctx.mark_non_differentiable(out["collision"])
        return out["logprob"], out["entropy"], out["collision"]

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy, _grad_collision):
        hidden, weight, bias, tokens, lse, entropy = ctx.saved_tensors
        if grad_logprob is None and grad_entropy is None:
            return (None,) * 9
        cd = ctx.compute_dtype
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(cd)
            for start in range(0, hidden.shape[0], ctx.chunk_rows):
                rows = slice(start, start + ctx.chunk_rows)
                logp = _logits(hidden[rows], w, bias, cd, ctx.temperature, ctx.emulate).sub_(lse[rows, None])
                p = logp.exp()
                grad_z = torch.zeros_like(p)
                if grad_logprob is not None:  # d log p_a / dz = onehot(a) - p
                    g = grad_logprob[rows, None]
                    grad_z.sub_(p * g).scatter_add_(1, tokens[rows, None], g)
                if grad_entropy is not None:  # dH / dz = -p (log p + H)
                    grad_z.sub_(p * (logp + entropy[rows, None]) * grad_entropy[rows, None])
                if ctx.temperature != 1.0:  # z / T: the chain rule's 1 / T
                    grad_z.div_(ctx.temperature)
                if ctx.emulate:  # the bf16 backward's rounding
                    grad_hidden[rows] = round_bf16_product(grad_z, w).to(hidden.dtype)
                    grad_weight += round_bf16_product(grad_z.t(), hidden[rows])
                else:
                    grad_z = grad_z.to(cd)
                    grad_hidden[rows] = (grad_z @ w).to(hidden.dtype)
                    grad_weight += (grad_z.t() @ hidden[rows].to(cd)).float()
                if grad_bias is not None:
                    grad_bias += grad_z.float().sum(0)
        grad_bias = grad_bias.to(bias.dtype) if grad_bias is not None else None
        return grad_hidden, grad_weight.to(weight.dtype), grad_bias, None, None, None, None, None, None


def _logits(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    compute_dtype: torch.dtype,
    temperature: float = 1.0,
    emulate: bool = False,
) -> Tensor:
    """(hidden @ W^T + b) / T: the sampling distribution's logits at temperature T (`emulate`: the product
    rounded as a bf16 one is, computed in fp32)."""
    if emulate:
        logits = round_bf16_product(hidden.float(), weight.t().float())
    else:
        logits = (hidden.to(compute_dtype) @ weight.t()).float()
    logits = logits + bias.float() if bias is not None else logits
    return logits.div_(temperature) if temperature != 1.0 else logits


class PolicyModel(nn.Module):
    """A Hugging Face causal LM that scores the response tokens of a `Batch` (see the module docstring).

    The model must end in a plain linear LM head (Llama, Qwen2/2.5/3, Mistral, SmolLM, GPT-2 style);
    models that rescale or soft-cap their logits are refused rather than scored wrongly.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        precision: str = "fp32",
        head_chunk_rows: int = 1024,
        temperature: float = 1.0,
        fp32_head: bool = False,
        pack_rows: str = "auto",
        share_prompts: bool = False,
    ) -> None:
        super().__init__()
        if head_chunk_rows < 1:
            raise ValueError(f"head_chunk_rows must be >= 1, got {head_chunk_rows}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(
                f"temperature must be finite and > 0 (the rollout's sampling temperature), got {temperature}"
            )
        # the rollout's temperature: log-probs, entropy and gradients are those of softmax(logits / T), the
        # distribution the engine sampled from (as verl does)
        self.temperature = float(temperature)
        # the LM head and its log-softmax in fp32 under bf16 autocast too (bf16 logits are rounded to 8
        # significant bits: 0.125 at |z| >= 16, a 0.18-nat step at temperature 0.7)
        self.fp32_head = fp32_head
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise ValueError(
                f"the learner keeps float32 master weights; got a {dtype} model: load it with "
                "dtype=torch.float32 and use precision='bf16' for bf16 compute"
            )
        self.model = model
        self.precision = precision
        self.head_chunk_rows = head_chunk_rows
        autocast(torch.device("cpu"), precision)  # validates the word
        config = getattr(model, "config", None)
        for name, neutral in (
            ("final_logit_softcapping", None),
            ("logit_scale", None),
            ("logits_scaling", 1.0),
        ):
            value = getattr(config, name, neutral)
            if value is not None and value != neutral:
                raise ValueError(
                    f"{type(model).__name__} has {name}={value}: its logits are not a plain linear head, "
                    "which the learner's chunked head assumes; use a model without logit scaling or capping"
                )
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if not isinstance(head, nn.Linear):
            raise ValueError(
                f"{type(model).__name__}'s output embeddings are {type(head).__name__}, not nn.Linear: the "
                "learner needs a Hugging Face causal LM with a linear LM head"
            )
        if config is not None:
            config.use_cache = False
        # packed: the decoder runs on the real tokens only, as one sequence (train/packing.py)
        self.packed = resolve_pack_rows(model, pack_rows)
        # packed rows with one prompt (a GRPO group's samples) run that prompt once (train/packing.py)
        self.share_prompts = bool(share_prompts) and self.packed

    @property
    def head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def decoder(self) -> nn.Module:
        return self.model.get_decoder()

    def forward(self, batch: Batch, *, want_collision: bool = False) -> TokenStats:
        device = batch.input_ids.device
        p, r = batch.prompt_length, batch.response_length
        is_action = batch.action_mask > 0
        if self.packed:
            packed = pack_batch(batch, share_prompts=self.share_prompts)
            scoring = packed.index[:, p - 1 : p - 1 + r][is_action]  # the logits at P - 1 + j score token j
            if bool((scoring < 0).any()):
                raise ValueError(
                    "an action token is scored from a padding position (a row with an empty prompt, or an "
                    "action_mask 1 past its response): check how the batch was built"
                )
            with autocast(device, self.precision):
                rows = packed_hidden_states(self.decoder, packed)[0, scoring]
        else:
            with autocast(device, self.precision):
                hidden = self.decoder(
                    input_ids=batch.input_ids,
                    attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids,
                    use_cache=False,
                ).last_hidden_state
            rows = hidden[:, p - 1 : p - 1 + r][is_action]  # the logits at P - 1 + j score response token j
        resolved = resolve_precision(self.precision, device.type)
        half = HALF_DTYPES.get(resolved) if not self.fp32_head else None
        emulate = resolved == "bf16-emulated" and not self.fp32_head
        compute_dtype = half or self.head.weight.dtype
        logprob, entropy, collision = _ActionTokenHead.apply(
            rows,
            self.head.weight,
            self.head.bias,
            batch.response_ids[is_action],
            self.head_chunk_rows,
            compute_dtype,
            want_collision,
            self.temperature,
            emulate,
        )
        return TokenStats(*(_scatter(values, is_action) for values in (logprob, entropy, collision)))


def _scatter(values: Tensor, where: Tensor) -> Tensor:
    out = torch.zeros(where.shape, dtype=values.dtype, device=values.device)
    return out.masked_scatter(where, values)


def load_causal_lm(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """A Hugging Face causal LM from a local directory, in float32 (the learner's master weights)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face model directory (no config.json); prepare one with "
            "stare_agents.models.prepare_model(...)"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to(device)


def save_policy_shards(policy: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """The model and optimiser as this worker holds them (its FSDP shards; a replica's copy is written once),
    with torch.distributed.checkpoint: every data-parallel worker calls it, on storage they all reach."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(policy, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(folder))


def load_policy_shards(policy: nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> None:
    """Read back what `save_policy_shards` wrote, each worker its own shards (every worker calls it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(policy, optimizer)  # the layout to fill
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(policy, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
