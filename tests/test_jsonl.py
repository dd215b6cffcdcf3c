"""JSON as the project writes and reads it (`stare_agents.jsonl`): lines split at "\\n" only, in every reader
(datasets and SFT conversations too); what does not parse is named, never dropped without a word."""

from __future__ import annotations

import json

from stare_agents.envs import TaskDataset
from stare_agents.jsonl import Unread, dumps, dumps_line, finite, parse_lines

SEPARATORS = "a\u2028b\u2029c\x85d\x1ce\x0bf\x0cg"  # line ends for str.splitlines(), none in a JSON line


def test_lines_split_at_newline_only_and_what_does_not_parse_is_named():
    lines = [
        json.dumps({"text": SEPARATORS}, ensure_ascii=False).encode("utf-8"),
        b"",
        b"{broken",
        json.dumps({"n": 1}).encode(),
        b"\xff\xfe",  # not UTF-8
        b'{"torn": ',  # no newline after it
    ]
    data = b"\n".join(lines)
    values, unread = parse_lines(data, "f.jsonl")
    assert values == [(1, {"text": SEPARATORS}), (4, {"n": 1})]
    assert [(u.line, u.torn) for u in unread] == [(3, False), (5, False), (6, True)]
    assert str(unread[0]).startswith("f.jsonl:3: not JSON (")
    assert str(unread[1]).startswith("f.jsonl:5: not UTF-8 text")
    assert str(unread[2]).startswith("f.jsonl:6: torn last line")
    assert str(Unread("f.jsonl.gz", None, "damaged")) == "f.jsonl.gz: damaged"


def test_a_task_file_with_line_separators_in_a_problem(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": str(i), "problem": f"{SEPARATORS} {i}?", "answer": str(i)} for i in range(3)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [t.problem for t in TaskDataset(path)] == [r["problem"] for r in rows]


def test_a_conversation_file_with_line_separators_in_a_message(tmp_path):
    from transformers import AutoTokenizer

    from stare_agents.models import prepare_model
    from stare_agents.train.traces import conversation_traces

    tokenizer = AutoTokenizer.from_pretrained(prepare_model("tiny", out=tmp_path / "tiny"))
    conversation = [
        {"role": "user", "content": f"What is 2 + 2? {SEPARATORS}"},
        {"role": "assistant", "content": f"\\boxed{{4}} {SEPARATORS}"},
    ]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps({"messages": conversation}, ensure_ascii=False) + "\n", encoding="utf-8")
    [trace] = conversation_traces(path, tokenizer, {tokenizer.eos_token_id})
    assert tokenizer.decode(trace.prompt_ids).count("\u2028") == 1


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as strict parsers (JavaScript, jq) do."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_what_is_not_finite_is_absent_never_nan():
    nan, inf = float("nan"), float("inf")
    record = {"a": nan, "b": [1.0, inf, 2], "c": {"d": -inf, "e": "x"}, "f": (nan,), "g": 0.5}
    assert strict(dumps(record)) == {"b": [1.0, None, 2], "c": {"e": "x"}, "f": [None], "g": 0.5}
    assert finite(record)["g"] == 0.5 and "a" not in finite(record)  # never replaced by another quantity
    line = dumps_line({"text": SEPARATORS, "x": nan})
    assert "\n" not in line and "\u2028" not in line and strict(line) == {"text": SEPARATORS}
