"""A line separator inside a sample's text (U+2028, U+2029, U+0085: line ends for `str.splitlines()`) round-
trips through the evaluation writer and is read back whole by every reader: the resume, the viewer's, and
the metrics reader; a torn line is named in a warning (issue 30, item 1). Every JSON file an evaluation
writes parses strictly: no NaN, no Infinity (item 2)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from test_eval_harness import ScriptedRunner, setup  # noqa: F401  (setup is a fixture)

from stare_agents.eval.harness import RUN_FILE, evaluate
from stare_agents.eval.report import RESULTS_FILE, SAMPLES_FILE, read_samples, write_results
from stare_agents.records import read_records
from stare_agents.rollout_log import read_rollouts

SEPARATORS = "one\u2028two\u2029three\x85four"


class SeparatorRunner(ScriptedRunner):
    """The scripted answers, with every line separator in the first turn's text."""

    @staticmethod
    def trajectory(spec):
        t = ScriptedRunner.trajectory(spec)
        t.turns[0].text = SEPARATORS + t.turns[0].text
        return t


def test_a_line_separator_in_a_sample_round_trips(setup: dict, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "run"
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=SeparatorRunner())
    path = out / SAMPLES_FILE
    raw = path.read_text(encoding="utf-8")
    assert not any(ch in raw for ch in "\u2028\u2029\x85")  # escaped: one record is one line for any reader
    samples = read_samples(path)
    assert len(samples) == 20 and all(s["text"].startswith(SEPARATORS) for s in samples)
    saved = read_rollouts(path)  # what `stare-agents show` reads
    assert len(saved) == 20
    assert all(s.trajectory.turns[0].text.startswith(SEPARATORS) for s in saved)
    # a file another writer left them raw in reads whole too, and resumes (nothing is redone)
    path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert len(read_rollouts(path)) == 20 and read_samples(path) == samples
    runner = SeparatorRunner()
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=runner)
    assert runner.calls == []


def test_a_torn_sample_line_is_named_in_a_warning(setup: dict, tmp_path: Path, caplog) -> None:  # noqa: F811
    out = tmp_path / "run"
    evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=ScriptedRunner())
    path = out / SAMPLES_FILE
    path.write_text(path.read_text(encoding="utf-8") + '{"benchmark": "alpha", "probl', encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert len(read_samples(path)) == 20
    assert f"{path}:21: torn last line" in caplog.text


def test_a_malformed_metrics_line_is_named_in_a_warning(tmp_path: Path, caplog) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = ['{"kind": "rl", "step": 0}', "{broken", '{"kind": "rl", "note": "a\u2028b", "step": 1}', "[]"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        records = read_records(path, "rl")
    assert [r["step"] for r in records] == [0, 1] and records[1]["note"] == "a\u2028b"
    assert "2 metrics lines could not be read" in caplog.text
    assert f"{path}:2: not JSON" in caplog.text and f"{path}:4: not a JSON object" in caplog.text


def strict(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as strict parsers (JavaScript, jq) do."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_evaluations_json_files_parse_strictly(setup: dict, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "run"
    results = evaluate(setup["model"], setup["benchmarks"], setup["config"], out=out, runner=ScriptedRunner())
    results["timing"]["not_measured_s"] = float("nan")
    results["settings"]["limit"] = float("inf")
    write_results(out, results)
    assert [strict(line) for line in (out / SAMPLES_FILE).read_text(encoding="utf-8").split("\n") if line]
    strict((out / RUN_FILE).read_text(encoding="utf-8"))
    written = strict((out / RESULTS_FILE).read_text(encoding="utf-8"))
    assert "not_measured_s" not in written["timing"] and "limit" not in written["settings"]
    assert "Infinity" not in (out / "results.md").read_text(encoding="utf-8")
