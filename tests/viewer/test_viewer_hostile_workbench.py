# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""Issue 49's new views given hostile or damaged input, in headless Chromium: held-out samples whose task id and
text hold markup and bidi controls, a held-out file that is not gzip, one whose name no trainer writes, an
accuracy that is NaN; the token finder given a payload as its threshold; trajectories sorted and filtered by tool
errors and by their share of Φ < 0 tokens (hand-made figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_viewer_browser import HOSTILE_OUTPUT, Page, browser, trajectory  # noqa: F401 (the browser fixture)
from test_viewer_research import open_trajectory

from stare_agents.rollout_log import HELDOUT_DIR, SavedRollout, write_rollouts, write_step
from stare_agents.viewer import write_page

TASK = '</script><img src=x onerror="window.pwned=1">\u202eksat'


def evaluated(task: str, correct: bool, index: int = 0) -> SavedRollout:
    t, tokens = trajectory("g", index, float(correct))
    t.task_id, t.correct = task, correct
    t.info = {"extracted": "7" if correct else "8", "answer": "7", "grade_reason": HOSTILE_OUTPUT}
    return SavedRollout(0, t, status="evaluated", tokens=tokens, prompt_text="held-out " + TASK)


def statuses(i: int, tools: list[str], phi: list[float] | None) -> SavedRollout:
    t, tokens = trajectory("g", i, 0.0)
    t.turns[0].tool_statuses = tools
    t.turns[0].tool_calls = len(tools)
    n = len(tokens)
    return SavedRollout(
        1,
        t,
        status="dropped",
        tokens=tokens,
        learner_phi=(phi + [0.0] * (n - len(phi))) if phi is not None else None,
    )


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile") / "run<b>"
    # Φ per action token (mask 1,1,1,1,1,0,0,0,1): shares of Φ < 0 over the 6 action tokens 0, 2/6, 6/6, none
    write_step(
        folder,
        1,
        [
            statuses(0, ["ok"], [0.1] * 9),
            statuses(1, ["error", "timeout", "killed"], [-0.1, 0.2, -0.3, 0.1, 0.1, 0, 0, 0, 0.1]),
            statuses(2, ["timeout"], [-0.1] * 9),
            statuses(3, [], None),
        ],
    )
    heldout = folder / HELDOUT_DIR
    write_rollouts(heldout / "base.jsonl.gz", [evaluated(TASK, False), evaluated("plain", False, 1)])
    write_rollouts(heldout / "rl.jsonl.gz", [evaluated(TASK, True), evaluated("plain", False, 1)])
    write_rollouts(heldout / "odd name!.jsonl.gz", [evaluated(TASK, True)])  # no trainer writes this name
    (heldout / "sft.jsonl.gz").write_text("not gzip at all")
    records = [
        {"kind": "eval", "point": "base", "accuracy": 0.0},
        {"kind": "eval", "point": "rl", "accuracy": float("nan")},  # written by a non-strict writer
        {"kind": "rl", "step": 1, "learner/entropy": 0.3},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_hostile_and_damaged_held_out_samples_are_shown_as_text_or_named(browser, hostile_run: Path):
    page = write_page(hostile_run)
    html = page.read_text(encoding="utf-8")
    assert "</script><img" not in html and "NaN" not in html
    with Page(browser, page) as view:
        view.page.goto(page.resolve().as_uri() + "#heldout")
        view.page.wait_for_selector("#heldout-tasks")
        notices = view.page.locator("#notices").text_content()
        assert "sft.jsonl.gz" in notices and "not gzip" in notices  # a damaged file is named, the rest shown
        points = view.page.locator("#heldout-points tbody tr")
        assert points.evaluate_all("rs => rs.map(r => r.dataset.point)") == ["base", "sft", "rl", "odd name!"]
        assert points.locator("td:nth-child(2)").all_text_contents() == [
            "0",
            "-",
            "-",
            "-",
        ]  # NaN is not a figure
        row = view.page.locator("#heldout-tasks tr.htask").first
        assert row.get_attribute("data-task") == TASK
        assert row.locator("td").first.text_content() == TASK.replace("\u202e", "\u27e8U+202E\u27e9")
        assert row.locator("td[data-point]").all_text_contents() == ["✗", "✓", "✓"]
        view.page.select_option("#h-filter", "gained")
        assert view.page.locator("#heldout-tasks tr.htask").count() == 1
        view.page.select_option("#h-filter", "never")
        assert view.page.locator("#heldout-tasks tr.htask").evaluate_all(
            "rs => rs.map(r => r.dataset.task)"
        ) == ["plain"]
        view.page.select_option("#h-filter", "")
        view.page.locator("#heldout-tasks tr.htask td").nth(1).click()
        view.page.wait_for_selector(".hcols")
        assert view.page.locator(".hcol").count() == 3
        assert "onerror" in view.page.locator(".hcol .grading").first.text_content()
        assert view.page.locator("#app img").count() == 0
        assert view.page.evaluate("typeof window.pwned") == "undefined"
        assert view.errors == [] and view.dialogs == []
        assert all(url.startswith("file://") for url in view.requests)


def test_tool_errors_and_the_phi_share_sort_and_filter(browser, hostile_run: Path):
    page = write_page(hostile_run)
    with Page(browser, page) as view:
        view.page.goto(page.resolve().as_uri() + "#step=1")
        view.page.wait_for_selector("#trajectories")

        def order() -> list[int]:
            return view.page.locator("#trajectories tr.traj").evaluate_all(
                "rs => rs.map(r => Number(r.dataset.i))"
            )

        view.page.select_option("#f-sort", "tools-desc")
        assert order() == [1, 2, 0, 3]  # 3 tool errors, 1, 0, 0
        cells = view.page.locator("#trajectories tr.traj td:nth-child(16)").all_text_contents()
        assert cells == ["3", "1", "0", "0"]
        view.page.select_option("#f-tool", "with errors")
        assert sorted(order()) == [1, 2]
        view.page.select_option("#f-tool", "none")
        assert sorted(order()) == [0, 3]
        view.page.select_option("#f-tool", "")
        view.page.select_option("#f-sort", "phi-desc")
        assert order() == [2, 1, 0, 3]  # 100%, 33%, 0%, none
        shares = view.page.locator("#trajectories tr.traj td:nth-child(15)").all_text_contents()
        assert shares == ["100%", "33%", "0%", "-"]
        # a threshold that is not a number filters nothing and breaks nothing
        view.page.select_option("#t-stat", "phi")
        for payload in (
            "<img src=x onerror=window.pwned=2>",
            "1e999",
            "-0",
        ):  # a number input sanitises the first
            view.page.locator("#t-val").evaluate("(node, value) => { node.value = value; }", payload)
            view.page.locator("#t-val").dispatch_event("change")
        view.page.select_option("#t-op", "<")
        assert (
            view.page.locator("#t-count").text_content().startswith("8 tokens in 2 trajectories")
        )  # Φ < -0: 2 + 6
        detail = open_trajectory(view, 1)
        assert detail.locator("span.t.match").count() == 2
        assert view.page.evaluate("typeof window.pwned") == "undefined"
        assert view.errors == [] and view.dialogs == []
