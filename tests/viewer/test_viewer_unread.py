"""Every record that was written is shown or named (issue 30, item 1): a damaged step file (truncated gzip, a
file that is not gzip) is a notice naming the file beside the steps that read, a malformed line is named by
file and line in a warning and on the page, and a line separator inside a text never splits a record."""

from __future__ import annotations

import gzip
import json
import logging
import re
import secrets
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser, trajectory  # noqa: F401  (browser is a fixture)
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.rollout_log import SavedRollout, read_rollouts, step_file, write_step
from stare_agents.trajectory import write_jsonl
from stare_agents.viewer import build_page, write_page

SEPARATORS = "a\u2028b\u2029c\x85d"  # each one a line end for str.splitlines(), none for JSON lines


def meta(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="meta">(.*?)</script>', html, re.S)
    assert found is not None
    return json.loads(found.group(1))


def step_rollouts(step: int, count: int) -> list[SavedRollout]:
    """Rollouts that compress poorly (random prompts), so that half a file holds about half of them."""
    tokens = trajectory("g", 0, 1.0)[1]
    return [
        SavedRollout(step, trajectory(f"g{i}", 0, 1.0)[0], tokens=tokens, prompt_text=secrets.token_hex(500))
        for i in range(count)
    ]


@pytest.fixture
def damaged_run(tmp_path: Path) -> Path:
    """Step 0 whole; step 1 truncated mid-stream (its first rollouts still decompress); step 2 not gzip."""
    folder = tmp_path / "run"
    for step in (0, 1, 2):
        write_step(folder, step, step_rollouts(step, 40))
    data = step_file(folder, 1).read_bytes()
    step_file(folder, 1).write_bytes(data[: len(data) // 2])
    step_file(folder, 2).write_text("this is not gzip\n")
    records = [{"kind": "rl", "step": 0, "learner/entropy": 0.3}, {"kind": "rl", "step": 1}]
    lines = [json.dumps(records[0]), '{"kind": "rl", "step": 1, "learner/ent', json.dumps(records[1])]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_a_damaged_step_is_a_notice_beside_the_steps_that_read(damaged_run: Path, caplog):
    with caplog.at_level(logging.WARNING):
        data = meta(build_page(damaged_run))
    shown = {row["step"]: row["saved"] for row in data["overview"]}
    assert shown["0"] == 40 and 0 < shown["1"] < 40 and "2" not in shown
    notices = data["notices"]
    truncated = str(step_file(damaged_run, 1))
    assert any(n.startswith(truncated + ": damaged (truncated") for n in notices), notices
    assert any(n.startswith(f"{truncated}:{shown['1'] + 1}: torn last line") for n in notices), notices
    assert any(n.startswith(str(step_file(damaged_run, 2)) + ": damaged (not gzip") for n in notices), notices
    assert f"{damaged_run / 'metrics.jsonl'}:2: not JSON" in " ".join(notices)  # a malformed metrics line
    assert [r["step"] for r in data["curve"]] == [0, 1]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(n in warned for n in notices)  # and the same in the warning


def test_show_names_a_truncated_or_foreign_step_file_instead_of_aborting(damaged_run: Path, tmp_path: Path):
    result = CliRunner().invoke(app, ["show", str(damaged_run), "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    assert "Aborted" not in result.output and "Traceback" not in result.output
    assert "step-000001.jsonl.gz: damaged (truncated" in result.output
    assert "step-000002.jsonl.gz: damaged (not gzip" in result.output
    # a single file of which nothing reads is an error naming it, never "Aborted." or a traceback
    result = CliRunner().invoke(app, ["show", str(step_file(damaged_run, 2))])
    assert result.exit_code == 2
    assert "step-000002.jsonl.gz: nothing could be read" in result.output and "Traceback" not in result.output
    torn = tmp_path / "torn.jsonl.gz"
    torn.write_bytes(gzip.compress(b'{"step": 0, "traj')[:-4])
    result = CliRunner().invoke(app, ["show", str(torn)])
    assert result.exit_code == 2 and "torn.jsonl.gz" in result.output and "Aborted" not in result.output


def test_line_separators_inside_a_record_never_split_it(tmp_path: Path):
    trajectories = []
    for i in range(4):
        t, _ = trajectory(f"g{i}", 0, 1.0)
        t.turns[1].text = SEPARATORS
        trajectories.append(t)
    path = tmp_path / "trajectories.jsonl"
    write_jsonl(trajectories, path)
    assert "\u2028" not in path.read_text(encoding="utf-8")  # escaped on write
    # as an older writer (and any other JSON writer) may leave them: raw
    path.write_text("".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in trajectories))
    assert "\u2028" in path.read_text(encoding="utf-8")
    data = meta(build_page(path))
    assert data["overview"][0]["saved"] == 4 and data["notices"] == []
    assert [r.trajectory.turns[1].text for r in read_rollouts(path)] == [SEPARATORS] * 4


def test_a_malformed_line_is_named_in_a_warning_and_on_the_page(tmp_path: Path, caplog):
    t, _ = trajectory("g0", 0, 1.0)
    line = json.dumps(t.to_dict())
    path = tmp_path / "trajectories.jsonl"
    path.write_text("\n".join([line, "{not json", '["a list"]', line, line[:30]]))
    with caplog.at_level(logging.WARNING):
        data = meta(build_page(path))
    assert data["overview"][0]["saved"] == 2
    notices = data["notices"]
    assert [n.split(": ")[0] for n in notices] == [f"{path}:2", f"{path}:3", f"{path}:5"]
    assert "not JSON" in notices[0] and "not an eval sample or a trajectory" in notices[1]
    assert "torn last line" in notices[2]
    assert "3 lines or files could not be read" in caplog.text and f"{path}:2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert len(read_rollouts(path)) == 2  # the library reader warns the same way
    assert f"{path}:2: not JSON" in caplog.text
    path.write_text("{not json\n[1]\n")
    with pytest.raises(ValueError, match=r"trajectories\.jsonl: nothing could be read: .*:1: not JSON"):
        build_page(path)


def test_the_notices_are_on_the_page(browser, damaged_run: Path):  # noqa: F811
    view = Page(browser, write_page(damaged_run))
    try:
        notices = view.page.locator("#notices li")
        assert notices.count() == 4
        assert "step-000002.jsonl.gz: damaged (not gzip" in view.page.locator("#notices").text_content()
        assert view.page.locator("#overview tbody tr").count() == 2  # the steps that read
        assert view.errors == []
    finally:
        view.close()
