"""The trajectory record: one episode as one token sequence, and its collation into padded tensors.

A trajectory is `prompt_ids` followed by `response_ids`. The response interleaves tokens the policy sampled
(`action_mask` 1, with the engine's log-probability in `rollout_logprobs`) and tokens the rollout layer
inserted (`action_mask` 0, `rollout_logprobs` 0.0): tool output, environment feedback and chat-template
boundaries. The ids are exactly what the engine sampled plus the observation tokens as inserted; nothing
re-tokenises generated text.

    trajectories = [Trajectory(...), ...]
    write_jsonl(trajectories, "rollouts.jsonl"); again = read_jsonl("rollouts.jsonl")
    batch = collate(trajectories, pad_token_id=tokenizer.pad_token_id)
    # batch.input_ids [B, P + R]: prompts left-padded to P, responses right-padded to R
    # batch.action_mask, batch.rollout_logprobs, batch.response_ids [B, R]; batch.rewards [B]
    # the logits that score response token j sit at position P - 1 + j of input_ids
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from stare_agents.jsonl import Unread, dumps_line, read_lines, report_unread

# Why an episode ended. A closed set: metrics, reports and tests count these words.
STOP_REASONS: tuple[str, ...] = (
    "answered",  # the environment terminated the episode (a final answer, or a void turn under "end")
    "void_turn",  # terminated because the policy's turn had neither a tool call nor an answer
    "turn_limit",  # the environment truncated the episode at its turn limit
    "token_budget",  # the response token budget ran out before the environment ended the episode
    "context_overflow",  # the next turn would not fit in the model's context window
    "tool_failure",  # the sandbox failed in a way the episode cannot recover from
    "env_error",  # the environment failed before the policy acted (make, reset, prompt) or returned junk
    "policy_error",  # the policy's output broke the episode (its turn fails the template check, the env raised)
    "engine_error",  # the inference engine failed for this request
)
# Who caused each stop: the policy's output ("policy": scored, a failure among them counts as reward 0 in the
# loss and as wrong in every accuracy) or the infrastructure ("infrastructure": engine, sandbox, environment
# down; the reward says nothing about the policy, so the episode is left out and counted). Every member of
# STOP_REASONS has a cause; a test checks it.
STOP_CAUSES: dict[str, str] = {
    "answered": "policy",
    "void_turn": "policy",
    "turn_limit": "policy",
    "token_budget": "policy",
    "context_overflow": "policy",
    "policy_error": "policy",
    "tool_failure": "infrastructure",
    "env_error": "infrastructure",
    "engine_error": "infrastructure",
}
# Stops that are failures (no regular end); of these, only the infrastructure's leave the loss and accuracy.
FAILURE_STOP_REASONS: frozenset[str] = frozenset(
    {"tool_failure", "env_error", "engine_error", "policy_error"}
)
# Stop reasons of trajectories that failed for the infrastructure (their reward says nothing about the policy).
FAILED_STOP_REASONS: frozenset[str] = frozenset(r for r in FAILURE_STOP_REASONS if STOP_CAUSES[r] != "policy")


@dataclass
class TurnRecord:
    """One policy turn and what came back.

    text: the text the sampled ids decode to (what the environment received).
    num_tokens: how many ids the policy sampled this turn.
    finish_reason: the engine's: "stop" (a stop string), "eos", "length" (per-turn max tokens).
    tool_calls / tool_statuses: the environment's tool calls this turn and their statuses
        ("ok", "error", "timeout", "killed").
    observation: the text inserted after the turn (tool output, feedback, template boundary); "" if none.
    observation_tokens: how many ids that insertion added (action_mask 0).
    generate_s / env_s: wall time of this turn's generation request and of the environment's step (tool
        calls, grading).
    """

    text: str
    num_tokens: int
    finish_reason: str
    tool_calls: int = 0
    tool_statuses: list[str] = field(default_factory=list)
    observation: str = ""
    observation_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0


@dataclass
class Trajectory:
    """One episode. See the module docstring for the token layout; `STOP_REASONS` for `stop_reason`."""

    prompt_ids: list[int]
    response_ids: list[int]
    action_mask: list[int]
    rollout_logprobs: list[float]
    reward: float = 0.0
    num_turns: int = 0
    stop_reason: str = "answered"
    weight_version: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    task_id: str = ""
    env_id: str = ""
    group_id: str = ""  # trajectories sampled for the same prompt share it (GRPO groups)
    sample_index: int = 0
    correct: bool = False
    error: str | None = None  # what went wrong, for the failed stop reasons

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError if the per-token lists disagree or a field is outside its contract."""
        n = len(self.response_ids)
        if len(self.action_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(
                f"trajectory {self.task_id!r}: response_ids ({n}), action_mask ({len(self.action_mask)}) and "
                f"rollout_logprobs ({len(self.rollout_logprobs)}) must have the same length"
            )
        if not self.prompt_ids and self.stop_reason not in FAILED_STOP_REASONS:
            raise ValueError(f"trajectory {self.task_id!r}: prompt_ids is empty")
        if any(bit not in (0, 1) for bit in self.action_mask):
            raise ValueError(f"trajectory {self.task_id!r}: action_mask must hold only 0 and 1")
        if any(lp != 0.0 for lp, bit in zip(self.rollout_logprobs, self.action_mask, strict=True) if not bit):
            raise ValueError(
                f"trajectory {self.task_id!r}: rollout_logprobs must be 0.0 where action_mask is 0"
            )
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be one of {STOP_REASONS}, got {self.stop_reason!r}")
        if not math.isfinite(self.reward):
            raise ValueError(f"trajectory {self.task_id!r}: reward must be finite, got {self.reward}")
        if self.stop_reason == "policy_error" and (self.reward != 0.0 or self.correct):
            raise ValueError(f"trajectory {self.task_id!r}: a policy_error scores 0 and is never correct")

    @property
    def failed(self) -> bool:
        """The infrastructure failed (environment, sandbox or engine), so the reward carries no signal: such
        a trajectory is left out of the loss and of accuracy, and counted. A failure the policy caused
        (`policy_error`) is not `failed`: it stays in, with reward 0."""
        return self.stop_reason in FAILED_STOP_REASONS

    @property
    def failure_cause(self) -> str | None:
        """ "policy" or "infrastructure" for a failed episode (see STOP_CAUSES), None for a regular end."""
        return STOP_CAUSES[self.stop_reason] if self.stop_reason in FAILURE_STOP_REASONS else None

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown trajectory fields {sorted(unknown)}; known: {sorted(known)}")
        data = dict(data)
        data["turns"] = [TurnRecord(**turn) for turn in data.get("turns", [])]
        return cls(**data)


def learning_trajectories(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """The trajectories whose reward says something about the policy: all but the infrastructure's failures.
    A failure the policy caused stays in with reward 0, so that failing is never a way out of a low reward."""
    return [t for t in trajectories if not t.failed]


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path, *, append: bool = False) -> int:
    """Write one JSON object per line; returns how many were written."""
    count = 0
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(dumps_line(trajectory.to_dict()) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path, *, unread: list[Unread] | None = None) -> list[Trajectory]:
    """Read trajectories written by `write_jsonl`. Lines are split at "\\n" only (a raw U+2028 inside a
    record, from an older writer, stays in its string). A torn last line (a killed writer) is skipped and
    reported (into `unread` when given, else as a warning); a bad line before it is a ValueError."""
    values, problems = read_lines(path)
    for problem in problems:
        if not problem.torn:
            raise ValueError(f"{problem.path}:{problem.line}: not a JSON trajectory ({problem.reason})")
    report_unread(problems, unread, "trajectory lines")
    return [Trajectory.from_dict(value) for _, value in values]


@dataclass
class Batch:
    """Padded tensors for the learner (see the module docstring for the layout)."""

    input_ids: torch.Tensor  # [B, P + R] long
    attention_mask: torch.Tensor  # [B, P + R] long, 0 on padding
    position_ids: torch.Tensor  # [B, P + R] long, counting from 0 at each sequence's first real token
    response_ids: torch.Tensor  # [B, R] long
    action_mask: torch.Tensor  # [B, R] float, 1 on policy-sampled tokens
    rollout_logprobs: torch.Tensor  # [B, R] float, 0 where action_mask is 0
    rewards: torch.Tensor  # [B] float
    prompt_length: int  # P

    @property
    def response_length(self) -> int:
        return self.response_ids.shape[1]

    def to(self, device: torch.device | str) -> Batch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            if isinstance(getattr(self, f.name), torch.Tensor)
            else getattr(self, f.name)
            for f in fields(self)
        }
        return Batch(**moved)


def collate(trajectories: Sequence[Trajectory], pad_token_id: int) -> Batch:
    """Pad trajectories into a `Batch`: prompts left-padded, responses right-padded."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    empty = [t.task_id for t in trajectories if not t.prompt_ids]
    if empty:
        raise ValueError(f"cannot collate trajectories without a prompt (failed rollouts?): {empty}")
    batch_size = len(trajectories)
    prompt_len = max(len(t.prompt_ids) for t in trajectories)
    response_len = max(1, max(len(t.response_ids) for t in trajectories))
    input_ids = torch.full((batch_size, prompt_len + response_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_ids = torch.full((batch_size, response_len), pad_token_id, dtype=torch.long)
    action_mask = torch.zeros(batch_size, response_len)
    rollout_logprobs = torch.zeros(batch_size, response_len)
    for row, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[row, prompt_len - p : prompt_len] = torch.tensor(t.prompt_ids)
        attention_mask[row, prompt_len - p : prompt_len + r] = 1
        if r:
            input_ids[row, prompt_len : prompt_len + r] = torch.tensor(t.response_ids)
            response_ids[row, :r] = torch.tensor(t.response_ids)
            action_mask[row, :r] = torch.tensor(t.action_mask, dtype=torch.float)
            rollout_logprobs[row, :r] = torch.tensor(t.rollout_logprobs, dtype=torch.float)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    rewards = torch.tensor([float(t.reward) for t in trajectories])
    return Batch(
        input_ids,
        attention_mask,
        position_ids,
        response_ids,
        action_mask,
        rollout_logprobs,
        rewards,
        prompt_len,
    )


def policy_text(trajectory: Trajectory) -> str:
    """The policy's own text: its turns, joined with newlines (as the environment grades them). Training's
    per-step behaviour figures and evaluation's read the same text."""
    return "\n".join(turn.text for turn in trajectory.turns)
