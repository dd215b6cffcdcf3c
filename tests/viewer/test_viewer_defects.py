# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""Issue 49's defects, each in headless Chromium: a lone surrogate anywhere in a record costs at most that
character (shown as a marked chip), never the page (item 1); tag characters, U+061C, U+00AD, C1 controls and
Hangul fillers are shown as marked code-point chips, in the page and the TensorBoard table (item 3); the STARE
legend keeps its swatches after any change of colouring, and the mismatch legend shows both of its colours
(item 4). Item 2 (a class as an environment's entry point) is pinned in tests/eval/test_protocol_entry_points.py
and by the README walk-through test."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser, trajectory  # noqa: F401 (the browser fixture)
from test_viewer_research import open_trajectory, step_rollouts
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.completions_table import completion_rows, markdown_cell, markdown_table, marked
from stare_agents.jsonl import dumps_line
from stare_agents.rollout_log import SavedRollout, step_file, write_step
from stare_agents.viewer import build_page, write_page

LONE = "\udc80"  # valid JSON ("\udc80"), not encodable as UTF-8


def chips(locator) -> list[str]:
    return locator.locator("span.ctl").all_text_contents()


# ---- item 1: one lone surrogate costs one character, never the page ----
@pytest.fixture
def surrogate_run(tmp_path: Path) -> Path:
    """Steps 0-2 whole; a step 3 made as the issue's repro: a line of step 2 with U+DC80 appended to its first
    token, written with json.dumps (which writes the escape "\\udc80")."""
    folder = tmp_path / "run"
    for step in range(3):
        write_step(folder, step, step_rollouts(step))
    line = gzip.decompress(step_file(folder, 2).read_bytes()).decode("utf-8").split("\n")[0]
    record = json.loads(line)
    record["step"] = 3
    record["tokens"][0] += LONE
    record["prompt_text"] += LONE
    record["trajectory"]["info"]["grade_reason"] = "odd " + LONE + "\ud800 end"
    text = json.dumps(record)
    assert "\\udc80" in text
    step_file(folder, 3).write_bytes(gzip.compress((text + "\n").encode("ascii")))
    return folder


def test_a_lone_surrogate_in_a_step_file_is_shown_as_a_chip_and_the_run_renders(
    browser, surrogate_run: Path, tmp_path: Path
):
    result = CliRunner().invoke(app, ["show", str(surrogate_run), "--out", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    page = tmp_path / "page.html"
    page.read_bytes().decode("utf-8")  # the page is UTF-8 throughout
    with Page(browser, page) as view:
        assert view.page.locator("#overview tbody tr").count() == 4  # every step, the odd one too
        view.page.goto(page.resolve().as_uri() + "#step=3")
        view.page.wait_for_selector("#trajectories")
        detail = open_trajectory(view, 0)
        token = detail.locator("span.t[data-j='0']")
        assert token.text_content() == "Let\u27e8U+DC80\u27e9"
        assert token.locator("span.ctl").get_attribute("title").startswith("U+DC80 lone surrogate")
        assert "odd \u27e8U+DC80\u27e9\u27e8U+D800\u27e9 end" in detail.locator(".grading").text_content()
        detail.locator("summary").click()
        assert detail.locator(".prompt").text_content().endswith("\u27e8U+DC80\u27e9")
        assert view.errors == []


def test_a_lone_surrogate_in_samples_and_trajectories_jsonl_is_shown(browser, tmp_path: Path):
    sample = {
        "benchmark": "arith",
        "problem_id": "p" + LONE,
        "sample_index": 0,
        "correct": False,
        "reward": 0.0,
        "stop_reason": "answered",
        "num_turns": 1,
        "grade_reason": "wrong " + LONE,
        "turns": [{"text": "\\boxed{" + LONE + "}", "num_tokens": 3, "finish_reason": "eos"}],
    }
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps(sample) + "\n")
    t, _ = trajectory("g" + LONE, 0, 1.0)
    t.turns[1].text = "answer " + LONE
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(json.dumps(t.to_dict()) + "\n")
    for path, expected in (
        (samples, "\\boxed{\u27e8U+DC80\u27e9}"),
        (trajectories, "answer \u27e8U+DC80\u27e9"),
    ):
        result = CliRunner().invoke(app, ["show", str(path)])
        assert result.exit_code == 0, result.output
        with Page(browser, Path(result.output.strip().splitlines()[-1])) as view:
            view.page.wait_for_selector("#trajectories")
            assert view.rows() == 1
            detail = open_trajectory(view, 0)
            assert expected in detail.text_content()
            assert view.errors == []


def test_every_jsonl_writer_survives_a_lone_surrogate(tmp_path: Path):
    line = dumps_line({"text": "a" + LONE + "b", LONE: 1})
    line.encode("utf-8")  # escaped, not raw
    assert json.loads(line) == {"text": "a" + LONE + "b", LONE: 1}
    t, tokens = trajectory("g", 0, 1.0)
    tokens[0] += LONE
    path = write_step(tmp_path, 0, [SavedRollout(0, t, tokens=tokens, prompt_text=LONE)])
    html = build_page(path)
    html.encode("utf-8")
    assert '"text":["\\udc80"]' in html  # the prompt table keeps the JSON escape; the script shows a chip


def test_the_completions_table_marks_a_lone_surrogate(tmp_path: Path):
    t, tokens = trajectory("g", 0, 1.0)
    tokens[0] += LONE
    rows = completion_rows(0, [SavedRollout(0, t, tokens=tokens, prompt_text="p" + LONE)])
    table = markdown_table(rows)
    table.encode("utf-8")
    assert markdown_cell("p\u27e8U+DC80\u27e9") in table and "\u27e8U+DC80\u27e9" in rows[0].completion
    from torch.utils.tensorboard import SummaryWriter

    from stare_agents.completions_table import log_completions

    with SummaryWriter(str(tmp_path)) as writer:  # TensorBoard's writer encodes the text: it must not raise
        log_completions(0, [SavedRollout(0, t, tokens=tokens, prompt_text=LONE)], writer=writer)


# ---- item 3: hidden characters are shown as code-point chips ----
TAG_TEXT = "".join(chr(0xE0000 + ord(c)) for c in "rm -rf")  # "rm -rf" in Unicode tag characters
HIDDEN = {
    "tag": "\U000e0001" + TAG_TEXT + "\U000e007f",
    "arabic letter mark": "\u061c",
    "soft hyphen": "\u00ad",
    "C1 controls": "\x85\x9b\x80\x9f",
    "Hangul filler": "\u3164",
    "line separator": "\u2028",
}
HIDDEN_TEXT = "x" + "".join(HIDDEN.values()) + "y"


def expected_chips(text: str) -> list[str]:
    return [f"\u27e8U+{ord(c):04X}\u27e9" for c in text if c not in "xy"]


def test_hidden_characters_are_marked_code_point_chips(browser, tmp_path: Path):
    t, tokens = trajectory("g", 0, 1.0)
    tokens[1] = "print(" + HIDDEN_TEXT  # an action token
    tokens[6] = "out " + HIDDEN_TEXT  # the observation
    saved = SavedRollout(0, t, tokens=tokens, prompt_text="prompt " + HIDDEN_TEXT)
    with Page(browser, write_page(write_step(tmp_path, 0, [saved]))) as view:
        view.page.wait_for_selector("#trajectories")
        detail = open_trajectory(view, 0)
        detail.locator("summary").click()
        wanted = expected_chips(HIDDEN_TEXT)
        assert chips(detail.locator("span.t[data-j='1']")) == wanted
        assert chips(detail.locator(".obs")) == wanted
        assert chips(detail.locator(".prompt")) == wanted
        text = view.page.locator("#app").text_content()
        assert not [c for c in HIDDEN_TEXT if c in text and c not in "xy"], "a hidden character left raw"
        tag = detail.locator("span.t[data-j='1'] span.ctl").nth(1)  # U+E0072, the tag "r"
        assert tag.text_content() == "\u27e8U+E0072\u27e9"
        assert tag.get_attribute("title").startswith("U+E0072 tag character (hidden 'r')")
        assert view.errors == []


def test_the_completions_table_marks_hidden_characters():
    assert marked(HIDDEN_TEXT) == "x" + "".join(expected_chips(HIDDEN_TEXT)) + "y"
    t, tokens = trajectory("g", 0, 1.0)
    tokens[1] = HIDDEN_TEXT
    rows = completion_rows(0, [SavedRollout(0, t, tokens=tokens, prompt_text=HIDDEN_TEXT)])
    for cell in (rows[0].prompt, rows[0].completion):
        assert not [c for c in HIDDEN_TEXT if c in cell and c not in "xy"]
    assert markdown_cell("".join(expected_chips(TAG_TEXT))) in markdown_table(rows)


# ---- item 4: the legends ----
def legend_swatches(view: Page) -> dict[str, str]:
    """The STARE legend's chips: class -> computed background."""
    return view.page.locator("#scale-box .legend span").evaluate_all(
        "ns => Object.fromEntries(ns.map(n => [n.className, getComputedStyle(n).backgroundColor]))"
    )


def test_the_stare_legend_keeps_its_swatches_after_any_change(browser, tmp_path: Path):
    page = write_page(write_step(tmp_path, 1, step_rollouts(1)))
    with Page(browser, page) as view:
        view.page.wait_for_selector("#trajectories")
        open_trajectory(view, 0)
        before = legend_swatches(view)
        assert set(before) == {"t lplus", "t lminus", "t would", "obs"}
        assert before["t lplus"] == "rgb(44, 160, 44)" and before["t lminus"] == "rgb(214, 39, 40)"
        for mode, scale in (
            ("surprisal", "log"),
            ("stare", "log"),
            ("entropy", "quantile"),
            ("stare", "quantile"),
        ):
            view.page.select_option("#f-scale", scale)
            view.page.select_option("#f-mode", mode)
        assert legend_swatches(view) == before
        assert view.errors == []


def test_the_mismatch_legend_shows_both_signs(browser, tmp_path: Path):
    page = write_page(write_step(tmp_path, 1, step_rollouts(1)))
    with Page(browser, page) as view:
        view.page.wait_for_selector("#trajectories")
        view.page.select_option("#f-mode", "mismatch")
        fills = view.page.locator("#scale rect.cell").evaluate_all(
            "ns => ns.map(n => n.getAttribute('fill'))"
        )
        assert any(f.startswith("rgba(31, 119, 180") for f in fills)  # learner above the sampler: blue
        assert any(f.startswith("rgba(214, 39, 40") for f in fills)  # below: red
        labels = view.page.locator("#scale text.side").all_text_contents()
        assert labels == ["learner < rollout", "learner > rollout"]
        ticks = view.page.locator("#scale text.tick").all_text_contents()
        assert ticks == ["-1", "-0.1", "-0.01", "-0.001", "±0.0001", "0.001", "0.01", "0.1", "1"]
        assert view.errors == []


def test_a_benchmark_row_with_a_lone_surrogate_is_named_before_eval_runs(tmp_path: Path):
    """`eval` reads benchmark files: a row whose text holds a lone surrogate is refused by row and field at
    load, before any model loads (a tokenizer cannot encode it), not with a bare codec error mid-run."""
    from stare_agents.eval.benchmarks import load_benchmark

    path = tmp_path / "bench.jsonl"
    rows = [{"id": "a", "problem": "1+1?", "answer": "2"}, {"id": "b", "problem": "x" + LONE, "answer": "3"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        ValueError, match=r"problem 'b' \(row 1\): its problem holds a lone surrogate U\+DC80"
    ):
        load_benchmark(str(path))


def test_compare_shows_names_with_a_lone_surrogate_as_chips(tmp_path: Path):
    """`compare` reads results.json files: a benchmark or model name holding a lone surrogate (or a bidi control)
    is shown as a chip in the table and the chart, instead of a traceback from the terminal or matplotlib."""
    import shutil

    from rich.console import Console

    from stare_agents.eval.report import compare_runs

    source = Path(__file__).resolve().parents[2] / "benchmarks/logs/long-bf16-s1/pass8"
    folder = tmp_path / "a"
    shutil.copytree(source, folder)
    results = json.loads((folder / "results.json").read_text())
    results["model"]["name"] = "model" + LONE
    name = next(iter(results["benchmarks"]))
    results["benchmarks"][name + LONE + "\u202e"] = results["benchmarks"].pop(name)
    (folder / "results.json").write_text(json.dumps(results))
    table, _ = compare_runs([folder], out=tmp_path / "chart.png")
    console = Console(file=io.StringIO(), width=200)
    console.print(table)
    text = console.file.getvalue()
    assert f"{name}\u27e8U+DC80\u27e9\u27e8U+202E\u27e9" in text and "model\u27e8U+DC80\u27e9" in text
    assert (tmp_path / "chart.png").stat().st_size > 0
