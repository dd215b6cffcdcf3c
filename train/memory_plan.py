"""The learner's memory plan: whether a model, its optimiser and a micro-batch fit one device, decided from the
model's config before any weight is loaded, and what to change when they do not.

    shape = ModelShape.of_dir(model_dir)                        # parameters counted on the meta device
    plan = plan_memory(shape, device_memory("cuda"), precision="bf16", micro_batch_tokens=16384,
                       gradient_checkpointing=False, longest_row=2048)
    plan.micro_batch_tokens, plan.gradient_checkpointing        # what to train with; MemoryPlanError if nothing fits

What one learner worker holds at its peak, in bytes (N parameters, k FSDP shards, T tokens in the largest
micro-batch, L layers):
- 16 N / k: fp32 master weights (4), their gradients (4) and AdamW's two moments (8);
- 4 N / k more during AdamW's step: the foreach implementation's temporary (the activations are gone by then);
- 2 N in bf16/fp16: the half copies of the weights autocast keeps for backward;
- T L a: what the forward saves for backward, a per token and layer from the shape (`ACTIVATION_BYTES`, measured
  on CPU with saved-tensor hooks for packed rows; tests/train/test_memory_plan.py measures them again); with
  gradient checkpointing T L 4 h (each layer's fp32 input) plus two layers' worth (the one recomputed, its grads);
- the chunked LM head's logits, 3 x head_chunk_rows x vocab x 4;
and the device keeps max(5%, 1 GiB) back for the CUDA context and the allocator's fragmentation. On the CPU the
resident set rises 24-41% of (activations + head) above that (the heap's fragmentation, backward's temporaries;
measured with benchmarks/bench_learner.py): the CPU's estimate adds 45% of them (`CPU_TRANSIENT_SHARE`).

`plan_memory` keeps the configured micro-batch budget and checkpointing when they fit ("fit" and "check"); when
they do not, "fit" first turns gradient checkpointing on (the same updates, more compute), then lowers the budget
(other micro-batches: it changes per-micro-batch selection), each said in `changes`; "check" refuses, naming what
would fit. Nothing that fits -> `MemoryPlanError`, with the numbers and the alternatives (FSDP over enough GPUs,
a smaller model). Checked against one H200 (bf16, Qwen2.5 0.5B/1.5B/3B shapes, padded rows): the estimate was
within 10% of torch's measured peak (docs/gpu.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

GIB = 2**30
MemoryMode = Literal["fit", "check", "off"]
MEMORY_MODES: tuple[str, ...] = get_args(MemoryMode)
STATE_BYTES = 16  # per parameter: fp32 weights 4 + gradients 4 + AdamW's exp_avg and exp_avg_sq 8
OPTIMIZER_TEMP_BYTES = 4  # per parameter, during AdamW's (foreach) step
HALF_COPY_BYTES = 2  # per parameter under bf16/fp16 autocast
# saved for backward per token and decoder layer, in bytes per unit of (hidden, intermediate, kv width, heads)
ACTIVATION_BYTES = {"fp32": (36, 16, 8, 4), "half": (32, 8, 4, 4)}
CHECKPOINT_BYTES = 4  # per token, layer and hidden unit: a checkpointed layer keeps its fp32 input
HEAD_COPIES = 3  # logits, probabilities and their gradient of one chunk of the LM head, fp32
RESERVE_SHARE, RESERVE_MIN = 0.05, GIB
# on the CPU, the resident set rises above the saved tensors by this share of activations + LM head: the heap's
# fragmentation and backward's temporaries, which CUDA's caching allocator reuses. Measured with
# benchmarks/bench_learner.py (SmolLM2-135M, the default job's rows, 4096-token micro-batches): packed rows
# +24% (bf16) and +28% (fp32), padded +41% and +36% (benchmarks/logs/learner-memory-cpu.json)
CPU_TRANSIENT_SHARE = 0.45
BUDGET_STEP = 256  # a lowered micro-batch budget is a multiple of this


class MemoryPlanError(ValueError):
    """The learner cannot fit the device: the message has the numbers and what would fit."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a causal LM: its parameter count and its layer dimensions."""

    name: str
    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_width: int  # key/value heads x head dim
    vocab: int

    @classmethod
    def of_config(cls, config: Any) -> ModelShape:
        """From a transformers config; the parameters are counted on an empty (meta) model, tied ones once."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        params = sum(p.numel() for p in model.parameters())
        hidden = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        intermediate = int(getattr(config, "intermediate_size", None) or 4 * hidden)
        return cls(
            type(model).__name__,
            params,
            int(config.num_hidden_layers),
            hidden,
            intermediate,
            heads,
            kv_heads * head_dim,
            int(config.vocab_size),
        )

    @classmethod
    def of_dir(cls, path: str | Path) -> ModelShape:
        from transformers import AutoConfig

        return cls.of_config(AutoConfig.from_pretrained(path))

    def activation_bytes(self, precision: str) -> int:
        """Saved for backward, per token and layer, without checkpointing."""
        a, b, c, d = ACTIVATION_BYTES["fp32" if precision == "fp32" else "half"]
        return a * self.hidden + b * self.intermediate + c * self.kv_width + d * self.heads


@dataclass(frozen=True)
class Estimate:
    """Peak bytes of one learner worker, by part (see the module docstring)."""

    states: int
    optimizer_step: int
    half_copies: int
    activations: int
    head: int
    host_transients: int = 0  # the CPU only: CPU_TRANSIENT_SHARE of activations + head

    @property
    def peak(self) -> int:
        step = self.half_copies + self.activations + self.head + self.host_transients
        return self.states + max(self.optimizer_step, step)


def estimate(
    shape: ModelShape,
    *,
    precision: str,
    tokens: int,
    gradient_checkpointing: bool,
    shards: int = 1,
    head_chunk_rows: int = 1024,
    device: str = "cuda",
) -> Estimate:
    """The peak of a learner step on `tokens` tokens (the largest micro-batch); `precision` already resolved
    (fp32, bf16, fp16 or bf16-emulated, which computes in fp32); `device` "cpu" adds the host's transients."""
    half = precision in ("bf16", "fp16")
    per_layer = shape.activation_bytes("half" if half else "fp32")
    if gradient_checkpointing:
        activations = tokens * (shape.layers * CHECKPOINT_BYTES * shape.hidden + 2 * per_layer)
    else:
        activations = tokens * shape.layers * per_layer
    head = HEAD_COPIES * head_chunk_rows * shape.vocab * 4
    return Estimate(
        states=math.ceil(STATE_BYTES * shape.params / shards),
        optimizer_step=math.ceil(OPTIMIZER_TEMP_BYTES * shape.params / shards),
        half_copies=HALF_COPY_BYTES * shape.params if half else 0,
        activations=activations,
        head=head,
        host_transients=math.ceil(CPU_TRANSIENT_SHARE * (activations + head)) if device == "cpu" else 0,
    )


def usable_bytes(device_bytes: int) -> int:
    """What the learner may plan with on a device of `device_bytes`."""
    return max(0, device_bytes - max(int(RESERVE_SHARE * device_bytes), RESERVE_MIN))


@dataclass(frozen=True)
class MemoryPlan:
    """What the learner trains with on a device, and why (see `plan_memory`)."""

    shape: ModelShape
    device_bytes: int
    precision: str
    micro_batch_tokens: int
    gradient_checkpointing: bool
    tokens: int  # the largest micro-batch: max(budget, the longest row)
    shards: int
    estimate: Estimate
    changes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fits(self) -> bool:
        return self.estimate.peak <= usable_bytes(self.device_bytes)

    def summary(self) -> str:
        e = self.estimate
        return (
            f"memory plan: {self.shape.name} ({parameters(self.shape.params)} parameters"
            f"{f', FSDP over {self.shards}' if self.shards > 1 else ''}) in {self.precision}, micro_batch_tokens "
            f"{self.micro_batch_tokens} (largest micro-batch {self.tokens} tokens), gradient checkpointing "
            f"{'on' if self.gradient_checkpointing else 'off'}: peak {gib(e.peak)} of {gib(usable_bytes(self.device_bytes))} "
            f"usable (states {gib(e.states)}, activations {gib(e.activations)}, half weights {gib(e.half_copies)}, "
            f"LM head {gib(e.head)}, AdamW step {gib(e.optimizer_step)}"
            + (f", CPU heap and temporaries {gib(e.host_transients)}" if e.host_transients else "")
            + ")"
            + (f"; changed: {'; '.join(self.changes)}" if self.changes else "")
        )

    def applied(self, config: Any) -> Any:
        """A learner's or SFT's config with this plan's micro-batch budget and checkpointing."""
        import dataclasses

        return dataclasses.replace(
            config,
            micro_batch_tokens=self.micro_batch_tokens,
            gradient_checkpointing=self.gradient_checkpointing,
        )

    def as_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "model": self.shape.name,
            "params": self.shape.params,
            "device_bytes": self.device_bytes,
            "usable_bytes": usable_bytes(self.device_bytes),
            "precision": self.precision,
            "micro_batch_tokens": self.micro_batch_tokens,
            "gradient_checkpointing": self.gradient_checkpointing,
            "largest_micro_batch_tokens": self.tokens,
            "shards": self.shards,
            "peak_bytes": e.peak,
            "states_bytes": e.states,
            "activation_bytes": e.activations,
            "half_copy_bytes": e.half_copies,
            "head_bytes": e.head,
            "host_transient_bytes": e.host_transients,
            "optimizer_step_bytes": e.optimizer_step,
            "changes": list(self.changes),
        }


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def parameters(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def plan_memory(
    shape: ModelShape,
    device_bytes: int,
    *,
    precision: str,
    micro_batch_tokens: int,
    gradient_checkpointing: bool,
    longest_row: int = 0,
    shards: int = 1,
    head_chunk_rows: int = 1024,
    mode: str = "fit",
    where: str = "rl.learner",
    device: str = "cuda",
) -> MemoryPlan:
    """The plan for one learner worker (see the module docstring). `longest_row`: the longest row a micro-batch
    can hold (a row over the budget is a micro-batch of its own); `where`: the config section named in messages."""
    if mode not in MEMORY_MODES:
        raise ValueError(f"{where}.memory_plan must be one of {MEMORY_MODES}, got {mode!r}")

    def plan(budget: int, checkpointing: bool, changes: tuple[str, ...] = ()) -> MemoryPlan:
        tokens = max(budget, longest_row)
        found = estimate(
            shape,
            precision=precision,
            tokens=tokens,
            gradient_checkpointing=checkpointing,
            shards=shards,
            head_chunk_rows=head_chunk_rows,
            device=device,
        )
        return MemoryPlan(
            shape, device_bytes, precision, budget, checkpointing, tokens, shards, found, changes
        )

    configured = plan(micro_batch_tokens, gradient_checkpointing)
    if mode == "off" or configured.fits:
        return configured
    checkpointed = plan(micro_batch_tokens, True, ("gradient_checkpointing off -> on",))
    lowered = _largest_budget(plan, micro_batch_tokens, longest_row)
    if mode == "fit":
        if not gradient_checkpointing and checkpointed.fits:
            return checkpointed
        if lowered is not None:
            return lowered
    raise MemoryPlanError(_refusal(configured, checkpointed, lowered, mode, where))


def _largest_budget(plan, configured: int, longest_row: int) -> MemoryPlan | None:
    """With gradient checkpointing, the largest budget under the configured one that fits: a multiple of
    BUDGET_STEP, or the longest row when none above it fits; None if even the longest row alone does not."""
    floor = max(longest_row, 1)
    if not plan(floor, True).fits:
        return None
    low, high = -(-floor // BUDGET_STEP), (configured - 1) // BUDGET_STEP  # in steps
    best = floor
    while low <= high:
        middle = (low + high) // 2
        if plan(middle * BUDGET_STEP, True).fits:
            best, low = middle * BUDGET_STEP, middle + 1
        else:
            high = middle - 1
    return plan(best, True, (f"micro_batch_tokens {configured} -> {best}", "gradient_checkpointing on"))


def _refusal(
    configured: MemoryPlan, checkpointed: MemoryPlan, lowered: MemoryPlan | None, mode: str, where: str
) -> str:
    e = configured.estimate
    usable = usable_bytes(configured.device_bytes)
    lines = [
        f"the learner does not fit this device: {configured.summary().removeprefix('memory plan: ')}.",
        f"fp32 master weights + gradients + AdamW's moments are {STATE_BYTES} bytes a parameter: "
        f"{gib(e.states)} ({e.states / 1e9:.0f} GB)"
        + (f" over {configured.shards} shards" if configured.shards > 1 else "")
        + f", before AdamW's step ({gib(e.optimizer_step)} more) or any activation.",
    ]
    would = []
    if mode == "check":
        if checkpointed.fits and not configured.gradient_checkpointing:
            would.append(f"{where}.gradient_checkpointing=true (peak {gib(checkpointed.estimate.peak)})")
        if lowered is not None:
            would.append(
                f"{where}.micro_batch_tokens={lowered.micro_batch_tokens} with gradient checkpointing "
                f"(peak {gib(lowered.estimate.peak)}), or {where}.memory_plan=fit to let the plan choose"
            )
    if not would:
        shards = _shards_that_fit(configured)
        if shards is not None:
            would.append(
                f"FSDP over {shards} GPUs (rl.learner_workers={shards} rl.learner_gpus_per_worker=1 rl.fsdp=true: "
                f"{gib(estimate_for(configured, shards).states)} of states each)"
            )
        fixed = usable - configured.estimate.head
        largest = fixed / (STATE_BYTES + OPTIMIZER_TEMP_BYTES) if fixed > 0 else 0
        would.append(f"a model of at most {parameters(largest)} parameters on this device")
    lines.append("What would fit: " + "; or ".join(would) + ".")
    return " ".join(lines)


def estimate_for(plan: MemoryPlan, shards: int) -> Estimate:
    return estimate(
        plan.shape,
        precision=plan.precision,
        tokens=plan.tokens,
        gradient_checkpointing=True,
        shards=shards,
    )


def _shards_that_fit(plan: MemoryPlan, most: int = 64) -> int | None:
    """The fewest FSDP shards (with gradient checkpointing) with which a worker fits, None beyond `most`."""
    usable = usable_bytes(plan.device_bytes)
    for shards in range(max(2, plan.shards + 1), most + 1):
        if estimate_for(plan, shards).peak <= usable:
            return shards
    return None


def device_memory(device: str) -> int:
    """The memory one learner worker may use on `device`: a CUDA device's total less what other processes hold
    now (the rollout engines, when they share it), or the host's RAM for the CPU."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        free, _ = torch.cuda.mem_get_info(index)
        return int(free + torch.cuda.memory_reserved(index))
    import psutil

    return int(psutil.virtual_memory().total)


def plan_run(
    config: Any, model_dir: str | Path, *, device: str, device_bytes: int | None = None
) -> dict[str, MemoryPlan]:
    """The plans of a training run's learner stages ("sft" when SFT is on, "rl"), for `device` ("cuda" or "cpu")
    with `device_bytes` each learner worker may use (default: `device_memory`, shared among data-parallel workers
    on the CPU). Raises `MemoryPlanError` when a stage cannot fit."""
    from stare_agents.hardware import resolve_precision

    shape = ModelShape.of_dir(model_dir)
    rl, workers = config.rl, max(1, config.rl.learner_workers)
    if device_bytes is None:
        device_bytes = _worker_memory(device, workers, config.rl.learner_gpus_per_worker)
    shards = workers if rl.fsdp else 1
    longest_row = int(config.model.max_model_len)
    stages = {"rl": (rl.learner.micro_batch_tokens, rl.learner.gradient_checkpointing, rl.learner.precision)}
    if config.sft.enabled:  # SFTConfig's gradient checkpointing is off unless the plan turns it on
        stages = {"sft": (config.sft.micro_batch_tokens, False, config.sft.precision), **stages}
    return {
        stage: plan_memory(
            shape,
            device_bytes,
            precision=resolve_precision(precision, device),
            micro_batch_tokens=budget,
            gradient_checkpointing=checkpointing,
            longest_row=longest_row,
            shards=shards,
            head_chunk_rows=rl.learner.head_chunk_rows,
            mode=rl.learner.memory_plan,
            where="sft" if stage == "sft" else "rl.learner",
            device="cpu" if device == "cpu" else "cuda",
        )
        for stage, (budget, checkpointing, precision) in stages.items()
    }


def _worker_memory(device: str, workers: int, gpus_per_worker: float) -> int:
    """What one learner worker may use: its own GPU's total (data-parallel workers on GPUs of their own), the
    device's free memory (one worker), or the host's RAM shared among the workers on the CPU."""
    import torch

    if workers > 1 and gpus_per_worker >= 1 and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    return device_memory(device) // (workers if device == "cpu" else 1)
