"""`HFEngine`: token-in-token-out generation with transformers, the reference for the vLLM engine.

One request at a time on a worker thread, with a KV cache; sampling with a `torch.Generator` seeded per
request, so a rollout is reproducible whatever the interleaving of concurrent episodes. Slower than vLLM,
exact, and dependency-free: used by tests, by resumable runs that must replay bit for bit, and where vLLM
is not installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Mapping
from typing import Any

import torch

from stare_agents.rollout.engine import DTYPES, Generation, SamplingParams, StopCondition, eos_token_ids

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """A transformers causal LM behind the `Engine` protocol.

    Args:
        model: a local Hugging Face model directory.
        dtype: "auto" (float32 on CPU), "float32", "bfloat16" or "float16".
        seed: base seed; request i without an explicit seed uses seed + i.
        max_model_len: the context window (defaults to the config's max_position_embeddings).
        device: torch device (default: CUDA when available, else CPU).
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        device: str | None = None,
        **_: Any,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        torch_dtype = _DTYPES.get(dtype, torch.float32)
        self.model = (
            AutoModelForCausalLM.from_pretrained(str(model), dtype=torch_dtype).to(self.device).eval()
        )
        self.tokenizer = AutoTokenizer.from_pretrained(str(model))
        self.max_model_len = int(max_model_len or self.model.config.max_position_embeddings)
        self.eos_ids = eos_token_ids(self.tokenizer, self.model.generation_config)
        self.weight_version = 0
        self.seed = seed
        self._requests = 0
        self._lock = threading.Lock()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: StopCondition | None = None,
        seed: int | None = None,
    ) -> Generation:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.generate_sync, prompt_ids, params, stop, seed)

    @torch.no_grad()
    def generate_sync(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        stop: StopCondition | None = None,
        seed: int | None = None,
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if len(prompt_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds max_model_len "
                f"{self.max_model_len}"
            )
        with self._lock:
            if seed is None:
                seed = self.seed + self._requests
            self._requests += 1
            generator = torch.Generator(device=self.device).manual_seed(int(seed) % (2**63))
            ids: list[int] = []
            logprobs: list[float] = []
            output = self.model(torch.tensor([prompt_ids], device=self.device), use_cache=True)
            cache, logits = output.past_key_values, output.logits[0, -1].float()
            reason = "length"
            for _ in range(params.max_tokens):
                token, logprob = _sample(logits, params, generator)
                ids.append(token)
                logprobs.append(logprob)
                if token in self.eos_ids and not params.ignore_eos:
                    reason = "eos"
                    break
                if stop is not None and stop(self.tokenizer.decode(ids, skip_special_tokens=True)):
                    reason = "stop"
                    break
                if len(ids) == params.max_tokens:
                    break
                output = self.model(
                    torch.tensor([[token]], device=self.device), past_key_values=cache, use_cache=True
                )
                cache, logits = output.past_key_values, output.logits[0, -1].float()
        return Generation(ids, logprobs, reason)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        with self._lock:
            result = self.model.load_state_dict(dict(state_dict), strict=False)
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = [key for key in result.missing_keys if not (tied and key == "lm_head.weight")]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"update_weights: missing keys {missing}, unexpected keys {result.unexpected_keys}"
            )
        self.weight_version = self.weight_version + 1 if version is None else int(version)
        return self.weight_version

    def weights_digest(self) -> str:
        from stare_agents.rollout.weight_sync import weights_digest

        with self._lock:
            return weights_digest(self.model.state_dict().items())

    def join_sync_group(self, address: Mapping[str, Any], rank: int, timeout_s: float = 600.0) -> None:
        """Join a weight-sync group as `rank` (see `stare_agents.rollout.weight_sync`)."""
        from stare_agents.rollout.weight_sync import SyncReceiver

        if getattr(self, "_receiver", None) is None:
            self._receiver = SyncReceiver()
        self._receiver.join(dict(address), int(rank))

    def receive_weights(self, plan: Mapping[str, Any], timeout_s: float = 600.0) -> int:
        """Receive one sync's weights from the group's sender (the whole state, then one load)."""
        if getattr(self, "_receiver", None) is None:
            raise RuntimeError("this engine has not joined a sync group")
        weights = {name: tensor.clone() for name, tensor in self._receiver.weights(dict(plan))}
        return self.update_weights(weights, int(plan["version"]))

    def leave_sync_group(self, timeout_s: float = 60.0) -> None:
        if getattr(self, "_receiver", None) is not None:
            self._receiver.close()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Sample one token; returns it and its log-probability under the sampling distribution."""
    if params.temperature == 0:
        logp = torch.log_softmax(logits, -1)
        token = int(torch.argmax(logits))
        return token, float(logp[token])
    scaled = logits / params.temperature
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, -1) >= params.top_p  # keep the smallest nucleus
        scaled = scaled.clone()
        scaled[order[drop]] = float("-inf")
    logp = torch.log_softmax(scaled, -1)
    token = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return token, float(logp[token])
