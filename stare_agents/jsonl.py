"""JSON as the project writes and reads it: finite numbers only, and one record per line.

    text = dumps(results, indent=2)             # a JSON file: no NaN or Infinity (strict parsers read it)
    line = dumps_line(record)                   # a JSON line: the same, and no raw line separator
    records, unread = read_lines(path)          # [(line number, value)], [Unread(path, line, reason)]
    report_unread(unread, sink)                 # into `sink` when given, else one warning naming them

A non-finite float is not a measurement: `finite` leaves it out (a mapping loses the key; a list keeps its
length, with null in its place), so that a figure that was not measured is absent, never `NaN` and never
another quantity under its name.

A JSON-lines text is split at "\\n" only. `str.splitlines()` also breaks at U+2028, U+2029 and U+0085 (and
\\r, \\v, \\f, \\x1c-\\x1e), which a JSON writer may leave raw inside a string. A line that does not parse is
never dropped without a word: the readers return it as `Unread` (file, line number, why) for the caller to
show, or warn.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("stare_agents.jsonl")

# Characters that end a line for str.splitlines() (and some JSON readers) but that JSON may leave raw in a
# string: escaped on write, so that one record is one line for every reader.
_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}
_SURROGATE = re.compile("[\ud800-\udfff]")
WARN_LISTED = 10  # unread lines a warning names one by one


def finite(value: Any) -> Any:
    """`value` without its non-finite floats: dropped from mappings, null in lists (positions are kept)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items() if not _non_finite(v)}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `finite(value)` with `allow_nan=False`: what every JSON file of the project is. With
    `ensure_ascii=False` a lone surrogate (JSON "\\udc80" read back) stays escaped: the text encodes as UTF-8."""
    text = json.dumps(finite(value), allow_nan=False, **kwargs)
    return text if kwargs.get("ensure_ascii", True) else escape_surrogates(text)


def escape_surrogates(json_text: str) -> str:
    """JSON text with each lone surrogate (possible only inside a string) as its \\u escape: the same value,
    encodable as UTF-8."""
    return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", json_text)


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` as "U+DC80" (JSON "\\udc80" read back); None when it has none."""
    found = _SURROGATE.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


def dumps_line(record: Any, **kwargs: Any) -> str:
    """One JSON line (no trailing newline): finite numbers, non-ASCII text kept, line separators escaped."""
    text = dumps(record, ensure_ascii=False, **kwargs)
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text


@dataclass(frozen=True)
class Unread:
    """What a reader could not read: a line of a file (`line`), or the rest of a damaged file (`line` None)."""

    path: str
    line: int | None
    reason: str
    torn: bool = False  # the last line, with no newline after it: its writer was interrupted mid-line

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.reason}"


def parse_lines(data: bytes, path: str | Path) -> tuple[list[tuple[int, Any]], list[Unread]]:
    """The JSON values of the lines of `data` (a JSON-lines file's bytes) with their line numbers, and the
    lines that are not JSON: a torn last line (no newline after it: its writer was killed mid-line), text that
    is not UTF-8, or not JSON. Blank lines are neither."""
    lines = data.split(b"\n")  # a b"\n" byte is never part of a longer UTF-8 character
    values: list[tuple[int, Any]] = []
    unread: list[Unread] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            values.append((number, json.loads(raw.decode("utf-8"))))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            torn = number == len(lines)
            if torn:
                reason = f"torn last line ({len(raw)} bytes, no newline after it: its writer was interrupted)"
            elif isinstance(error, UnicodeDecodeError):
                reason = f"not UTF-8 text ({error.reason} at byte {error.start})"
            else:
                reason = f"not JSON ({error.msg} at column {error.colno})"
            unread.append(Unread(str(path), number, reason, torn))
    return values, unread


def read_lines(path: str | Path) -> tuple[list[tuple[int, Any]], list[Unread]]:
    """`parse_lines` of a file."""
    return parse_lines(Path(path).read_bytes(), path)


def report_unread(unread: Sequence[Unread], sink: list[Unread] | None, what: str = "lines") -> None:
    """Hand `unread` to the caller's `sink`, or (without one) log one warning that counts and names them."""
    if sink is not None:
        sink.extend(unread)
    elif unread:
        logger.warning(unread_message(unread, what))


def unread_message(unread: Sequence[Unread], what: str = "lines") -> str:
    """'N lines could not be read and were skipped: FILE:LINE: why; ...' (the first `WARN_LISTED` named)."""
    listed = "; ".join(str(u) for u in unread[:WARN_LISTED])
    more = f"; and {len(unread) - WARN_LISTED} more" if len(unread) > WARN_LISTED else ""
    return f"{len(unread)} {what} could not be read and were skipped: {listed}{more}"
