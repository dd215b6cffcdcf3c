"""Data-parallel learner workers: one torch.distributed process group across Ray actors.

    ray.init(num_cpus=2, include_dashboard=False)
    group = LearnerGroup(model_dir, AlgorithmConfig.preset("stare"), LearnerConfig(), DistributedConfig(2))
    metrics = group.step(batch, advantages)      # the same update as one Learner on the whole batch
    rollout_workers.update_weights(group.model_state_dict())
    group.close()

The driver splits the step batch into updates and token-budget micro-batches exactly as a single learner
would (`split_step`) and deals each update's micro-batches out to the workers round-robin. The workers
sum their loss normalisers, entropy and metric sums with all-reduce, gather the surprisal when STARE's
scope is "batch", and sum their gradients before clipping and AdamW, so every replica takes the same
update as one learner on the whole batch (to float summation order). gloo on CPU, NCCL on GPU;
`fsdp=True` shards the model with FSDP2 (`fully_shard`: each decoder layer, then the whole policy) for
models that do not fit one GPU. Tested here: gloo, with and without FSDP (on CPU). Not run: NCCL and FSDP
on GPUs (no GPU on this project's machines).

On a local Ray (`init_local_ray`: node IP 127.0.0.1, every rank on this machine) the ranks meet through a
file in a private folder (nothing listens for the rendezvous), gloo's and NCCL's own sockets are bound to the
loopback interface whatever the hostname resolves to, and the folder is removed when the group closes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from stare_agents.algo import AlgorithmConfig
from stare_agents.models import SHARDS_DIR
from stare_agents.rollout.weight_sync import GroupAddress, WeightsPlan, is_loopback, listening_store
from stare_agents.rollout.worker_env import apply_driver_env, worker_runtime_env
from stare_agents.train.checkpoint import save_checkpoint
from stare_agents.train.learner import Collective, Learner, LearnerConfig, StepResult, TokenRecord
from stare_agents.train.model_export import export_from_workers, rank_model, save_model_shards
from stare_agents.train.policy import (
    HALF_DTYPES,
    MicroBatch,
    PolicyModel,
    load_causal_lm,
    row_lengths,
    slice_batch,
    split_step,
)
from stare_agents.train.rendezvous import (  # noqa: F401 (re-exported: the workers' rendezvous)
    RENDEZVOUS_PREFIX,
    RENDEZVOUS_TIMEOUT,
    join_process_group,
    loopback_interface,
    remove_rendezvous,
    rendezvous_address,
)
from stare_agents.train.seqlen_balancing import verl_micro_batches, verl_worker_rows
from stare_agents.train.sft import SFTConfig, SFTTrainer
from stare_agents.trajectory import Batch, Trajectory

BACKENDS = ("auto", "gloo", "nccl")
GRADIENT_BUCKET_ELEMENTS = 1 << 24  # gradients are summed in flat buckets of at most this many floats


class ProcessGroupCollective(Collective):
    """`Collective` over the default torch.distributed process group."""

    def __init__(self, *, shards_gradients: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group first")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.shards_gradients = shards_gradients
        # FSDP averages the gradients over ranks; the loss is already normalised over the whole step, so
        # each rank's loss is scaled by the world size to make that average the sum
        self.loss_scale = float(self.world_size) if shards_gradients else 1.0
        # NCCL reduces CUDA tensors only; gloo, CPU tensors
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        )

    def _on_device(self, tensor: Tensor) -> Tensor:
        return tensor.to(self.device) if self.device is not None else tensor.cpu()

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        out = self._on_device(tensor.clone())
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(tensor.device)

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        local = self._on_device(tensor.reshape(-1))
        sizes = [torch.zeros(1, dtype=torch.long, device=local.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([local.numel()], device=local.device))
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=local.dtype, device=local.device)
        padded[: local.numel()] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return [part[: int(size)].to(tensor.device) for part, size in zip(parts, sizes, strict=True)]

    def reduce_gradients(self, params: list[nn.Parameter]) -> None:
        bucket: list[nn.Parameter] = []
        size = 0
        for p in [*params, None]:
            if p is not None and size + p.numel() <= GRADIENT_BUCKET_ELEMENTS:
                bucket.append(p)
                size += p.numel()
                continue
            if bucket:
                flat = self._on_device(torch.cat([q.grad.reshape(-1) for q in bucket]))
                dist.all_reduce(flat, op=dist.ReduceOp.SUM)
                offset = 0
                for q in bucket:
                    q.grad.copy_(flat[offset : offset + q.numel()].view_as(q.grad))
                    offset += q.numel()
            bucket, size = ([p], p.numel()) if p is not None else ([], 0)


@dataclass
class DistributedConfig:
    num_workers: int = 2
    backend: str = "auto"  # "auto": NCCL when the workers have GPUs, else gloo
    fsdp: bool = False  # shard the model with FSDP2 (tested on CPU with gloo; NCCL untested)
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0
    threads_per_worker: int = 1  # torch intra-op threads in each worker
    placement: str = "none"  # a Ray placement group for the workers ("PACK" keeps a learner's ranks together)
    # custom Ray resources per worker, e.g. {learner_node: 1} (nodes started with `ray start --resources`)
    resources: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.num_workers < 1 or self.threads_per_worker < 1:
            raise ValueError(
                f"need num_workers >= 1 and threads_per_worker >= 1, got {self.num_workers}, {self.threads_per_worker}"
            )

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.num_gpus_per_worker > 0 else "gloo"


# ---- verl's sequence-length balancing across workers (micro_batch_packing "verl") ---------------------------
def verl_deal(
    plan: list[list[MicroBatch]],
    batch: Batch,
    advantages: Tensor,
    num_workers: int,
    max_tokens: int,
    equal_counts: bool,
) -> list[list[list[MicroBatch]]]:
    """verl's data-parallel split of each update: its rows balanced over the workers (`verl_worker_rows`), then
    each worker's rows into as many micro-batches as the worker that needs most (`verl_micro_batches`; verl
    all-reduces that count). With `equal_counts` (FSDP) a worker short of one gets an all-masked filler."""
    prompt_lens, response_lens = row_lengths(batch)
    parts: list[list[list[MicroBatch]]] = [[] for _ in range(num_workers)]
    for update in plan:
        rows = sorted(row for mb in update for row in mb.rows)
        lengths = {row: prompt_lens[row] + response_lens[row] for row in rows}
        shares = [
            [rows[i] for i in part] for part in verl_worker_rows([lengths[r] for r in rows], num_workers)
        ]
        count = max(-(-sum(lengths[r] for r in share) // max_tokens) for share in shares)
        for k, share in enumerate(shares):
            groups = verl_micro_batches([lengths[r] for r in share], max_tokens, count) if share else []
            mine = [_micro_batch(batch, [share[i] for i in g], advantages) for g in groups]
            if equal_counts:
                mine += [_masked_copy(update[0]) for _ in range(count - len(mine))]
            parts[k].append(mine)
    return parts


def _micro_batch(batch: Batch, rows: list[int], advantages: Tensor) -> MicroBatch:
    sliced = slice_batch(batch, rows)
    adv = advantages[rows]
    if adv.dim() == 2:  # per-token advantages, trimmed to the micro-batch's responses
        adv = adv[:, : sliced.response_length]
    return MicroBatch(sliced, adv, rows)


def deal_micro_batches(
    plan: list[list[MicroBatch]], num_workers: int, *, equal_counts: bool
) -> list[list[list[MicroBatch]]]:
    """Each update's micro-batches dealt round-robin: worker k gets micro-batches k, k + n, ... With
    `equal_counts` (FSDP, whose forward and backward are collective) a worker short of one gets an
    all-masked copy of a micro-batch, which contributes nothing to the update."""
    parts: list[list[list[MicroBatch]]] = [[] for _ in range(num_workers)]
    for update in plan:
        for k in range(num_workers):
            mine = update[k::num_workers]
            if equal_counts:
                longest = -(-len(update) // num_workers)
                mine = mine + [_masked_copy(update[0]) for _ in range(longest - len(mine))]
            parts[k].append(mine)
    return parts


def _masked_copy(mb: MicroBatch) -> MicroBatch:
    batch = Batch(**{**mb.batch.__dict__, "action_mask": torch.zeros_like(mb.batch.action_mask)})
    return MicroBatch(batch, mb.advantages, [], filler=True)


class LearnerWorker:
    """One data-parallel rank: a `Learner` whose `Collective` is the process group (a Ray actor's body)."""

    def __init__(self, rank: int, world_size: int, threads: int) -> None:
        apply_driver_env()  # the driver's NCCL/gloo settings where this node has none, before the group forms
        torch.set_num_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.learner: Learner | None = None
        self._store: Any = None  # rank 0's rendezvous store on a cluster (`address`)

    def address(self) -> str:
        """The process group's rendezvous, made on rank 0's node (see `rendezvous_address`): on a cluster the
        store this rank keeps, listening on the node's address only."""
        import ray

        host = ray.util.get_node_ip_address()
        if is_loopback(host):
            return rendezvous_address(host)
        self._store = listening_store(host, self.world_size, RENDEZVOUS_TIMEOUT)
        return f"tcp://{host}:{self._store.port}"

    def remove_rendezvous(self, address: str) -> None:
        """After every rank has left the group: the rendezvous folder goes (it is on this, rank 0's, node)."""
        remove_rendezvous(address)

    def setup(
        self,
        address: str,
        backend: str,
        model_dir: str,
        algorithm: AlgorithmConfig,
        config: LearnerConfig,
        fsdp: bool,
    ) -> bool:
        """Join the group and build this worker's learner; whether it plans shared prompts."""
        config = dataclasses.replace(config, device=_worker_device())
        model = self._join(address, backend, model_dir, config.device)
        shard = _fully_shard if fsdp else None
        self.learner = Learner(
            model, algorithm, config, collective=ProcessGroupCollective(shards_gradients=fsdp), shard=shard
        )
        return self.learner.plans_shared_prompts

    def _join(self, address: str, backend: str, model_dir: str, device: str) -> nn.Module:
        """Join the process group and load the model, every replica from rank 0's weights."""
        join_process_group(address, backend, self.rank, self.world_size, store=self._store)
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray gives each worker its own GPU as device 0
        return rank_model(model_dir, device, self.rank)  # only rank 0 reads the weights

    def save_model_shards(self, folder: str) -> None:
        """The policy's weights as this worker holds them, without the optimiser: what an export reads."""
        save_model_shards(self.learner.policy if self.learner is not None else self.sft.policy, folder)

    # ---- SFT on the same workers (SFTGroup) ----
    def setup_sft(
        self, address: str, backend: str, model_dir: str, config: SFTConfig, pad_token_id: int, fsdp: bool
    ) -> None:
        config = dataclasses.replace(config, device=_worker_device())
        model = self._join(address, backend, model_dir, config.device)
        self.sft = SFTTrainer(
            model,
            config,
            pad_token_id=pad_token_id,
            collective=ProcessGroupCollective(shards_gradients=fsdp),
            shard=_fully_shard if fsdp else None,
        )

    def sft_fit(
        self, trajectories: list[Trajectory], max_steps: int | None = None
    ) -> tuple[list[dict], list[dict], bool]:
        """`SFTTrainer.fit` on the same trajectories (each worker its share of each step's micro-batches): (the
        epochs it finished, every step's figures, whether the fit is still under way)."""
        steps: list[dict] = []
        history = self.sft.fit(trajectories, on_step=steps.append, max_steps=max_steps)
        return history, steps, self.sft.fitting

    def sft_save_shards(self, folder: str) -> dict | None:
        """Every worker writes its shards; rank 0 returns the rest of the SFT state (schedule, the fit)."""
        self.sft.save_shards(folder)
        return self.sft.small_state_dict() if self.rank == 0 else None

    def sft_load_shards(self, folder: str, small: dict) -> None:
        self.sft.load_shards(folder)
        self.sft.load_small_state_dict(small)

    def sft_model_state_dict(self) -> dict[str, Tensor] | None:
        if self.sft.collective.shards_gradients:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(
                self.sft.policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            state = {key.removeprefix("model."): value for key, value in full.items()}
        else:
            state = self.sft.model.state_dict()
        return state if self.rank == 0 else None

    def step(
        self, plan: list[list[MicroBatch]], record_tokens: bool = False
    ) -> tuple[dict[str, float], dict[int, TokenRecord], bool | None]:
        """The step on this worker's micro-batches: (metrics, this worker's per-token records when asked,
        whether STARE reweighted)."""
        result = self.learner.step_micro_batches(plan, record_tokens=record_tokens)
        return dict(result), result.token_records, result.gate_on

    # the sender's end of a weight-sync group (stare_agents.rollout.weight_sync), for `GroupSender`: rank 0
    # opens, joins and sends; under FSDP every rank takes part in gathering each tensor from the shards
    def sender_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.learner.sender, method)(*args, **kwargs)

    def state_dict(self) -> dict | None:
        state = self.learner.state_dict()
        return state if self.rank == 0 else None

    def save_shards(self, folder: str) -> dict | None:
        """Every worker writes its shards; rank 0 returns the rest of the state (schedule, gate, RNG, ...)."""
        self.learner.save_shards(folder)
        return self.learner.small_state_dict() if self.rank == 0 else None

    def load_shards(self, folder: str, small: dict) -> None:
        self.learner.load_shards(folder)
        self.learner.load_small_state_dict(small)

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def model_state_dict(self) -> dict[str, Tensor] | None:
        state = self.learner.model_state_dict()
        return state if self.rank == 0 else None

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # its listening socket closes with it


def _worker_device() -> str:
    """This worker's device: the GPU Ray gave it, else the CPU (not the driver's: a driver without a GPU can
    run GPU workers, and the other way round)."""
    import ray

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def _start_workers(d: DistributedConfig) -> tuple[list[Any], Any]:
    """The learner's Ray actors, rank by rank, in a placement group when `d.placement` asks for one."""
    import ray

    from stare_agents.rollout.placement import bundle, reserve

    group = reserve(
        [{"CPU": d.num_cpus_per_worker, "GPU": d.num_gpus_per_worker, **d.resources}] * d.num_workers,
        d.placement,
        what="learner workers",
    )
    actor = ray.remote(
        num_cpus=d.num_cpus_per_worker, num_gpus=d.num_gpus_per_worker, resources=d.resources or None
    )(LearnerWorker)
    # the driver's NCCL/gloo settings where the worker's node has none: it has its raylet's environment
    env = worker_runtime_env()
    runtime_env = {"runtime_env": env} if env else {}
    workers = [
        actor.options(scheduling_strategy=bundle(group, rank), **runtime_env).remote(
            rank, d.num_workers, d.threads_per_worker
        )
        for rank in range(d.num_workers)
    ]
    return workers, group


def _close_workers(workers: list[Any], group: Any, address: str) -> None:
    """Every rank leaves the process group, then rank 0 removes the rendezvous; the actors end."""
    import ray

    from stare_agents.rollout.placement import release

    ray.get([w.close.remote() for w in workers])
    if workers:
        ray.get(workers[0].remove_rendezvous.remote(address))
    for w in workers:
        ray.kill(w)
    release(group)


def _fully_shard(policy: PolicyModel) -> None:
    """FSDP2: each decoder layer, then the whole policy (embeddings, final norm, LM head) as the root.

    With the policy's precision bf16 or fp16 (or "fast" where that is bf16), FSDP's mixed precision: the float32
    master weights and optimiser state stay sharded, each layer is all-gathered in the half dtype and computes in
    it, and gradients are reduce-scattered in float32 (summing many workers' half gradients would lose bits)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from stare_agents.hardware import resolve_precision

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    layers = getattr(policy.decoder, "layers", None)
    if layers is None:
        raise ValueError(f"FSDP: {type(policy.decoder).__name__} has no `layers` to shard one by one")
    kwargs: dict = {"mesh": mesh}
    half = HALF_DTYPES.get(resolve_precision(policy.precision, device))
    if half is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(policy, **kwargs)


class _WorkerGroup:
    """What the RL learner group and the SFT group share: data-parallel workers as Ray actors in one process
    group (placed as `DistributedConfig` says), rank 0's model gathered into a Hugging Face model, and closing."""

    workers: list

    def _start(self, distributed: DistributedConfig) -> str:
        """Start the workers; returns the process group's rendezvous address (rank 0's)."""
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                f"{type(self).__name__} runs its workers as Ray actors: call ray.init(...) first "
                "(e.g. ray.init(num_cpus=2, include_dashboard=False))"
            )
        self.workers, self._placement = _start_workers(distributed)
        self._address = ray.get(self.workers[0].address.remote())
        return self._address

    def model_state_dict(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def export_model(self, tokenizer_dir: Path, out: Path) -> Path:
        """The trained policy as the Hugging Face folder `out`, from the workers' own shards of it (no full copy in
        the driver or through Ray: `model_export.export_from_workers`)."""
        return export_from_workers(self.workers, tokenizer_dir, out)

    def hf_model(self, model_dir: Path) -> nn.Module:
        """The trained policy gathered from the workers into a model of `model_dir`'s architecture."""
        model = load_causal_lm(model_dir)
        model.load_state_dict(self.model_state_dict())
        return model

    def close(self) -> None:
        _close_workers(self.workers, self._placement, self._address)
        self.workers, self._placement = [], None


class GroupSender:
    """A data-parallel learner group's `WeightSender`: rank 0's, through Ray (it opens the group on its own node,
    so the driver binds nothing); under FSDP every rank takes part in `send` (each tensor is gathered)."""

    def __init__(self, workers: list[Any], *, fsdp: bool) -> None:
        self.workers, self.fsdp = workers, fsdp

    def _call(self, workers: list[Any], method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get([w.sender_call.remote(method, *args, **kwargs) for w in workers])[0]

    def open(self, world_size: int, *, engines_on_gpu: bool, timeout_s: float = 300.0) -> GroupAddress:
        return self._call(
            self.workers[:1], "open", world_size, engines_on_gpu=engines_on_gpu, timeout_s=timeout_s
        )

    def join(self, address: GroupAddress) -> None:
        self._call(self.workers[:1], "join", address)

    def plan(self, *, version: int, dtype: torch.dtype, bucket_mb: float = 256.0) -> WeightsPlan:
        return self._call(self.workers[:1], "plan", version=version, dtype=dtype, bucket_mb=bucket_mb)

    def send(self, plan: WeightsPlan, port: int) -> None:
        self._call(self.workers if self.fsdp else self.workers[:1], "send", plan, port)

    def leave(self, port: int) -> None:
        self._call(self.workers, "leave", port)


class LearnerGroup(_WorkerGroup):
    """`num_workers` data-parallel learner workers as Ray actors (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        algorithm: AlgorithmConfig,
        config: LearnerConfig | None = None,
        distributed: DistributedConfig | None = None,
    ) -> None:
        import ray

        self.config = config or LearnerConfig()
        d = self.distributed = distributed or DistributedConfig()
        address = self._start(d)
        self.gate_on: bool | None = None  # as `Learner`: whether the last step reweighted the tokens
        if algorithm.reads_all_sampled:
            raise ValueError("rl.stare.gate_input other than 'trained' needs one learner worker")
        shared = ray.get(
            [
                w.setup.remote(address, d.resolved_backend, str(model_dir), algorithm, self.config, d.fsdp)
                for w in self.workers
            ]
        )
        self.plans_shared_prompts = all(shared)  # as a single learner would cut the micro-batches
        self.sender = GroupSender(self.workers, fsdp=d.fsdp)

    def step(
        self,
        batch: Batch | None,
        advantages: Tensor,
        *,
        others: Batch | None = None,
        record_tokens: bool = False,
    ) -> StepResult:
        """One training step on the whole step batch; returns rank 0's LEARNER_METRICS, with every worker's
        token records when `record_tokens`. The untrained trajectories (`others`) are not scored (that would take
        every worker's forward): with any, learner/entropy_all is absent (without, it is the trained batch's), and
        a gate that reads them is refused where the config loads."""
        import ray

        if batch is None:
            return StepResult.untrained(self.gate_on)
        plan = split_step(
            batch,
            advantages,
            mini_batches=self.config.mini_batches,
            micro_batch_tokens=self.config.micro_batch_tokens,
            packing=self.config.micro_batch_packing,
            shared_prompts=self.plans_shared_prompts,
        )
        if (
            self.config.micro_batch_packing == "verl"
        ):  # rows over workers first, then each worker's micro-batches
            parts = verl_deal(
                plan, batch, len(self.workers), self.config.micro_batch_tokens, self.distributed.fsdp
            )
        else:
            parts = deal_micro_batches(plan, len(self.workers), equal_counts=self.distributed.fsdp)
        results = ray.get(
            [w.step.remote(part, record_tokens) for w, part in zip(self.workers, parts, strict=True)]
        )
        records = {row: record for _, rows, _ in results for row, record in rows.items()}
        metrics, _, self.gate_on = results[0]
        if others is not None:
            metrics["learner/entropy_all"] = math.nan
        return StepResult(metrics, records, self.gate_on)

    def state_dict(self) -> dict:
        import ray

        return ray.get([w.state_dict.remote() for w in self.workers])[0]

    def load_state_dict(self, state: dict) -> None:
        import ray

        ray.get([w.load_state_dict.remote(state) for w in self.workers])

    def save_shards(self, folder: str | Path) -> dict:
        """A sharded checkpoint: each worker writes its own shards of the model and optimiser to `folder`
        (torch.distributed.checkpoint; on a cluster, storage every worker reaches), nothing of them passes
        through the driver; returns the small rest of the state (rank 0's) for the trainer's state file."""
        import ray

        return ray.get([w.save_shards.remote(str(folder)) for w in self.workers])[0]

    def load_shards(self, folder: str | Path, small: dict) -> None:
        import ray

        ray.get([w.load_shards.remote(str(folder), small) for w in self.workers])

    def model_state_dict(self) -> dict[str, Tensor]:
        import ray

        return ray.get([w.model_state_dict.remote() for w in self.workers])[0]

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """Each worker writes its own shards (nothing of them passes through the driver); the HF model is
        exported at the end of the run."""
        shards, ranks = self.save_shards, len(self.workers)
        state = state | {"sharded": True}
        save_checkpoint(state, path, shards=shards, tokenizer_dir=tokenizer_dir, ranks=ranks)

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        if state.get("sharded"):  # each worker reads its own shards
            self.load_shards(checkpoint / SHARDS_DIR, state["learner"])
        else:
            self.load_state_dict(state["learner"])


class SFTGroup(_WorkerGroup):
    """SFT on `num_workers` data-parallel learner workers (Ray actors; gloo on CPUs, NCCL on GPUs, FSDP2 with
    `fsdp`): the cold start of a model that does not fit one device, on the same kind of workers as RL. Each
    step's batch is the one a single `SFTTrainer` would take, its micro-batches dealt to the workers and the
    gradients summed, so the update is a single trainer's (tested against one on CPU)."""

    def __init__(
        self,
        model_dir: str | Path,
        config: SFTConfig,
        distributed: DistributedConfig | None = None,
        *,
        pad_token_id: int = 0,
    ) -> None:
        import ray

        d = self.distributed = distributed or DistributedConfig()
        address = self._start(d)
        ray.get(
            [
                w.setup_sft.remote(address, d.resolved_backend, str(model_dir), config, pad_token_id, d.fsdp)
                for w in self.workers
            ]
        )
        self.fitting = False  # a fit stopped by max_steps (or resumed mid-fit) is under way
        self._data: tuple[Sequence[Trajectory], Any] | None = None  # the trajectories and their object ref

    def fit(
        self,
        trajectories: Sequence[Trajectory],
        *,
        on_step: Callable[[dict], None] | None = None,
        max_steps: int | None = None,
    ) -> list[dict[str, float]]:
        """As `SFTTrainer.fit` (rank 0's figures, which cover the whole batch); `on_step` gets each step's
        figures once the call's steps are done."""
        import ray

        if not trajectories:
            raise ValueError("SFT needs at least one trajectory")
        if self._data is None or self._data[0] is not trajectories:  # sent to the object store once
            self._data = (trajectories, ray.put(list(trajectories)))
        results = ray.get([w.sft_fit.remote(self._data[1], max_steps) for w in self.workers])
        history, steps, self.fitting = results[0]
        for record in steps if on_step is not None else ():
            on_step(record)
        return history

    def save_checkpoint(self, state: dict[str, Any], path: Path, *, tokenizer_dir: Path) -> None:
        """Each worker writes its own shards of the model and optimiser; rank 0's SFT state goes beside them."""
        import ray

        def shards(folder: Path) -> dict:
            return ray.get([w.sft_save_shards.remote(str(folder)) for w in self.workers])[0]

        ranks = len(self.workers)
        state = state | {"sharded": True}
        save_checkpoint(state, path, shards=shards, tokenizer_dir=tokenizer_dir, ranks=ranks)

    def resume(self, checkpoint: Path, state: dict[str, Any]) -> None:
        import ray

        folder, small = str(checkpoint / SHARDS_DIR), state["learner"]
        ray.get([w.sft_load_shards.remote(folder, small) for w in self.workers])
        self.fitting = small.get("fit") is not None

    def model_state_dict(self) -> dict[str, Tensor]:
        import ray

        return ray.get([w.sft_model_state_dict.remote() for w in self.workers])[0]
