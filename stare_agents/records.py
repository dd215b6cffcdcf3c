"""A run folder's `metrics.jsonl`: one JSON record per line, each with a `kind` ("rl", "sft", "eval", ...).

The trainer appends them (`stare_agents.train.trainer.RunLog`); the viewer, reports and tests read them here, so
that nothing but the CLI needs the training package to read a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stare_agents.jsonl import Unread, read_lines, report_unread


def read_records(
    path: str | Path, kind: str | None = None, *, unread: list[Unread] | None = None
) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (of one `kind`); [] without the file. A line that is not a JSON record
    (torn by a kill, or damaged) is skipped and reported: into `unread` when given, else as a warning."""
    path = Path(path)
    if not path.exists():
        return []
    values, problems = read_lines(path)
    problems += [
        Unread(str(path), number, "not a JSON object") for number, v in values if not isinstance(v, dict)
    ]
    report_unread(sorted(problems, key=lambda u: u.line or 0), unread, "metrics lines")
    return [v for _, v in values if isinstance(v, dict) and (kind is None or v.get("kind") == kind)]
