"""SFT data: tool-interleaved traces as `Trajectory` objects, laid out exactly as rollouts are.

Two sources:

* `solver_traces`: an environment's solver (its `solution_code(task)` method, a `ToolEnv` override: ArithmeticTIR
  has one, and so can your environment) writes the code, the real sandbox runs it through the real
  environment, and the trace answers with the tool's output; only traces the environment scores correct
  are kept.
* `conversation_traces`: a JSONL file, one `{"messages": [{"role", "content"}, ...]}` per line; assistant
  messages are what the model learns (action tokens), everything else is prompt or observation.

Both render with the rollout layer's renderers, so an SFT trace and an RL trajectory of the same episode have
the same tokens and the same mask.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stare_agents.envs.parsing import format_inline
from stare_agents.envs.registration import has_solver
from stare_agents.rollout import RolloutTask, make_env, make_renderer
from stare_agents.trajectory import Trajectory, TurnRecord


def end_of_turn(renderer: Any, tokenizer: Any) -> int:
    """The id an assistant turn ends with, as the rollout would sample it: the chat template's end-of-turn
    token (<|im_end|> for Qwen2.5-Instruct, whose eos list also holds <|endoftext|>), else the tokenizer's eos."""
    if renderer.end_of_turn_id is not None:
        return int(renderer.end_of_turn_id)
    if tokenizer.eos_token_id is None:
        raise ValueError(
            "the tokenizer has neither a chat template with an end-of-turn token nor an eos token"
        )
    return int(tokenizer.eos_token_id)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def solver_traces(
    env_id: str,
    seeds: Sequence[int],
    tokenizer: Any,
    eos_ids: set[int],
    *,
    env_kwargs: dict[str, Any] | None = None,
    sandbox: Any = None,
    rendering: str = "auto",
    threads: int = 4,
) -> list[Trajectory]:
    """One verified two-turn trace per seed: ```python <solution>```, the tool's output, then
    `\\boxed{<output>}`. Seeds whose trace the environment does not score correct are skipped. Episodes run
    on `threads` threads (their sandbox calls overlap); the result keeps the order of `seeds`."""
    if not has_solver(env_id):
        raise ValueError(
            f"{env_id!r} has no solver (ToolEnv.solution_code is not overridden); write one on the environment "
            "class, or use sft.data=<file.jsonl>"
        )

    def trace(seed: int) -> Trajectory | None:
        return _solver_trace(env_id, int(seed), tokenizer, eos_ids, env_kwargs or {}, sandbox, rendering)

    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        return [t for t in pool.map(trace, seeds) if t is not None]


def seeds_per_kind(
    env_id: str,
    start: int,
    per_kind: int,
    *,
    env_kwargs: dict[str, Any] | None = None,
    sandbox: Any = None,
    max_seeds: int = 20_000,
) -> list[int]:
    """Seeds from `start` on whose tasks cover every task kind the environment draws `per_kind` times (the kind is
    the task's `data["kind"]`), in seed order: a cold start that shows each kind, where `num_examples` seeds drawn
    at random may leave a kind out. The search stops once every kind met is full and 50 seeds per kind met have
    gone by without a new one, or after `max_seeds` seeds; a kind still short then, or tasks without a kind, are a
    ValueError naming them."""
    if isinstance(per_kind, bool) or not isinstance(per_kind, int) or per_kind < 1:
        raise ValueError(f"per_kind must be an integer >= 1, got {per_kind!r}")
    env = make_env(RolloutTask(env_id, env_kwargs=dict(env_kwargs or {})), sandbox)
    chosen: dict[str, list[int]] = {}
    try:
        for seed in range(start, start + max_seeds):
            env.reset(seed=seed)
            data = getattr(env.unwrapped.task, "data", None) or {}
            kind = data.get("kind") if isinstance(data, dict) else None
            if kind is None:
                raise ValueError(
                    f"{env_id}: its tasks name no kind (task.data['kind']), so sft.per_kind cannot balance them; "
                    "use sft.num_examples"
                )
            seeds = chosen.setdefault(str(kind), [])
            if len(seeds) < per_kind:
                seeds.append(seed)
            if seed - start >= 50 * len(chosen) and all(len(v) >= per_kind for v in chosen.values()):
                break  # every kind met so far is full, and no new kind for a while
    finally:
        env.close()
    short = {kind: len(seeds) for kind, seeds in chosen.items() if len(seeds) < per_kind}
    if short:
        raise ValueError(f"{env_id}: fewer than {per_kind} tasks of kinds {short} in {max_seeds} seeds")
    return sorted(seed for seeds in chosen.values() for seed in seeds)


def _solver_trace(
    env_id: str,
    seed: int,
    tokenizer: Any,
    eos_ids: set[int],
    env_kwargs: dict[str, Any],
    sandbox: Any,
    rendering: str,
) -> Trajectory | None:
    env = make_env(RolloutTask(env_id, env_kwargs=dict(env_kwargs)), sandbox)
    try:
        observation, info = env.reset(seed=seed)
        task = env.unwrapped.task
        renderer = make_renderer(rendering, tokenizer, eos_ids)
        prompt_ids = renderer.prompt(observation, info.get("tools"))
        code = f"```python\n{env.unwrapped.solution_code(task)}\n```"
        code_ids = _encode(tokenizer, code)
        observation, _, terminated, truncated, info = env.step(code)
        if terminated or truncated or not observation:
            return None
        inserted, inserted_text = renderer.observation(code_ids, observation)
        result = observation[0]["content"].strip()
        answer = f"The result is \\boxed{{{result}}}."
        answer_ids = [*_encode(tokenizer, answer), end_of_turn(renderer, tokenizer)]
        _, reward, terminated, _, info = env.step(answer)
        if not (terminated and info.get("correct")):
            return None
    finally:
        env.close()
    response = code_ids + inserted + answer_ids
    return Trajectory(
        prompt_ids=prompt_ids,
        response_ids=response,
        action_mask=[1] * len(code_ids) + [0] * len(inserted) + [1] * len(answer_ids),
        rollout_logprobs=[0.0] * len(response),
        reward=float(reward),
        num_turns=2,
        correct=True,
        task_id=task.id,
        env_id=env_id,
        turns=[
            TurnRecord(code, len(code_ids), "stop", 1, ["ok"], inserted_text, len(inserted)),
            TurnRecord(answer, len(answer_ids), "eos"),
        ],
    )


def conversation_traces(
    path: str | Path,
    tokenizer: Any,
    eos_ids: set[int],
    *,
    rendering: str = "chat",
    observation_format: str = "output_block",
) -> list[Trajectory]:
    """Traces from a JSONL of chat conversations (see the module docstring), laid out as the recipe rolls out.

    `rendering="chat"` (or "auto" with a chat template): each assistant message is a turn of the chat template,
    learned, and ends with the end-of-turn token when it is the last message or when a user message follows;
    before a tool message it ends where the model would stop for the tool. The observation tokens are what the
    rollout's renderer inserts.
    `rendering="inline"` (base models, SimpleTIR style): after the prompt, the whole conversation is one running
    assistant turn; a tool message is spliced in as its `inline` text (a message's own "inline" field, else
    its content formatted as the environment would, `observation_format`), and only the last assistant message
    ends with the end-of-turn token. Other messages after the first assistant one need an "inline" field."""
    if rendering == "auto":
        rendering = "chat" if getattr(tokenizer, "chat_template", None) else "inline"
    traces = []
    # lines split at "\n" only: str.splitlines() also breaks at U+2028/U+2029/U+0085 inside a JSON string
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            messages = json.loads(line)["messages"]
            first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
            as_messages = []
            for m in messages:
                content = m["content"]
                inline = m.get("inline")
                if inline is None:
                    inline = format_inline(content, observation_format) if m["role"] == "tool" else None
                if not isinstance(content, str) or not isinstance(inline, str | None):
                    raise TypeError("content and inline must be strings")
                as_messages.append({"role": m["role"], "content": content, "inline": inline})
        except (ValueError, KeyError, TypeError, StopIteration, AttributeError) as error:
            raise ValueError(
                f'{where}: expected {{"messages": [{{"role", "content"}}, ...]}} with an assistant '
                f"message ({type(error).__name__}: {error})"
            ) from None
        renderer = make_renderer(rendering, tokenizer, eos_ids)
        prompt_ids = renderer.prompt(as_messages[:first])
        response: list[int] = []
        mask: list[int] = []
        i = first
        while i < len(as_messages):
            if as_messages[i]["role"] != "assistant":
                raise ValueError(f"{where}: message {i} is {as_messages[i]['role']!r}, expected assistant")
            j = i + 1
            while j < len(as_messages) and as_messages[j]["role"] != "assistant":
                j += 1
            ids = _encode(tokenizer, as_messages[i]["content"])
            following = as_messages[i + 1 : j]
            if not following or (rendering == "chat" and following[0]["role"] != "tool"):
                ids.append(end_of_turn(renderer, tokenizer))
            response += ids
            mask += [1] * len(ids)
            if following:
                if rendering == "inline":
                    missing = [k for k, m in enumerate(following, i + 1) if m["inline"] is None]
                    if missing:
                        raise ValueError(
                            f"{where}: message {missing[0]} ({following[missing[0] - i - 1]['role']!r}) has no "
                            '"inline" text: with rendering=inline only tool messages are formatted for you'
                        )
                inserted, _ = renderer.observation(
                    ids, [{**m, "inline": m["inline"] or ""} for m in following]
                )
                response += inserted
                mask += [0] * len(inserted)
            i = j
        traces.append(
            Trajectory(
                prompt_ids, response, mask, [0.0] * len(response), task_id=f"{Path(path).name}:{number}"
            )
        )
    return traces
