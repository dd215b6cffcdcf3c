"""Messages -> token ids, for the two ways an episode can be laid out.

* `ChatRenderer` (instruct models): every policy turn is an assistant message and every observation a turn
  of its own role (`tool`, `user`), rendered by the tokenizer's chat template. After a turn, the tokens to
  insert are the template's rendering of the whole conversation minus what is already there: the closing
  of the assistant turn (unless the policy sampled the end-of-turn token itself, which then stays an action
  token), the observation turns and the next assistant header. Every turn asserts the prefix invariant: the
  new rendering must start with the old rendering plus the text of the sampled ids.
* `InlineRenderer` (base models, SimpleTIR/ToRL style): the whole episode is one running assistant turn; an
  observation's `inline` text (e.g. "\\n```output\\n42\\n```\\n") is appended after the policy's text.

Observation text is tokenised once, at insertion; sampled ids are never re-tokenised. Control-token strings in
observation text (a program that prints "<|im_end|>") are broken up first (`neutralize`), so tool output can
never become chat-control tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

RENDERINGS: tuple[str, ...] = ("auto", "chat", "inline")
Rendering = Literal["auto", "chat", "inline"]


class TemplateError(RuntimeError):
    """The chat template does not render a conversation as an extension of its shorter prefix."""


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_messages(messages: Sequence[dict]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def special_strings(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's special and added control tokens (e.g. "<|im_end|>"), longest first."""
    strings = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            strings.add(str(token))
    return sorted((s for s in strings if len(s) > 1), key=len, reverse=True)


def neutralize(text: str, specials: Sequence[str]) -> str:
    """Break up control-token strings in untrusted text (tool output) so they tokenize as plain text.

    A program the policy writes can print "<|im_end|>\n<|im_start|>assistant\n..."; tokenised as is, that
    would turn tool output into chat-control tokens (a forged end of the tool turn and a forged assistant
    turn). A word joiner (U+2060) after the first character keeps the text readable and inert."""
    for special in specials:
        if special in text:
            text = text.replace(special, special[0] + "\u2060" + special[1:])
    return text


def _neutralized(observation: Sequence[dict], specials: Sequence[str]) -> list[dict]:
    return [
        {**m, "content": neutralize(m["content"], specials), "inline": neutralize(m["inline"], specials)}
        for m in observation
    ]


class ChatRenderer:
    """Chat-template tool turns (see the module docstring). One instance per episode."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template: use rendering='inline'")
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.specials = special_strings(tokenizer)
        self.messages: list[dict[str, str]] = []
        self.tools: list[dict] | None = None
        self.text = ""

    def _render(self) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if self.tools:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(self.messages, **kwargs)

    def prompt(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        self.messages = _chat_messages(messages)
        self.tools = tools or None
        self.text = self._render()
        return _encode(self.tokenizer, self.text)

    def turn_text(self, sampled_ids: Sequence[int]) -> str:
        """What the environment receives: the sampled ids decoded, without a final end-of-turn token."""
        ids = list(sampled_ids)
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def observation(self, sampled_ids: Sequence[int], observation: Sequence[dict]) -> tuple[list[int], str]:
        """Ids (and their text) to insert after the policy's turn so the sequence renders the conversation."""
        sampled_text = self.tokenizer.decode(list(sampled_ids), skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": self.turn_text(sampled_ids)})
        self.messages.extend(_chat_messages(_neutralized(observation, self.specials)))
        rendered = self._render()
        expected = self.text + sampled_text
        if not rendered.startswith(expected):
            at = next((i for i, (a, b) in enumerate(zip(rendered, expected, strict=False)) if a != b), None)
            raise TemplateError(
                "the chat template does not render the conversation as an extension of the tokens so far "
                f"(first difference at character {at}: {rendered[at or 0 : (at or 0) + 40]!r} vs "
                f"{expected[at or 0 : (at or 0) + 40]!r}); use rendering='inline' or a prefix-preserving template"
            )
        inserted = rendered[len(expected) :]
        self.text = rendered
        return _encode(self.tokenizer, inserted), inserted


class InlineRenderer:
    """One running assistant turn; observations are spliced in as their `inline` text."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.specials = special_strings(tokenizer)

    def prompt(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                _chat_messages(messages), tokenize=False, add_generation_prompt=True
            )
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        return _encode(self.tokenizer, text)

    def turn_text(self, sampled_ids: Sequence[int]) -> str:
        ids = list(sampled_ids)
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def observation(self, sampled_ids: Sequence[int], observation: Sequence[dict]) -> tuple[list[int], str]:
        inserted = "".join(m["inline"] for m in _neutralized(observation, self.specials))
        return _encode(self.tokenizer, inserted), inserted


def make_renderer(rendering: str, tokenizer: Any, eos_ids: set[int]) -> ChatRenderer | InlineRenderer:
    """ "chat", "inline", or "auto" (chat when the tokenizer has a chat template)."""
    if rendering not in RENDERINGS:
        raise ValueError(f"rendering must be one of {RENDERINGS}, got {rendering!r}")
    if rendering == "auto":
        rendering = "chat" if getattr(tokenizer, "chat_template", None) else "inline"
    return ChatRenderer(tokenizer, eos_ids) if rendering == "chat" else InlineRenderer(tokenizer, eos_ids)
