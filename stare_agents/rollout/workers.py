"""Rollout workers: each hosts one engine, one sandbox and the environments of its episodes.

    group = RolloutWorkerGroup(WorkerSpec(model=model_dir, engine="vllm", dtype="bfloat16"), num_workers=1)
    trajectories = group.collect(tasks, RolloutConfig(...))      # same order as tasks
    group.update_weights(learner.state_dict())                   # every worker, one batched call
    group.close()

With Ray (the default) every worker is an actor: one per GPU on a cluster (`ray_address=`, RAY_ADDRESS or a
`ray start` cluster on this node: see `local_ray.init_ray`), one on a small CPU machine. Tasks are split into one contiguous shard per worker. A worker
that dies (its process is killed, the machine goes away) is replaced and its shard re-run, up to
`max_restarts` times per call. A worker whose engine died (its episodes end as `engine_error` at once) is
replaced after its shard returns, so the next call has a working engine; a worker that does not return
within `RolloutConfig.timeout_s` (plus a grace period) is killed and replaced, and its shard's episodes end
as `engine_error`. `use_ray=False` runs one worker in this process (same code path, no Ray).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from stare_agents.rollout.agent_loop import RolloutConfig, RolloutTask, collect, make_env
from stare_agents.rollout.engine import Dtype, make_engine
from stare_agents.rollout.weight_sync import WIRE_DTYPES, WeightSender
from stare_agents.trajectory import Trajectory

logger = logging.getLogger("stare_agents.rollout")


DEFAULT_DTYPE: Dtype = "fast"  # the engine's dtype: bfloat16 where it is fast, else float32
DEFAULT_MAX_MODEL_LEN = 2048


@dataclass
class WorkerSpec:
    """What each rollout worker builds.

    model: local HF directory. engine: "vllm" or "hf". dtype: "auto" | "float32" | "bfloat16" | "fast" | "float16"
    (DEFAULT_DTYPE, as a run's model.rollout_dtype). max_model_len: context window (DEFAULT_MAX_MODEL_LEN, as a
    run's model.max_model_len). kv_cache_gib: vLLM on CPU. sandbox: "docker" | "local" | "none";
    sandbox_pool_size: warm interpreters (episodes holding a stateful session at once; others wait);
    sandbox_kwargs: e.g. {"runtime": "runsc"}. num_cpus / num_gpus: Ray resources per worker.
    imports: modules to import in the worker first (to register your own environments).
    multiprocess: vLLM's engine core in a process of its own (None: VLLMEngine's default).
    env_processes: 0: the environments run on threads of the worker's process; N: in N environment processes
        of their own, each with its share of the sandbox's interpreters (see env_pool.py).
    env_cpus: CPUs kept for the environment processes and their sandbox containers; the worker's own process
        (the engine) is pinned to the other CPUs it may use, with as many compute threads. [] : no pinning.
    fp32_head: vLLM only: the LM head and sampling log-probs in fp32 whatever `dtype` is (see VLLMEngine).
    """

    model: str
    engine: str = "vllm"
    dtype: Dtype = DEFAULT_DTYPE
    seed: int = 0
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    kv_cache_gib: float = 2.0
    sandbox: str = "docker"
    sandbox_pool_size: int = 8
    sandbox_kwargs: dict[str, Any] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    imports: list[str] = field(default_factory=list)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    multiprocess: bool | None = None  # vLLM's engine core in its own process (see VLLMEngine)
    env_processes: int = 0  # environments in N processes of their own (0: threads of the worker's process)
    env_cpus: list[int] = field(default_factory=list)  # CPUs for them and their sandbox (engine: the rest)
    placement: str = "none"  # a Ray placement group for the workers: "PACK", "SPREAD", ... (see placement.py)
    # custom Ray resources per worker, e.g. {rollout_node: 1} (nodes started with `ray start --resources`)
    resources: dict[str, float] = field(default_factory=dict)
    fp32_head: bool = False


def pin_engine(env_cpus: Sequence[int], env_processes: int) -> list[int]:
    """Pin this process (its engine) to the CPUs it may use minus `env_cpus`, with one compute thread per CPU.
    Returns the engine's CPUs. A clear ValueError when the split leaves either side without a CPU."""
    from stare_agents.rollout.env_pool import pin_process

    if env_processes < 1:
        raise ValueError(
            "env_cpus needs env_processes >= 1: environments on threads of the engine's process run on its CPUs"
        )
    available = os.sched_getaffinity(0)
    missing = sorted(set(env_cpus) - available)
    if missing:
        raise ValueError(
            f"env_cpus {sorted(set(env_cpus))}: CPUs {missing} are not among this process's {sorted(available)}"
        )
    engine = sorted(available - set(env_cpus))
    if not engine:
        raise ValueError(f"env_cpus {sorted(set(env_cpus))} leave the engine no CPU of {sorted(available)}")
    pin_process(engine)
    torch.set_num_threads(len(engine))
    return engine


def ray_node_address() -> str | None:
    """The address of the Ray node this process runs on; None when Ray is not started here."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.util.get_node_ip_address()


def _engine_and_sandbox(spec: WorkerSpec, engine_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The worker's engine and its started sandbox, the sandbox started on a thread while the engine loads: the
    sandbox's interpreters (Docker's containers, gVisor's sandboxes, local processes) mostly wait on their own
    processes and the Docker daemon, the engine on imports and weights. Whichever fails, the other is closed and
    the error raised. An engine that starts processes of its own (`multiprocess`: vLLM forks its core) starts
    first, alone: a fork copies only the forking thread, and a lock the starting thread holds would stay held in
    the child."""
    from stare_agents.rollout.env_pool import start_sandbox
    from stare_agents.rollout.vllm_engine import resolve_multiprocess

    if spec.engine == "vllm" and resolve_multiprocess(spec.multiprocess):
        engine = make_engine(spec.engine, spec.model, **engine_kwargs)
        try:
            return engine, start_sandbox(spec.sandbox, spec.sandbox_pool_size, spec.sandbox_kwargs)
        except BaseException:
            engine.close()
            raise
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sandbox-start") as starter:
        starting = starter.submit(start_sandbox, spec.sandbox, spec.sandbox_pool_size, spec.sandbox_kwargs)
        try:
            engine = make_engine(spec.engine, spec.model, **engine_kwargs)
        except BaseException:
            with contextlib.suppress(BaseException):
                starting.result().close()
            raise
        try:
            sandbox = starting.result()
        except BaseException:
            engine.close()
            raise
    return engine, sandbox


class RolloutWorker:
    """One engine + one sandbox. Used directly (`use_ray=False`) or as a Ray actor."""

    def __init__(self, spec: WorkerSpec, index: int = 0) -> None:
        from stare_agents.rollout.worker_env import apply_driver_env

        apply_driver_env()  # the driver's NCCL/gloo settings where this node has none, before the engine starts
        for module in spec.imports:
            importlib.import_module(module)
        self.spec = spec
        self.index = index
        self.node_address = ray_node_address()
        # the engine's processes (a vLLM core too) bind their weight-sync sockets on this node's address
        if self.node_address is not None:
            from stare_agents.rollout.weight_sync import NODE_ADDRESS_ENV

            os.environ[NODE_ADDRESS_ENV] = self.node_address
        self.engine_cpus: list[int] = []
        if spec.env_cpus:  # before the engine starts, so its compute threads are born on the engine's CPUs
            self.engine_cpus = pin_engine(spec.env_cpus, spec.env_processes)
        kwargs = dict(dtype=spec.dtype, seed=spec.seed + index, max_model_len=spec.max_model_len)
        if spec.engine == "vllm":
            kwargs.update(
                kv_cache_gib=spec.kv_cache_gib,
                engine_kwargs=spec.engine_kwargs,
                multiprocess=spec.multiprocess,
                fp32_head=spec.fp32_head,
            )
        elif spec.fp32_head:
            raise ValueError(
                f"fp32_head needs the vllm engine (the {spec.engine} engine computes its head in its dtype)"
            )
        self.env_pool = None
        self.sandbox = None
        self.env_factory: Callable[[RolloutTask, Any], Any] = make_env
        if spec.env_processes > 0:  # each environment process starts its own share of the interpreters
            from stare_agents.rollout.env_pool import EnvProcessPool

            self.engine = make_engine(spec.engine, spec.model, **kwargs)
            try:
                self.env_pool = EnvProcessPool(
                    spec.env_processes,
                    sandbox=spec.sandbox,
                    sandbox_pool_size=spec.sandbox_pool_size,
                    sandbox_kwargs=spec.sandbox_kwargs,
                    imports=spec.imports,
                    cpus=spec.env_cpus,
                )
            except BaseException:
                self.engine.close()
                raise
            self.env_factory = self.env_pool.make
        else:
            self.engine, self.sandbox = _engine_and_sandbox(spec, kwargs)
        self._done = 0
        self._lock = threading.Lock()

    def ping(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": os.getpid(),
            "node": self.node_address,
            "weight_version": self.engine.weight_version,
            "sandbox": type(self.sandbox).__name__ if self.sandbox is not None else None,
            "env_processes": self.env_pool.pids if self.env_pool is not None else [],
            "engine_cpus": self.engine_cpus,
            "env_cpus": list(self.spec.env_cpus),
            # DockerLimits.low_priority: whether the weight was set (None: not asked, or not known here)
            "sandbox_low_priority": getattr(self.sandbox, "low_priority_set", None),
        }

    def weights(self) -> dict[str, Any]:
        """The weights this worker's engine samples with now: {"weight_version", "weights_digest"}."""
        return {"weight_version": self.engine.weight_version, "weights_digest": self.engine.weights_digest()}

    def healthy(self) -> bool:
        """False once the engine died (see `VLLMEngine.alive`): the worker must be replaced."""
        return bool(getattr(self.engine, "alive", True))

    def progress(self) -> int:
        """Episodes finished in the current `collect` call (polled by the driver for its progress bar)."""
        return self._done

    def collect(self, tasks: Sequence[RolloutTask], config: RolloutConfig) -> list[Trajectory]:
        with self._lock:
            self._done = 0

            def finished(index: int, trajectory: Trajectory) -> None:
                self._done += 1

            return self.run(tasks, config, on_done=finished)

    def run(
        self,
        tasks: Sequence[RolloutTask],
        config: RolloutConfig,
        on_done: Callable[[int, Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """The agent loop on this worker's engine and environments (in its environment processes, if any)."""
        return collect(
            self.engine, tasks, config, sandbox=self.sandbox, on_done=on_done, env_factory=self.env_factory
        )

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | PackedWeights, version: int
    ) -> tuple[int, float]:
        started = time.perf_counter()
        state_dict = weights.unpack() if isinstance(weights, PackedWeights) else weights
        version = self.engine.update_weights(state_dict, version)
        return version, time.perf_counter() - started

    def join_sync_group(self, address: dict[str, Any], first_rank: int) -> str:
        """Join the learner's weight-sync group from rank `first_rank` on, one rank per process the engine
        receives in (see `stare_agents.rollout.weight_sync.sync_ranks`). Returns where this worker's gloo
        sockets bind (the interface GLOO_SOCKET_IFNAME names, or the address), for the driver's log."""
        from stare_agents.rollout.weight_sync import GroupAddress, bind_host

        self.engine.join_sync_group(address, first_rank, timeout_s=float(address.get("timeout_s", 600.0)))
        group = GroupAddress(**address)
        if group.backend != "gloo":
            return f"{group.backend} (its own interface choice)"
        interface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
        return f"interface {interface}" if interface else bind_host(group, first_rank)

    def receive_weights(self, plan: dict[str, Any]) -> tuple[int, float]:
        started = time.perf_counter()
        version = self.engine.receive_weights(plan)
        return version, time.perf_counter() - started

    def leave_sync_group(self) -> None:
        self.engine.leave_sync_group()

    def close(self) -> None:
        if self.env_pool is not None:
            self.env_pool.close()
            self.env_pool = None
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        self.engine.close()


@dataclass(frozen=True)
class PackedWeights:
    """A state dict as one flat array (Ray hands large numpy arrays to actors without copying them) plus
    the names, shapes and dtype to cut it back into tensors. bfloat16 travels as int16 bits."""

    flat: Any  # numpy array
    names: list[str]
    shapes: list[tuple[int, ...]]
    dtype: str  # "float32" | "bfloat16" | "float16"

    @classmethod
    def pack(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        buffer: torch.Tensor | None = None,
    ) -> PackedWeights:
        """One pass over the weights: each tensor is cast while it is copied into its slice of `flat`.
        Pass the previous result's `buffer` to skip allocating (and page-faulting) a new one every sync."""
        names = list(state_dict)
        total = sum(state_dict[name].numel() for name in names)
        if buffer is None or buffer.numel() != total or buffer.dtype != dtype:
            buffer = torch.empty(total, dtype=dtype)
        offset = 0
        for name in names:
            tensor = state_dict[name].detach()
            buffer[offset : offset + tensor.numel()].copy_(tensor.reshape(-1))
            offset += tensor.numel()
        bits = buffer.view(torch.int16) if dtype == torch.bfloat16 else buffer
        shapes = [tuple(state_dict[name].shape) for name in names]
        return cls(bits.numpy(), names, shapes, str(dtype).removeprefix("torch."))

    @property
    def buffer(self) -> torch.Tensor:
        """The flat tensor behind `flat` (reusable by the next `pack`)."""
        flat = torch.from_numpy(self.flat)
        return flat.view(torch.bfloat16) if self.dtype == "bfloat16" else flat

    def unpack(self) -> dict[str, torch.Tensor]:
        import warnings

        with warnings.catch_warnings():  # Ray's zero-copy arrays are read-only; the tensors are only read
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(self.flat)
        if self.dtype == "bfloat16":
            flat = flat.view(torch.bfloat16)
        out, offset = {}, 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            count = math.prod(shape)
            out[name] = flat[offset : offset + count].view(shape)
            offset += count
        return out


def receiving_processes(spec: WorkerSpec) -> int:
    """How many processes of one worker's engine receive a weight sync, each a rank of the group: every
    tensor- and pipeline-parallel worker of a vLLM engine, the one process of the HF engine."""
    if spec.engine != "vllm":
        return 1
    from stare_agents.rollout.vllm_engine import engine_gpus

    return engine_gpus(spec.engine_kwargs)


def _timed_out(task: RolloutTask, weight_version: int) -> Trajectory:
    return Trajectory(
        prompt_ids=[],
        response_ids=[],
        action_mask=[],
        rollout_logprobs=[],
        stop_reason="engine_error",
        weight_version=weight_version,
        env_id=task.env_id,
        group_id=task.group_id,
        sample_index=task.sample_index,
        error="TimeoutError: the rollout worker did not return within the collect timeout; it was replaced",
    )


def _shards(tasks: Sequence[RolloutTask], count: int) -> list[list[int]]:
    """Contiguous index ranges, one per worker, as even as possible (groups stay together when the group
    size divides the shard size)."""
    size, extra = divmod(len(tasks), count)
    shards, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        shards.append(list(range(start, end)))
        start = end
    return shards


def _untied(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop `lm_head.weight` when it shares storage with the input embedding (the engine re-ties it)."""
    out = dict(state_dict)
    head, embed = out.get("lm_head.weight"), out.get("model.embed_tokens.weight")
    if head is not None and embed is not None and head.data_ptr() == embed.data_ptr():
        del out["lm_head.weight"]
    return out


class RolloutWorkerGroup:
    """Several `RolloutWorker`s behind one `collect` / `update_weights` (see the module docstring)."""

    def __init__(
        self,
        spec: WorkerSpec,
        num_workers: int = 1,
        *,
        use_ray: bool = True,
        ray_address: str | None = None,
        max_restarts: int = 2,
        start_timeout_s: float = 600.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.spec = spec
        self.num_workers = num_workers
        self.use_ray = use_ray
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.weight_version = 0
        self.restarts = 0
        self.hang_grace_s = 300.0  # past RolloutConfig.timeout_s, a worker that has not answered is replaced
        self.last_sync_s: float | None = None
        self._weights_ref: Any = None
        self._pack_buffer: torch.Tensor | None = None
        # the learner's sender, once update_weights_from was used (a replaced worker catches up)
        self._sender: WeightSender | None = None
        self._sync_group: Any = None  # the GroupAddress of the current sync group
        self._sync_members: list[int] = []
        self.sync_bindings: list[str] = []  # where each member of the last sync group bound its sockets
        if not use_ray:
            if num_workers != 1:
                raise ValueError("use_ray=False runs exactly one worker in this process")
            self._local: RolloutWorker | None = RolloutWorker(spec)
            self._local_weights: tuple[dict[str, torch.Tensor], int] | None = None  # for a replacement
            self._actors: list[Any] = []
            return
        import ray

        from stare_agents.rollout.local_ray import init_ray

        init_ray(ray_address)  # a cluster to attach to, else a private local instance on 127.0.0.1
        self._local = None
        self._actor_class = ray.remote(RolloutWorker)
        from stare_agents.rollout.placement import reserve

        self._placement = reserve(
            [{"CPU": spec.num_cpus, "GPU": spec.num_gpus, **spec.resources}] * num_workers,
            spec.placement,
            what="rollout workers",
            timeout_s=start_timeout_s,
        )
        self._actors = [self._start(i) for i in range(num_workers)]
        ray.get([actor.ping.remote() for actor in self._actors], timeout=start_timeout_s)

    def _start(self, index: int) -> Any:
        from stare_agents.rollout.worker_env import worker_runtime_env

        env_vars = {
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
        }
        if self.spec.num_gpus == 0:
            env_vars["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(self.spec.kv_cache_gib)))
            env_vars["OMP_NUM_THREADS"] = str(max(1, int(self.spec.num_cpus)))
            # idle OpenMP threads sleep instead of spinning: an idle engine otherwise burns a core that the
            # learner (or SFT) beside it needs (measured: 5.0 s of CPU in 5 s idle, 0.1 s with PASSIVE, for
            # 8% less generation speed)
            env_vars["OMP_WAIT_POLICY"] = "PASSIVE"
        from stare_agents.rollout.placement import bundle

        actor = self._actor_class.options(
            num_cpus=self.spec.num_cpus,
            num_gpus=self.spec.num_gpus,
            resources=self.spec.resources or None,
            max_concurrency=4,  # progress() and ping() answer while collect() runs
            # and the driver's NCCL/gloo settings where the node has none (the weight-sync group's sockets)
            runtime_env=worker_runtime_env(env_vars),
            scheduling_strategy=bundle(
                getattr(self, "_placement", None), index
            ),  # a replacement: the same bundle
        ).remote(self.spec, index)
        return actor

    def collect(
        self, tasks: Sequence[RolloutTask], config: RolloutConfig, *, progress: bool = False
    ) -> list[Trajectory]:
        """Run `tasks` on the workers; trajectories come back in the order of `tasks`."""
        tasks = list(tasks)
        if not tasks:
            return []
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(tasks), desc="rollout", unit="ep", leave=False)
        try:
            if self._local is not None:

                def tick(index: int, trajectory: Trajectory) -> None:
                    if bar is not None:
                        bar.update(1)

                trajectories = self._local.run(tasks, config, on_done=tick)
                if not self._local.healthy():
                    logger.warning("the rollout worker's engine died; replacing the worker")
                    self.restarts += 1
                    with contextlib.suppress(Exception):
                        self._local.close()
                    self._local = RolloutWorker(self.spec)
                    if self._sender is not None:
                        self._catch_up(self._local)
                    elif self._local_weights is not None:
                        self._local.update_weights(*self._local_weights)
                return trajectories
            return self._collect_ray(tasks, config, bar)
        finally:
            if bar is not None:
                bar.close()

    def _collect_ray(self, tasks: list[RolloutTask], config: RolloutConfig, bar: Any) -> list[Trajectory]:
        import ray
        from ray.exceptions import RayActorError

        shards = [s for s in _shards(tasks, len(self._actors)) if s]
        results: list[Trajectory | None] = [None] * len(tasks)
        attempts = [0] * len(shards)
        pending = {
            self._actors[i].collect.remote([tasks[j] for j in shard], config): i
            for i, shard in enumerate(shards)
        }
        # the worker ends its own episodes at config.timeout_s; one that has not answered well after that hangs
        deadline = (
            None if config.timeout_s is None else time.monotonic() + config.timeout_s + self.hang_grace_s
        )
        while pending:
            if deadline is not None and time.monotonic() > deadline:
                for ref, i in list(pending.items()):
                    logger.error("rollout worker %d did not return in time; replacing it", i)
                    for j in shards[i]:
                        results[j] = _timed_out(tasks[j], self.weight_version)
                    self._replace(i)
                    del pending[ref]
                break
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            if bar is not None:
                done = sum(len(shards[i]) for i in range(len(shards)) if results[shards[i][0]] is not None)
                live = 0
                for ref, i in pending.items():
                    if ref not in ready:
                        with contextlib.suppress(Exception):
                            live += ray.get(self._actors[i].progress.remote(), timeout=5)
                bar.n = done + live
                bar.refresh()
            for ref in ready:
                i = pending.pop(ref)
                try:
                    trajectories = ray.get(ref)
                except RayActorError as error:
                    attempts[i] += 1
                    if attempts[i] > self.max_restarts:
                        raise RuntimeError(
                            f"rollout worker {i} died {attempts[i]} times in one collect; giving up"
                        ) from error
                    logger.warning(
                        "rollout worker %d died (%s); restarting it and re-running its shard", i, error
                    )
                    self._replace(i)
                    pending[self._actors[i].collect.remote([tasks[j] for j in shards[i]], config)] = i
                    continue
                for j, trajectory in zip(shards[i], trajectories, strict=True):
                    results[j] = trajectory
                if any(t.stop_reason == "engine_error" for t in trajectories):
                    healthy = False
                    with contextlib.suppress(Exception):
                        healthy = ray.get(self._actors[i].healthy.remote(), timeout=60)
                    if not healthy:
                        logger.warning("rollout worker %d's engine died; replacing the worker", i)
                        self._replace(i)
        return [t for t in results if t is not None]

    def _replace(self, i: int) -> None:
        """Kill worker i and start a new one with the current weights."""
        import ray

        self.restarts += 1
        with contextlib.suppress(Exception):
            ray.kill(self._actors[i])
        self._actors[i] = self._start(i)
        ray.get(self._actors[i].ping.remote(), timeout=self.start_timeout_s)
        if self._sender is not None:  # the new worker loaded the model files: catch up from the learner
            self._catch_up(self._actors[i])
        elif self._weights_ref is not None:
            ray.get(self._actors[i].update_weights.remote(self._weights_ref, self.weight_version))

    def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        version: int | None = None,
        dtype: torch.dtype | None = None,
        timeout_s: float = 300.0,
    ) -> int:
        """Push weights to every worker in one batched call; returns the new weight version.

        `dtype`: what travels (default: the workers' dtype; "auto" sends float32). The weights travel as one
        flat array (`PackedWeights`), which Ray hands to the actors without copying; tied weights (an
        `lm_head.weight` that is the embedding) are sent once. `version`: the version to set (a resumed run
        restores its checkpoint's); default: the current one + 1."""
        started = time.perf_counter()
        version = self.weight_version + 1 if version is None else int(version)
        if dtype is None:  # the engines' own dtype (float32 for "auto")
            dtype = WIRE_DTYPES.get(self.spec.dtype, torch.float32)
        state_dict = _untied(state_dict)
        if self._local is not None:
            weights = {k: v.detach().to(dtype) for k, v in state_dict.items()}
            self._local.update_weights(weights, version)
            self._local_weights = (weights, version)
        else:
            import ray

            packed = PackedWeights.pack(state_dict, dtype, self._pack_buffer)
            self._pack_buffer = packed.buffer  # ray.put copies it; the next sync refills the same memory
            ref = ray.put(packed)
            ray.get([actor.update_weights.remote(ref, version) for actor in self._actors], timeout=timeout_s)
            self._weights_ref = ref  # kept so that a replaced worker can catch up
        self.weight_version = version
        self.last_sync_s = time.perf_counter() - started
        return version

    # ---- weights straight from the learner over a collective (stare_agents.rollout.weight_sync) ----
    def update_weights_from(
        self,
        sender: WeightSender,
        *,
        version: int | None = None,
        dtype: torch.dtype | None = None,
        bucket_mb: float = 256.0,
        timeout_s: float = 300.0,
    ) -> int:
        """Push the learner's weights to every worker over the sync group (formed on first use, and again
        when a worker was replaced); returns the new weight version. `sender` is the learner's end of the
        group (`learner.sender`: a `Learner`'s or a `LearnerGroup`'s). A worker replaced while this mode is on
        catches up from the sender at once (a group of two), before it re-runs any episode."""
        started = time.perf_counter()
        version = self.weight_version + 1 if version is None else int(version)
        if dtype is None:  # the engines' own dtype (float32 for "auto")
            dtype = WIRE_DTYPES.get(self.spec.dtype, torch.float32)
        self._sender, self._sync_dtype, self._sync_bucket_mb = sender, dtype, bucket_mb
        self._sync_timeout_s = timeout_s
        members = list(self._members())
        try:
            if self._sync_group is None or self._sync_members != [id(m) for m in members]:
                self._leave_group()
                self._sync_group = self._form_group(members)
                self._sync_members = [id(m) for m in members]
            self._send(self._sync_group, members, version)
        except BaseException:
            self._leave_group()  # a failed collective leaves the group unusable: the next sync forms a new one
            raise
        self.weight_version = version
        self.last_sync_s = time.perf_counter() - started
        return version

    def _members(self) -> list[Any]:
        return [self._local] if self._local is not None else list(self._actors)

    def _call(self, member: Any, method: str, *args: Any) -> Callable[[float], Any]:
        """Start `member.method(*args)` without waiting (a Ray actor call, or a thread for the local worker);
        returns a function that waits for its result."""
        if self._local is not None and member is self._local:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-sync")
            future = pool.submit(getattr(member, method), *args)
            pool.shutdown(wait=False)
            return lambda timeout: future.result(timeout=timeout)
        import ray

        ref = getattr(member, method).remote(*args)
        return lambda timeout: ray.get(ref, timeout=timeout)

    def _form_group(self, members: list[Any]) -> Any:
        from stare_agents.rollout.weight_sync import sync_ranks

        world_size, firsts = sync_ranks([receiving_processes(self.spec)] * len(members))
        # the sender opens the group on its own node and binds its port there: this process may be elsewhere
        address = self._sender.open(
            world_size, engines_on_gpu=self.spec.num_gpus > 0, timeout_s=self._sync_timeout_s
        )
        joins = [
            self._call(m, "join_sync_group", asdict(address), first)
            for m, first in zip(members, firsts, strict=True)
        ]
        self._sender.join(address)  # returns once every member joined
        self.sync_bindings = [wait(self._sync_timeout_s) for wait in joins]
        logger.info(
            "weight sync: a %s group of %d opened by the learner on %s (port %d); the engines bind %s",
            address.backend,
            address.world_size,
            address.host,
            address.port,
            ", ".join(map(str, self.sync_bindings)),
        )
        return address

    def _send(self, address: Any, members: list[Any], version: int) -> None:
        plan = self._sender.plan(version=version, dtype=self._sync_dtype, bucket_mb=self._sync_bucket_mb)
        receives = [self._call(m, "receive_weights", plan.to_dict()) for m in members]
        self._sender.send(plan, address.port)
        for wait in receives:
            got, _ = wait(self._sync_timeout_s)
            if got != version:
                raise RuntimeError(f"a rollout worker reports weight version {got} after a sync to {version}")

    def _leave_group(self) -> None:
        if self._sync_group is not None:
            with contextlib.suppress(Exception):
                self._sender.leave(self._sync_group.port)
            for member in self._members():
                with contextlib.suppress(Exception):
                    self._call(member, "leave_sync_group")(60)
        self._sync_group, self._sync_members = None, []

    def _catch_up(self, member: Any) -> None:
        """A replaced worker gets the current weights from the sender in a group of two."""
        address = self._form_group([member])
        try:
            self._send(address, [member], self.weight_version)
        finally:
            with contextlib.suppress(Exception):
                self._sender.leave(address.port)
            with contextlib.suppress(Exception):
                self._call(member, "leave_sync_group")(60)

    def weights(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """The weights every engine samples with now (what an evaluation on them scores): {"weight_version",
        "weights_digest"} (`engine.weights_digest`). Engines that hold different weights, or a version other
        than the group's, are an error that names what each holds."""
        if self._local is not None:
            held = [self._local.weights()]
        else:
            import ray

            held = ray.get([actor.weights.remote() for actor in self._actors], timeout=timeout_s)
        if any(h != held[0] for h in held) or held[0]["weight_version"] != self.weight_version:
            raise RuntimeError(
                f"the rollout workers do not hold the weights of version {self.weight_version} alike: {held}; an "
                "evaluation on them would score a mix"
            )
        return held[0]

    def ping(self) -> list[dict[str, Any]]:
        if self._local is not None:
            return [self._local.ping()]
        import ray

        return ray.get([actor.ping.remote() for actor in self._actors], timeout=60)

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._actors:
            import ray

            for actor in self._actors:
                with contextlib.suppress(Exception):
                    ray.get(actor.close.remote(), timeout=60)
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            self._actors = []
            from stare_agents.rollout.placement import release

            with contextlib.suppress(Exception):
                release(getattr(self, "_placement", None))
            self._placement = None

    def __enter__(self) -> RolloutWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "use_ray": self.use_ray, **asdict(self.spec)}
