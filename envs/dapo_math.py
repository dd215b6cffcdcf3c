"""DAPO-Math-17k, the official STARE short-CoT training set, as the problem/answer JSONL the math environments read.

    stare-agents envs prepare-dapo-math --out data/dapo_math_17k.jsonl        # from the hub (needs network once)
    stare-agents envs prepare-dapo-math --source dapo.parquet --out data/dapo_math_17k.jsonl

The package ships no training data; the CoT recipes name the file this command writes (DAPO_FILE).

The hub dataset (BytedTsinghua-SIA/DAPO-Math-17k) holds each problem as a chat prompt wrapped in DAPO's own
instruction ("Solve the following math problem step by step. The last line of your response should be of the form
Answer: ..." and a closing reminder) and its answer in reward_model.ground_truth. Each output row is the problem
without that wrapper (the environment's template asks for \\boxed{} instead), its answer and an id; a problem
repeated in the source is written once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
DAPO_FILE = "dapo_math_17k.jsonl"  # the file name the recipes give it
PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def problem_text(row: Mapping[str, Any]) -> str:
    """The problem inside a DAPO row's prompt (its user message without DAPO's instruction)."""
    prompt = row["prompt"]
    text = prompt if isinstance(prompt, str) else next(m["content"] for m in prompt if m["role"] == "user")
    if text.startswith(PREFIX):
        text = text[len(PREFIX) :]
    if text.endswith(SUFFIX):
        text = text[: -len(SUFFIX)]
    return text.strip()


def convert(rows: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, str]]:
    """{"problem", "answer", "id"} for each distinct problem, in the source's order."""
    seen: set[str] = set()
    for index, row in enumerate(rows):
        problem = problem_text(row)
        if problem in seen:
            continue
        seen.add(problem)
        extra = row.get("extra_info") or {}
        yield {
            "problem": problem,
            "answer": str(row["reward_model"]["ground_truth"]),
            "id": str(extra.get("index", f"dapo-{index}")),
        }


def read(source: str) -> Iterable[Mapping[str, Any]]:
    path = Path(source)
    if path.suffix == ".jsonl":
        return (json.loads(line) for line in path.read_text().split("\n") if line.strip())
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    import datasets

    return datasets.load_dataset(source, split="train")


def prepare(source: str, out: Path) -> int:
    """Convert `source` (a .parquet/.jsonl file or a hub id) into `out`; returns the problems written. The file
    appears whole or not at all (written beside it, then renamed)."""
    import os

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    written = 0
    try:
        with partial.open("w", encoding="utf-8") as handle:
            for record in convert(read(source)):
                handle.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
                written += 1
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source", default=HUB_ID, help=f"a .parquet/.jsonl file or a hub id (default {HUB_ID})"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    written = prepare(args.source, args.out)
    print(f"{written} problems -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
