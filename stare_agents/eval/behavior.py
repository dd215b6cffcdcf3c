"""Behaviour of the policy's responses: reflection words, tool use, turns and length.

    reflection_counts("Wait, let me re-check that. But 3*4 = 12.")
    # {"hesitation": 1, "contrast": 1, "alternative": 0, "verification": 0, "revision": 1}
    behavior_summary(trajectories)   # {"responses": 64, "tool_calls_per_response": 1.6, ...}

Reflection words follow the paper's emergent-reflection analysis: words with which a model stops, doubts,
checks or redoes its own reasoning are counted per response (in the policy's own text: the turns it
generated, never tool output or the prompt), case-insensitively, as whole words, grouped into the closed set
of categories `REFLECTION_CATEGORIES`. Phrases are matched before the single words they contain, so
"double-check" counts once (verification) and "let me re-check" once (revision).

`behavior_summary` averages over the successful responses (failed rollouts are counted in `failed` and left
out of every mean: their text stops wherever the failure hit). Its keys are fixed (`SUMMARY_KEYS`); a mean
over nothing (no successful response, no tool call, no correct response) is None.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from stare_agents.rollout.summary import tool_outcomes
from stare_agents.trajectory import STOP_REASONS, Trajectory, policy_text

# category -> patterns (regular expressions, matched as whole words, case-insensitive), phrases first.
REFLECTION_WORDS: dict[str, tuple[str, ...]] = {
    "hesitation": (r"hold on", r"wait", r"hmm+"),
    "contrast": (r"but", r"however", r"although", r"though"),
    "alternative": (
        r"alternatively",
        r"instead",
        r"another (?:way|approach|method)",
        r"on second thought",
    ),
    "verification": (
        r"double[- ]check(?:s|ed|ing)?",
        r"sanity[- ]check",
        r"verif(?:y|ies|ied|ying|ication)",
        r"check(?:s|ed|ing)?",
        r"confirm(?:s|ed|ing)?",
        r"make sure",
    ),
    "revision": (
        r"let me re-?\w+",
        r"let's re-?(?:check|examine|evaluate|consider|calculate|compute|think|do|try|visit|read)\w*",
        r"re-?(?:check|examine|evaluate|consider|calculate|compute|think|visit)\w*",
        r"mistake",
        r"i was wrong",
        r"that'?s (?:not right|wrong|incorrect)",
    ),
}
REFLECTION_CATEGORIES: tuple[str, ...] = tuple(REFLECTION_WORDS)

# One regex with a named group per category; alternation order makes earlier (longer) phrases win, and
# re.finditer never counts overlapping matches twice. "(?<![\w-])" keeps "re-check" out of "check".
_REFLECTION_RE = re.compile(
    "|".join(
        rf"(?P<{category}>(?<![\w-])(?:{'|'.join(patterns)})\b)"
        for category, patterns in REFLECTION_WORDS.items()
    ),
    re.IGNORECASE,
)


def reflection_counts(text: str) -> dict[str, int]:
    """How many reflection words of each category `text` holds (keys: `REFLECTION_CATEGORIES`)."""
    if not isinstance(text, str):
        raise TypeError(f"reflection_counts needs the response text (str), got {type(text).__name__}")
    counts = dict.fromkeys(REFLECTION_CATEGORIES, 0)
    for match in _REFLECTION_RE.finditer(text):
        counts[match.lastgroup] += 1  # type: ignore[index]
    return counts


@dataclass
class ResponseStats:
    """What one sampled response did (the per-sample part of `behavior_summary`)."""

    response_tokens: int  # tokens the policy sampled (action tokens)
    response_chars: int  # characters of the policy's own text
    turns: int
    tool_calls: int
    tool_errors: int  # calls that did not end ok (errors, kills, timeouts; `tool_outcomes`)
    tool_timeouts: int
    void_turns: int
    correct: bool
    failed: bool
    stop_reason: str
    reflection: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResponseStats:
        return cls(**dict(data))


def response_stats(trajectory: Trajectory) -> ResponseStats:
    """Per-response statistics of one trajectory. Tool statuses come from the turn records (the env's
    `info` counters when a trajectory has no turns, e.g. a rollout that failed before generating)."""
    tool_calls, tool_errors, tool_timeouts = tool_outcomes(trajectory)  # errors: every call not ok
    text = policy_text(trajectory)
    return ResponseStats(
        response_tokens=trajectory.num_action_tokens,
        response_chars=len(text),
        turns=trajectory.num_turns,
        tool_calls=tool_calls,
        tool_errors=tool_errors,
        tool_timeouts=tool_timeouts,
        void_turns=int(trajectory.info.get("void_turns", 0)),
        correct=bool(trajectory.correct) and not trajectory.failed,
        failed=trajectory.failed,
        stop_reason=trajectory.stop_reason,
        reflection=reflection_counts(text),
    )


SUMMARY_KEYS: tuple[str, ...] = (
    "responses",
    "failed",
    "turns_mean",
    "response_tokens_mean",
    "response_tokens_correct_mean",
    "response_tokens_wrong_mean",
    "response_chars_mean",
    "tool_calls_per_response",
    "tool_call_rate",
    "tool_error_rate",
    "tool_timeout_rate",
    "void_turns_per_response",
    "void_turn_rate",
    *(f"stop_reason/{reason}" for reason in STOP_REASONS),
    "reflection/total_per_response",
    *(f"reflection/{category}_per_response" for category in REFLECTION_CATEGORIES),
    *(f"reflection/{category}_rate" for category in REFLECTION_CATEGORIES),
)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def summarize_responses(stats: Iterable[ResponseStats]) -> dict[str, float | int | None]:
    """The `SUMMARY_KEYS` figures of a set of responses (see the module docstring)."""
    stats = list(stats)
    ok = [s for s in stats if not s.failed]
    calls = sum(s.tool_calls for s in ok)
    summary: dict[str, float | int | None] = {
        "responses": len(stats),
        "failed": len(stats) - len(ok),
        "turns_mean": _mean([s.turns for s in ok]),
        "response_tokens_mean": _mean([s.response_tokens for s in ok]),
        "response_tokens_correct_mean": _mean([s.response_tokens for s in ok if s.correct]),
        "response_tokens_wrong_mean": _mean([s.response_tokens for s in ok if not s.correct]),
        "response_chars_mean": _mean([s.response_chars for s in ok]),
        "tool_calls_per_response": _mean([s.tool_calls for s in ok]),
        "tool_call_rate": _mean([float(s.tool_calls > 0) for s in ok]),
        "tool_error_rate": _ratio(sum(s.tool_errors for s in ok), calls),
        "tool_timeout_rate": _ratio(sum(s.tool_timeouts for s in ok), calls),
        "void_turns_per_response": _mean([s.void_turns for s in ok]),
        "void_turn_rate": _mean([float(s.void_turns > 0) for s in ok]),
    }
    # stop reasons over all responses, failed ones included (that is where failures show)
    for reason in STOP_REASONS:
        summary[f"stop_reason/{reason}"] = _mean([float(s.stop_reason == reason) for s in stats])
    summary["reflection/total_per_response"] = _mean([sum(s.reflection.values()) for s in ok])
    for category in REFLECTION_CATEGORIES:
        summary[f"reflection/{category}_per_response"] = _mean([s.reflection.get(category, 0) for s in ok])
    for category in REFLECTION_CATEGORIES:
        summary[f"reflection/{category}_rate"] = _mean([float(s.reflection.get(category, 0) > 0) for s in ok])
    assert tuple(summary) == SUMMARY_KEYS
    return summary


def behavior_summary(trajectories: Iterable[Trajectory]) -> dict[str, float | int | None]:
    """Reflection words, tool use, turns and length over a set of trajectories (keys: `SUMMARY_KEYS`)."""
    return summarize_responses(response_stats(t) for t in trajectories)
