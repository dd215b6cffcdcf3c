"""Tool-call parsing (fenced python blocks, Hermes JSON), observation formatting and truncation."""

from __future__ import annotations

import time

import pytest

from stare_agents.envs import (
    ToolCall,
    find_tool_calls,
    format_inline,
    hermes_calls,
    message,
    python_blocks,
    truncate_middle,
)
from stare_agents.envs.parsing import has_unterminated_fence, render_template

TWO_BLOCKS = "a\n```python\nx = 1\n```\nb\n```output\n1\n```\n```py\nprint(x)\n```\n"


def test_python_blocks_in_order_skipping_other_languages() -> None:
    assert python_blocks(TWO_BLOCKS) == ["x = 1", "print(x)"]
    assert python_blocks("```python3\nimport os\n```") == ["import os"]
    assert python_blocks("```bash\nls\n```") == []


@pytest.mark.parametrize(("which", "code"), [("first", "x = 1"), ("last", "print(x)")])
def test_code_block_first_or_last(which: str, code: str) -> None:
    assert find_tool_calls(TWO_BLOCKS, "python_fence", which) == [ToolCall("python", {"code": code})]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "```python\nprint(1)",  # unterminated
        "```pythonprint(1)```",  # no newline after the language tag
        "``python\nprint(1)\n```",  # two backticks
        "",
        "just prose",
    ],
)
def test_malformed_and_unterminated_fences_are_not_calls(text: str) -> None:
    assert find_tool_calls(text) == []


def test_unterminated_fence_detection() -> None:
    assert has_unterminated_fence("```python\nprint(1)")
    assert not has_unterminated_fence("```python\nprint(1)\n```")
    assert not has_unterminated_fence("```output\n1")


def test_hermes_calls() -> None:
    text = (
        'I will compute.<tool_call>\n{"name": "python", "arguments": {"code": "print(2)"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "python", "arguments": {"code": "unterminated"}}'
    )
    calls = hermes_calls(text)
    assert calls[0] == ToolCall("python", {"code": "print(2)"})
    assert calls[1] == ToolCall("python", {"code": "print(3)"})  # arguments given as a JSON string
    assert calls[2].error is not None and "not valid JSON" in calls[2].error
    assert calls[3].error is not None and "name" in calls[3].error
    assert len(calls) == 4  # the unterminated one is not a call
    assert find_tool_calls(text, "hermes") == calls


def test_parsers_are_linear_on_a_megabyte() -> None:
    fences = "```python\n" * 100_000  # each opening is closed by the next one: 50k empty blocks
    unterminated = "```python\n" + "x = 1\n" * 170_000
    hermes_hostile = "<tool_call>" * 100_000
    started = time.perf_counter()
    assert len(python_blocks(fences)) == 50_000
    assert find_tool_calls(unterminated) == []
    assert hermes_calls(hermes_hostile) == []
    assert python_blocks("x" * 1_000_000 + "\n```python\nprint(1)\n```") == ["print(1)"]
    assert time.perf_counter() - started < 2.0


def test_truncate_middle_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 10_000 + "TAIL"
    short = truncate_middle(text, 200)
    assert len(short) <= 200
    assert short.startswith("HEAD") and short.endswith("TAIL")
    assert "characters truncated" in short
    assert truncate_middle("small", 200) == "small"


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("output_block", "\n```output\n42\n```\n"),
        ("code_execution_result", "\nCode execution result: 42\n"),
        ("tool_response", "\n<tool_response>\n42\n</tool_response>\n"),
    ],
)
def test_observation_styles(style: str, expected: str) -> None:
    assert format_inline("42", style) == expected  # type: ignore[arg-type]


def test_message_shape_and_validation() -> None:
    assert message("user", "hi") == {"role": "user", "content": "hi", "inline": "hi"}
    with pytest.raises(ValueError, match="role"):
        message("robot", "hi")


def test_render_template_leaves_latex_braces_alone() -> None:
    assert (
        render_template("Solve: {problem} \\boxed{}", problem="$\\frac{1}{2}$")
        == "Solve: $\\frac{1}{2}$ \\boxed{}"
    )
