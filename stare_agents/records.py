"""A run folder's `metrics.jsonl`: one JSON record per line, each with a `kind` ("rl", "sft", "eval", ...).

The trainer appends them (`stare_agents.train.trainer.RunLog`); the viewer, reports and tests read them here, so
that nothing but the CLI needs the training package to read a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (of one `kind`), skipping a line torn by a kill; [] without the file."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and (kind is None or record.get("kind") == kind):
            out.append(record)
    return out
