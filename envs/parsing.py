"""Messages, tool-call parsing and observation formatting.

An observation is a list of `Message`s. Each message carries what both renderers of the rollout layer need:

* `role` and `content` for chat-template rendering (instruct models: the tool output becomes a `tool` turn,
  e.g. Qwen's `<tool_response>` block, and feedback a `user` turn);
* `inline`, the exact text to append after the policy's own text when the whole episode is one assistant
  turn (base models, SimpleTIR/ToRL style), e.g. "\\n```output\\n42\\n```\\n".

Tool calls are parsed from the policy's text in two styles:

* "python_fence": fenced ```` ```python ```` (also `py`, `python3`) blocks; which complete block runs
  (`first` or `last`) is configurable. An unterminated fence is not a tool call.
* "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Qwen3 instruct). Every
  complete call in the turn is returned, in order; one that is not valid JSON is returned with `error` set.

All scanners here are linear in the length of the text, so a 1 MB action parses in milliseconds.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

ToolFormat = Literal["python_fence", "hermes"]
ObservationFormat = Literal["output_block", "code_execution_result", "tool_response"]
CodeBlock = Literal["first", "last"]

PYTHON_LANGUAGES: tuple[str, ...] = ("python", "py", "python3")


class Message(TypedDict):
    """One observation message. Exactly these three string fields.

    role: "system", "user", "assistant" or "tool".
    content: the text for a chat-template turn of that role.
    inline: the text to splice verbatim into a single running assistant turn (base-model rendering).
    """

    role: str
    content: str
    inline: str


def message(role: str, content: str, inline: str | None = None) -> Message:
    """Build a `Message`; `inline` defaults to `content`."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return {"role": role, "content": content, "inline": content if inline is None else inline}


@dataclass(frozen=True)
class ToolCall:
    """A tool call found in the policy's text.

    name: the tool's name ("python" for fenced code blocks).
    arguments: keyword arguments for the tool ({"code": ...} for the python tool).
    error: set when the call was found but could not be decoded (invalid JSON, no name); the environment
        answers it with this error as the observation and counts a tool error.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


# An opening fence: ``` then an optional language tag on the same line. Written so that no two quantifiers can
# match the same characters (a tag-less fence has one run of blanks), which keeps the scan linear even on a
# fence followed by a megabyte of spaces.
_FENCE_OPEN = re.compile(r"```[ \t]*(?:([A-Za-z0-9_+-]+)[ \t]*)?\r?\n")


def _fenced_blocks(text: str) -> Iterator[tuple[str, str | None]]:
    """(language, body) for each fenced block in order; body None for a final block that never closes."""
    position = 0
    while True:
        opening = _FENCE_OPEN.search(text, position)
        if opening is None:
            return
        close = text.find("```", opening.end())
        language = (opening.group(1) or "").lower()
        if close < 0:
            yield language, None
            return
        yield language, text[opening.end() : close]
        position = close + 3


def python_blocks(text: str, languages: tuple[str, ...] = PYTHON_LANGUAGES) -> list[str]:
    """Contents of every complete fenced code block tagged with one of `languages`, in order.

    A block opens with ```` ```<language> ```` on its own line and closes at the next ```` ``` ````; blocks in
    other languages (e.g. ```` ```output ````) are skipped over. An unterminated block ends the scan.
    """
    wanted = {language.lower() for language in languages}
    return [
        body.rstrip("\n").rstrip("\r")
        for language, body in _fenced_blocks(text)
        if body is not None and language in wanted
    ]


def has_unterminated_fence(text: str, languages: tuple[str, ...] = PYTHON_LANGUAGES) -> bool:
    """True when the text opens a code block in `languages` that never closes."""
    wanted = {language.lower() for language in languages}
    return any(body is None and language in wanted for language, body in _fenced_blocks(text))


def hermes_calls(text: str, limit: int | None = None) -> list[ToolCall]:
    """Every complete `<tool_call>...</tool_call>` in order (the first `limit` only, if given); undecodable
    ones carry `.error`."""
    return [_decode_hermes(body) for body in _hermes_bodies(text, limit)]


def count_hermes_calls(text: str) -> int:
    """How many complete `<tool_call>...</tool_call>` the text holds (without decoding them)."""
    return sum(1 for _ in _hermes_spans(text))


def _hermes_spans(text: str) -> Iterator[tuple[int, int]]:
    position = 0
    while True:
        start = text.find("<tool_call>", position)
        if start < 0:
            return
        end = text.find("</tool_call>", start)
        if end < 0:
            return
        yield start + len("<tool_call>"), end
        position = end + len("</tool_call>")


def _hermes_bodies(text: str, limit: int | None) -> list[str]:
    bodies = []
    for start, end in _hermes_spans(text):
        if limit is not None and len(bodies) >= limit:
            break
        bodies.append(text[start:end])
    return bodies


def _decode_hermes(body: str) -> ToolCall:
    """One call's JSON; anything that is not a well-formed call (invalid JSON, an integer past Python's digit
    limit, nesting past the recursion limit, a wrong shape) is a ToolCall with `error` set, never an exception."""
    try:
        payload = json.loads(body.strip())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, int digit limit; deep nesting
        return ToolCall(
            name="", error=f"tool call is not valid JSON: {type(error).__name__}: {str(error)[:200]}"
        )
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCall(name="", error='tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload["name"]
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = {"code": arguments} if name == "python" else {"input": arguments}
    if not isinstance(arguments, dict):
        return ToolCall(name=name, error="tool call arguments must be a JSON object")
    return ToolCall(name=name, arguments=arguments)


def find_tool_calls(
    text: str,
    tool_format: ToolFormat = "python_fence",
    code_block: CodeBlock = "first",
    languages: tuple[str, ...] = PYTHON_LANGUAGES,
    limit: int | None = None,
) -> list[ToolCall]:
    """The tool calls of one policy turn, in the given style (empty list: no complete call); with `limit`,
    only the first `limit` are decoded and returned (`count_tool_calls` says how many there are)."""
    if tool_format == "python_fence":
        blocks = python_blocks(text, languages)
        if not blocks or limit == 0:
            return []
        code = blocks[0] if code_block == "first" else blocks[-1]
        return [ToolCall(name="python", arguments={"code": code})]
    if tool_format == "hermes":
        return hermes_calls(text, limit)
    raise ValueError(f"tool_format must be 'python_fence' or 'hermes', got {tool_format!r}")


def count_tool_calls(
    text: str, tool_format: ToolFormat = "python_fence", languages: tuple[str, ...] = PYTHON_LANGUAGES
) -> int:
    """How many calls `find_tool_calls` would return without a limit (fenced blocks: 0 or 1)."""
    if tool_format == "hermes":
        return count_hermes_calls(text)
    return int(bool(python_blocks(text, languages)))


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of `text` (about half each) within `max_chars` UTF-8 bytes, marking what was cut.

    The text is put in Unicode normal form C first (what Qwen's tokenizers normalise to; any tokenizer reads
    it unchanged or shorter) and the cap counts its UTF-8 bytes (the same as characters for ASCII), because a
    byte-level BPE or a byte-fallback tokenizer spends at most one token per byte of what it reads, but a
    tokenizer that normalises can read more bytes than it was given: NFC decomposes a few characters (U+1D160,
    4 bytes, is 12 bytes in NFC), so 2,043 bytes of them were 6,050 tokens under a Qwen-style tokenizer when the
    cap counted the bytes before normalising. So the result is at most `max_chars` bytes in NFC, and at most as
    many tokens for such tokenizers (the rollout adds 3 bytes to each chat-control string in it, see
    `render.neutralize`: 1.3 tokens per byte at worst for 10-byte control tokens such as <|im_end|>; measured in
    tests/envs/test_observation_cap_tokens.py). A tokenizer that normalises with NFKC (some SentencePiece models)
    can still expand compatibility characters (U+FDFA, 3 bytes, is 33 in NFKC): the episode's token budget
    (`max_total_tokens`) bounds what is inserted either way."""
    window = 4 * max(max_chars, 1)  # NFC shrinks text at most 3 to 1 in bytes: the kept ends lie in these
    skipped = 0
    if len(text) > 2 * window:  # normalise only the two ends of a long text (NFC of megabytes takes seconds)
        skipped = len(text) - 2 * window
        text = text[:window] + text[-window:]
    text = unicodedata.normalize("NFC", text)
    data = text.encode("utf-8")
    if max_chars <= 0 or (len(data) <= max_chars and not skipped):
        return text
    marker = "\n...[{} characters truncated]...\n"
    budget = max(0, max_chars - len(marker.format(len(text) + skipped)))
    head_bytes = budget // 2
    tail_bytes = budget - head_bytes
    head = data[:head_bytes].decode("utf-8", "ignore")  # a character cut in two is dropped whole
    tail = data[len(data) - tail_bytes :].decode("utf-8", "ignore") if tail_bytes else ""
    return head + marker.format(len(text) + skipped - len(head) - len(tail)) + tail


def format_inline(text: str, observation_format: ObservationFormat) -> str:
    """The inline rendering of a tool result in the given style."""
    if observation_format == "output_block":
        return f"\n```output\n{text}\n```\n"
    if observation_format == "code_execution_result":
        return f"\nCode execution result: {text}\n"
    if observation_format == "tool_response":
        return f"\n<tool_response>\n{text}\n</tool_response>\n"
    raise ValueError(
        "observation_format must be 'output_block', 'code_execution_result' or 'tool_response', "
        f"got {observation_format!r}"
    )


def tool_message(text: str, observation_format: ObservationFormat) -> Message:
    """A `tool` message whose content is the raw result and whose inline text is formatted."""
    return message("tool", text, format_inline(text, observation_format))


def render_template(template: str, **fields: str) -> str:
    """Replace `{name}` placeholders for the given fields only (LaTeX braces elsewhere are left alone)."""
    for name, value in fields.items():
        template = template.replace("{" + name + "}", value)
    return template
