"""Text as the viewer and the completions table show it: every character that hides, reorders or cannot be
encoded is shown as a marked code-point chip `⟨U+XXXX⟩`, never applied.

    marked("a\\u202eb")           # 'a⟨U+202E⟩b': for plain-text outputs (the TensorBoard table, the page's title)
    escape_json(value)           # JSON safe inside a <script> block and encodable as UTF-8

`INVISIBLE_RANGES` is the one list: the page's script builds its pattern from it (the page's meta block carries
it), so the page and the table mark the same characters. It holds the C0 controls but tab and newline (the
page draws these as control pictures, U+2400...), DEL and the C1 controls, bidi controls, zero-width and other
format characters (soft hyphen, U+061C, word joiner, invisible operators, interlinear annotation), fillers that
render as blank (Hangul fillers), Unicode tag characters (how hidden instructions ride in tool outputs:
U+E0020-E007E spell ASCII), variation selectors 17-256, line and paragraph separators, and lone surrogates
(valid in JSON as "\\udc80", not encodable as UTF-8). Variation selectors 1-16 (U+FE00-FE0F) are left alone:
emoji use them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from stare_agents.jsonl import escape_surrogates

# (first, last, name) code points, ascending
INVISIBLE_RANGES: tuple[tuple[int, int, str], ...] = (
    (0x00, 0x08, "control"),
    (0x0B, 0x1F, "control"),
    (0x7F, 0x7F, "delete"),
    (0x80, 0x9F, "C1 control"),
    (0xAD, 0xAD, "soft hyphen"),
    (0x34F, 0x34F, "combining grapheme joiner"),
    (0x61C, 0x61C, "Arabic letter mark"),
    (0x115F, 0x1160, "Hangul filler"),
    (0x17B4, 0x17B5, "Khmer inherent vowel"),
    (0x180B, 0x180F, "Mongolian variation selector or vowel separator"),
    (0x200B, 0x200B, "zero-width space"),
    (0x200C, 0x200C, "zero-width non-joiner"),
    (0x200D, 0x200D, "zero-width joiner"),
    (0x200E, 0x200E, "left-to-right mark"),
    (0x200F, 0x200F, "right-to-left mark"),
    (0x2028, 0x2028, "line separator"),
    (0x2029, 0x2029, "paragraph separator"),
    (0x202A, 0x202A, "left-to-right embedding"),
    (0x202B, 0x202B, "right-to-left embedding"),
    (0x202C, 0x202C, "pop directional formatting"),
    (0x202D, 0x202D, "left-to-right override"),
    (0x202E, 0x202E, "right-to-left override"),
    (0x2060, 0x2060, "word joiner"),
    (0x2061, 0x2064, "invisible operator"),
    (0x2066, 0x2066, "left-to-right isolate"),
    (0x2067, 0x2067, "right-to-left isolate"),
    (0x2068, 0x2068, "first strong isolate"),
    (0x2069, 0x2069, "pop directional isolate"),
    (0x206A, 0x206F, "deprecated format character"),
    (0x3164, 0x3164, "Hangul filler"),
    (0xD800, 0xDFFF, "lone surrogate"),
    (0xFEFF, 0xFEFF, "zero-width no-break space (BOM)"),
    (0xFFA0, 0xFFA0, "halfwidth Hangul filler"),
    (0xFFF9, 0xFFFB, "interlinear annotation"),
    (0x1D173, 0x1D17A, "musical format character"),
    (0xE0000, 0xE007F, "tag character"),
    (0xE0100, 0xE01EF, "variation selector"),
)
_PATTERN = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi, _ in INVISIBLE_RANGES) + "]")


def chip(char: str) -> str:
    """`⟨U+XXXX⟩`: the marked glyph of one character."""
    return f"\u27e8U+{ord(char):04X}\u27e9"


def marked(text: str) -> str:
    """`text` with every character of `INVISIBLE_RANGES` as its chip (tab and newline kept)."""
    return _PATTERN.sub(lambda found: chip(found.group()), text)


def escape_json(value: Any) -> str:
    """JSON that is safe inside a <script> block: no `<`, `>`, `&`, line separators or lone surrogates appear
    raw (inside JSON strings they become \\u escapes; outside strings JSON has none), and NaN/inf become null."""
    text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return escape_surrogates(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
