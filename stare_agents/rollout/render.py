"""Messages -> token ids, for the two ways an episode can be laid out.

* `ChatRenderer` (instruct models): every policy turn is an assistant message and every observation a turn
  of its own role (`tool`, `user`), rendered by the tokenizer's chat template. The tokens inserted after a
  policy turn are what the template emits after an assistant message in a reference conversation (the
  episode's prompt, one assistant message holding a random marker, then the observation): the closing of
  the assistant turn (left out when the policy sampled an end-of-sequence id itself, which then stays an
  action token and closes the turn), the observation turns and the next assistant header. Earlier turns are
  never re-rendered, so templates that trim content (Llama 3.x), rewrite earlier `<think>` blocks (Qwen3)
  or wrap tool output in a user turn work the same way as ChatML. Whether the template's rendering of the
  whole conversation equals the episode's sequence is a diagnostic (`prefix_preserving`), not a requirement.
  A template that refuses the observation's roles (strict user/assistant alternation, no `tool` role) gets
  the observation as one `user` message instead, and the fallback is logged once per template.
* `InlineRenderer` (base models, SimpleTIR/ToRL style): the whole episode is one running assistant turn; an
  observation's `inline` text (e.g. "\\n```output\\n42\\n```\\n") is appended after the policy's text.

Both know the template's end-of-turn id (`end_of_turn_id`, e.g. <|im_end|>, <|eot_id|>), which SFT traces end
their assistant turns with and which engines stop on.

Observation text is tokenised once, at insertion; sampled ids are never re-tokenised. Control-token strings in
observation text (a program that prints "<|im_end|>") are broken up first (`neutralize`), so tool output can
never become chat-control tokens.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Sequence
from typing import Any, Literal, get_args

logger = logging.getLogger("stare_agents.rollout")

Rendering = Literal["auto", "chat", "inline"]
RENDERINGS: tuple[str, ...] = get_args(Rendering)


class TemplateError(RuntimeError):
    """The chat template cannot render a conversation the rollout needs (no template, a jinja error even
    with the fallback roles, or an assistant message it drops)."""


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


_WARNED: set[str] = set()  # templates whose fallback or rewriting was already reported (once per process)


def _warn_once(tokenizer: Any, kind: str, message: str) -> None:
    key = kind + hashlib.sha256(str(getattr(tokenizer, "chat_template", "")).encode()).hexdigest()
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(message)


def _marker() -> str:
    """Assistant content no template trims, splits or rewrites, and no policy can guess."""
    return "STAREREF" + secrets.token_hex(8)


def _as_one_user_message(observation: Sequence[dict]) -> list[dict[str, str]]:
    return [{"role": "user", "content": "\n\n".join(m["content"] for m in observation)}]


def template_end_of_turn(tokenizer: Any) -> int | None:
    """The id that closes an assistant turn in the chat template (the first control token the template emits
    after an assistant message's content, e.g. <|im_end|> or <|eot_id|>), or None without a template or when
    it emits none."""
    return _closing(tokenizer)[0]


def _closing(tokenizer: Any) -> tuple[int | None, str]:
    """(end-of-turn id, the text after an assistant message's content up to and including that token)."""
    if not getattr(tokenizer, "chat_template", None):
        return None, ""
    marker = _marker()
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": marker}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    except Exception:  # a template that cannot end on an assistant message
        return None, ""
    if text.count(marker) != 1:
        return None, ""
    after = text.split(marker, 1)[1]
    specials = special_strings(tokenizer)
    for i in range(len(after)):
        for special in specials:
            if after.startswith(special, i):
                return int(tokenizer.convert_tokens_to_ids(special)), after[: i + len(special)]
    return None, ""


class ChatRenderer:
    """Chat-template tool turns (see the module docstring). One instance per episode."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template: use rendering='inline'")
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.specials = special_strings(tokenizer)
        self.end_of_turn_id, self._closing = _closing(tokenizer)
        self.messages: list[dict[str, str]] = []  # the conversation so far (for the diagnostic)
        self.prompt_messages: list[dict[str, str]] = []
        self.tools: list[dict] | None = None
        self.text = ""  # the sequence so far as text: prompt, sampled ids and inserted text
        # None until checked; False once the template's rendering of the whole conversation differs from the
        # episode's sequence (its earlier turns re-render differently): a diagnostic, nothing depends on it
        self.prefix_preserving: bool | None = None
        self.observation_role_fallback = False  # observations went in as one user message (see above)

    def _render(self, messages: Sequence[dict], generation_prompt: bool = True) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if self.tools:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(list(messages), **kwargs)

    def prompt(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        self.prompt_messages = _chat_messages(messages)
        self.messages = list(self.prompt_messages)
        self.tools = tools or None
        self.text = self._render(self.messages)
        return _encode(self.tokenizer, self.text)

    def turn_text(self, sampled_ids: Sequence[int]) -> str:
        """What the environment receives: the sampled ids decoded, without a final end-of-sequence id."""
        ids = list(sampled_ids)
        if ids and ids[-1] in self.eos_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _after_assistant(self, observation: list[dict[str, str]]) -> str:
        """What the template emits after an assistant message's content, up to the next assistant header."""
        marker = _marker()
        reference = [*self.prompt_messages, {"role": "assistant", "content": marker}]
        try:
            rendered = self._render(reference + observation)
        except Exception as error:
            if observation == _as_one_user_message(observation) or self.observation_role_fallback:
                raise TemplateError(
                    f"the chat template cannot render an observation of roles {[m['role'] for m in observation]} "
                    f"after an assistant message ({type(error).__name__}: {error}); use rendering='inline' or "
                    "a template that accepts a user turn after an assistant turn"
                ) from error
            self.observation_role_fallback = True
            _warn_once(
                self.tokenizer,
                "roles",
                f"the chat template refuses an observation of roles {[m['role'] for m in observation]} "
                f"({type(error).__name__}: {error}); observations go in as one user message instead",
            )
            return self._after_assistant(_as_one_user_message(observation))
        if rendered.count(marker) != 1:
            raise TemplateError(
                "the chat template does not render an assistant message's content as given (a reference "
                f"message {marker!r} appears {rendered.count(marker)} times); use rendering='inline'"
            )
        return rendered.split(marker, 1)[1]

    def observation(self, sampled_ids: Sequence[int], observation: Sequence[dict]) -> tuple[list[int], str]:
        """Ids (and their text) to insert after the policy's turn: the closing of its turn (unless it sampled
        an end-of-sequence id), the observation turns and the next assistant header."""
        messages = _chat_messages(_neutralized(observation, self.specials))
        if self.observation_role_fallback:
            messages = _as_one_user_message(messages)
        inserted = self._after_assistant(messages)
        if (
            sampled_ids
            and sampled_ids[-1] in self.eos_ids
            and self._closing
            and inserted.startswith(self._closing)
        ):
            # the sampled id (whichever end-of-sequence id it is) closed the turn: the template's closing up to
            # its end-of-turn token is left out, the rest (e.g. the newline after <|im_end|>) goes in
            inserted = inserted[len(self._closing) :]
        self._diagnose(sampled_ids, messages, inserted)
        return _encode(self.tokenizer, inserted), inserted

    def _diagnose(self, sampled_ids: Sequence[int], observation: list[dict[str, str]], inserted: str) -> None:
        """Keep `prefix_preserving` up to date: does the template's rendering of the whole conversation equal
        the sequence so far? Logged once per template when it does not (nothing else changes)."""
        self.text += self.tokenizer.decode(list(sampled_ids), skip_special_tokens=False) + inserted
        self.messages += [{"role": "assistant", "content": self.turn_text(sampled_ids)}, *observation]
        if self.prefix_preserving is False:
            return
        try:
            rendered = self._render(self.messages)
        except Exception:
            rendered = None
        if rendered == self.text:
            self.prefix_preserving = True
            return
        self.prefix_preserving = False
        at = next(
            (i for i, (a, b) in enumerate(zip(rendered or "", self.text, strict=False)) if a != b), None
        )
        _warn_once(
            self.tokenizer,
            "prefix",
            "the chat template renders earlier turns differently once the conversation goes on (first "
            f"difference at character {at}); rollouts keep the sampled tokens as sampled, so the learner "
            "scores what the policy saw, not the template's re-rendering",
        )


class InlineRenderer:
    """One running assistant turn; observations are spliced in as their `inline` text."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.specials = special_strings(tokenizer)
        self.end_of_turn_id = template_end_of_turn(tokenizer)

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
