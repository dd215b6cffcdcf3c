# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""The viewer as a researcher's workbench (issue 49, items 5-8) in headless Chromium, on a real run folder: the
tiny model trained by the trainer for three RL steps (STARE, and GRPO-ds from the same start with --compare) on
an environment whose rewards vary (tests/Coin-v0), with dynamic sampling (so some trajectories are dropped),
a held-out evaluation after every step and the samples of each evaluation kept.

* item 5: every trajectory with per-token learner figures is coloured; a folder where only some have them says
  so, and one where all have them (as the learner records them since issue 49) colours them all, Φ included;
* item 6: per-step histograms of entropy, surprisal and |mismatch| on log axes with the L+/L- cut-offs, a token
  finder (threshold, L+/L-, presets, a histogram bar) listing the matching tokens, across all steps too,
  trajectories sorted and filtered by their token statistics; counts equal the step files';
* item 7: the held-out tasks across training: each evaluation point with its logged accuracy, one task's
  samples at every point side by side with their grades and coloured tokens; a prompt drawn in two steps
  across them, and one drawn once with the reason;
* item 8: `stare-agents show RUN --against RUN/grpo-ds`: both runs' entropy curves, both arms' held-out points.

Every page makes no network request and runs no injected script."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser  # noqa: F401 (the browser fixture)
from test_viewer_research import alpha_of, open_trajectory
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.records import read_records
from stare_agents.rollout_log import heldout_points, read_rollouts, saved_steps, step_file, write_step
from stare_agents.viewer import compact, write_page

TESTS = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "rollout.sandbox=local",
    "env.id=tests/Coin-v0",
    "env.kwargs={}",
    "env.imports=[coin_env]",
    "sft.enabled=false",
    "rl.steps=3",
    "rl.prompts_per_step=8",
    "rl.dynamic_sampling=true",
    "eval.every=1",
    "eval.num_tasks=3",
]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """A real run folder (about 40 s): see the module docstring. Trained by the command line in its own
    process, as a user trains (and apart from the browser's event loop in this one)."""
    folder = tmp_path_factory.mktemp("workbench") / "run"
    environment = {
        **os.environ,
        "PYTHONPATH": str(TESTS / "train"),  # coin_env: the test environment the trainer tests use
        "STARE_ALLOW_LOCAL_SANDBOX": "1",  # rollout.sandbox=local: CoinEnv runs no code
        "OMP_NUM_THREADS": "1",
    }
    command = [str(Path(sys.executable).with_name("stare-agents")), "train", "--recipe", "tiny"]
    command += ["--out", str(folder), "--compare", "grpo-ds", *OVERRIDES]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def real_page(real_run: Path) -> Path:
    return write_page(real_run)


def rows_of(folder: Path, step: int) -> list[dict]:
    """A step's trajectories as the page holds them (`compact`)."""
    return [compact(s, i) for i, s in enumerate(read_rollouts(folder, step=step))]


def actions(row: dict, key: str) -> list[float]:
    return [v for v, bit in zip(row.get(key) or [], row["m"], strict=False) if bit == "1" and v is not None]


def open_step(view: Page, page: Path, step) -> None:
    view.page.goto(page.resolve().as_uri() + f"#step={step}")
    view.page.wait_for_selector("#trajectories")


def offline(view: Page) -> None:
    assert view.errors == [] and view.dialogs == []
    assert all(url.startswith("file://") for url in view.requests), view.requests


# ---- item 5: per-token statistics for every trajectory that has them ----
def test_the_run_is_what_the_tests_below_read(real_run: Path):
    assert saved_steps(real_run) == [0, 1, 2]
    statuses = {s.status for s in read_rollouts(real_run)}
    assert {"trained", "dropped"} <= statuses  # dynamic sampling dropped groups without reward variance
    assert heldout_points(real_run) == [
        "base",
        "rl-step-000001",
        "rl-step-000002",
        "rl",
        "rl-grpo-ds-step-000001",
        "rl-grpo-ds-step-000002",
        "rl-grpo-ds",
    ]
    assert saved_steps(real_run / "grpo-ds") == [0, 1, 2]


def test_every_trajectory_with_learner_figures_is_coloured_and_the_others_are_named(
    browser, real_run: Path, real_page: Path
):
    step = next(s for s in saved_steps(real_run) if any(r["st"] == "dropped" for r in rows_of(real_run, s)))
    rows = rows_of(real_run, step)
    with Page(browser, real_page) as view:
        open_step(view, real_page, step)
        scored = [r for r in rows if "d" in r]
        note = view.page.locator("#coverage-note")
        if len(scored) < len(rows):  # this trainer scores the trained trajectories; item 5's learner, all
            assert note.count() == 1
            assert f"for {len(scored)} of {len(rows)} trajectories" in note.text_content()
        else:
            assert note.count() == 0
        view.page.select_option("#f-mode", "entropy")
        sample = [r for r in rows if "h" in r][:3] + [r for r in rows if "h" not in r][:3]  # both kinds
        for row in sample:
            detail = open_trajectory(view, row["i"])
            spans = detail.locator("span.t")
            assert spans.count() == row["m"].count("1")
            if "h" in row:
                values = [float(v) for v in spans.evaluate_all("ns => ns.map(n => n.dataset.h)")]
                assert values == pytest.approx(actions(row, "h"), abs=1e-4)
                assert any(alpha_of(spans.nth(k))[1] > 0 for k in range(spans.count()))
            else:
                assert "per-token entropy is not saved for this trajectory" in detail.text_content()
                assert all(alpha_of(spans.nth(k))[1] == 0 for k in range(min(5, spans.count())))
            view.page.locator(f"#trajectories tr.traj[data-i='{row['i']}']").click()  # close it again
        offline(view)


def with_every_tokens_figures(folder: Path, step: int, out: Path) -> Path:
    """The step file as a learner that scores every sampled trajectory writes it (issue 49, item 5): learner
    log-probs, entropy and Φ for the dropped trajectories too (made from the rollout's own log-probs)."""
    saved = read_rollouts(folder, step=step)
    for s in saved:
        mask, rollout = s.trajectory.action_mask, s.trajectory.rollout_logprobs
        if s.learner_logprobs is None or s.status == "dropped":  # a known mismatch (the learner may score them)
            s.learner_logprobs = [lp - 0.2 if bit else 0.0 for lp, bit in zip(rollout, mask, strict=True)]
            s.learner_entropy = [0.5 if bit else 0.0 for bit in mask]
        s.learner_phi = [(-0.01 if k % 3 == 0 else 0.02) if bit else 0.0 for k, bit in enumerate(mask)]
    return write_step(out, step, saved)


def test_a_folder_with_every_tokens_figures_colours_every_trajectory(browser, real_run: Path, tmp_path: Path):
    step = next(s for s in saved_steps(real_run) if any(r["st"] == "dropped" for r in rows_of(real_run, s)))
    page = write_page(with_every_tokens_figures(real_run, step, tmp_path))
    with Page(browser, page) as view:
        view.page.wait_for_selector("#trajectories")
        assert view.page.locator("#coverage-note").count() == 0
        labels = view.page.locator("#f-mode option").all_text_contents()
        assert "Φ (entropy sensitivity)" in labels  # not "(not saved)"
        dropped = [r for r in rows_of(tmp_path, step) if r["st"] == "dropped"]
        assert dropped and all("d" in r and "phi" in r for r in dropped)
        for mode, colours in (
            ("mismatch", {(214, 39, 40)}),  # learner 0.2 below the rollout: red
            ("phi", {(140, 86, 75), (23, 190, 207)}),  # both signs
        ):
            view.page.select_option("#f-mode", mode)
            detail = open_trajectory(view, dropped[0]["i"])
            spans = detail.locator("span.t")
            seen = {alpha_of(spans.nth(k))[0] for k in range(spans.count())}
            assert seen == colours, (mode, seen)
            assert detail.locator(".field-note.notices").count() == 0
            view.page.locator(f"#trajectories tr.traj[data-i='{dropped[0]['i']}']").click()
        ticks = view.page.locator("#scale text.side").all_text_contents()
        assert ticks[0].startswith("Φ < 0") and ticks[1].startswith("Φ > 0")
        offline(view)


# ---- item 6: find tokens ----
def test_histograms_count_the_steps_tokens_and_draw_the_cut_offs(browser, real_run: Path, real_page: Path):
    rows = rows_of(real_run, 1)
    with Page(browser, real_page) as view:
        open_step(view, real_page, 1)
        for key in ("h", "s", "d"):
            bins = view.page.locator(f".hist-box[data-stat='{key}'] rect.bin")
            counts = [int(c) for c in bins.evaluate_all("ns => ns.map(n => n.dataset.count)")]
            assert sum(counts) == sum(len(actions(r, key)) for r in rows), key
            lows = [float(x) for x in bins.evaluate_all("ns => ns.map(n => n.dataset.lo)")]
            assert lows[0] == 0 and lows[1] == pytest.approx(1e-4) and lows[5] == pytest.approx(1e-3)
            for k, (lo, count) in enumerate(zip(lows, counts, strict=True)):  # each bar counts its bin
                hi = lows[k + 1] if k + 1 < len(lows) else float("inf")
                inside = [v for r in rows for v in actions(r, key) if lo <= abs(v) < hi]
                assert count == len(inside), (key, lo)
        cuts = view.page.locator(".hist-box[data-stat='s'] line.cut")
        selected = [v for r in rows for v, sel in zip(r["s"], r["sel"] or "", strict=False) if sel == "+"]
        assert selected, "the STARE arm selected no L+ token: the test run changed"
        assert float(cuts.first.get_attribute("data-value")) == pytest.approx(min(selected))
        offline(view)


def test_the_token_finder_lists_exactly_the_matching_tokens(browser, real_run: Path, real_page: Path):
    rows = rows_of(real_run, 1)
    mismatches = sorted(abs(v) for r in rows for v in actions(r, "d"))
    threshold = mismatches[len(mismatches) // 2]  # about half the scored tokens above it
    expected = sorted(
        (
            (abs(v), r["i"], j)
            for r in rows
            for j, (v, bit) in enumerate(zip(r.get("d") or [], r["m"], strict=False))
            if bit == "1" and v is not None and abs(v) > threshold
        ),
        reverse=True,
    )
    with Page(browser, real_page) as view:
        open_step(view, real_page, 1)
        view.page.select_option("#t-stat", "d")
        view.page.fill("#t-val", str(threshold))
        view.page.locator("#t-val").dispatch_event("change")
        count = view.page.locator("#t-count").text_content()
        holding = {i for _, i, _ in expected}
        assert count.startswith(f"{len(expected):,} tokens in {len(holding)} trajectories")
        shown = view.page.locator("#tokens tr.tokrow").evaluate_all(
            "rs => rs.map(r => [Number(r.dataset.i), Number(r.dataset.j)])"
        )
        assert len(shown) == min(len(expected), 200)
        values = [
            abs(float(v)) for v in view.page.locator("#tokens tr.tokrow td:nth-child(10)").all_text_contents()
        ]
        assert values == sorted(values, reverse=True) and all(v > threshold for v in values)
        # the trajectory list holds the trajectories with a matching token, each with its count
        listed = view.page.locator("#trajectories tr.traj").evaluate_all(
            "rs => rs.map(r => Number(r.dataset.i))"
        )
        assert sorted(listed) == sorted(holding)
        # L+ tokens in one click: as many as the step's selection holds
        view.page.locator("button[data-preset='L+ tokens']").click()
        plus = sum(r["sel"].count("+") for r in rows if r["sel"])
        assert view.page.locator("#t-count").text_content().startswith(f"{plus:,} tokens")
        # a row opens its trajectory at the token
        first = view.page.locator("#tokens tr.tokrow").first
        i, j = first.get_attribute("data-i"), first.get_attribute("data-j")
        first.locator("td").nth(3).click()
        view.page.wait_for_selector(f".detail[data-i='{i}'] span.t.focus")
        assert view.page.locator("span.t.focus").get_attribute("data-j") == j
        offline(view)


def test_a_histogram_bar_sets_the_threshold_and_all_steps_are_searched(
    browser, real_run: Path, real_page: Path
):
    every = {s: rows_of(real_run, s) for s in saved_steps(real_run)}
    with Page(browser, real_page) as view:
        view.page.goto(real_page.resolve().as_uri() + "#tokens")
        view.page.wait_for_selector("#tokens-view")
        bins = view.page.locator(".hist-box[data-stat='s'] rect.bin")
        at = max(
            k for k, c in enumerate(bins.evaluate_all("ns => ns.map(n => Number(n.dataset.count))")) if c
        )
        low = float(bins.nth(at).get_attribute("data-lo"))
        bins.nth(at).dispatch_event("click")
        expected = [
            (s, r["i"]) for s, rows in every.items() for r in rows for v in actions(r, "s") if v >= low
        ]
        text = view.page.locator("#t-count").text_content()
        assert text.startswith(f"{len(expected):,} tokens in {len(set(expected))} trajectories of 3 steps"), (
            text
        )
        assert (
            view.page.locator("#t-stat").input_value() == "s"
            and view.page.locator("#t-op").input_value() == "≥"
        )
        steps = set(view.page.locator("#tokens tr.tokrow").evaluate_all("rs => rs.map(r => r.dataset.step)"))
        assert steps == {str(s) for s, _ in expected}
        offline(view)


def test_trajectories_sort_by_their_token_statistics(browser, real_run: Path, real_page: Path):
    rows = rows_of(real_run, 1)

    def order(key) -> list[int]:
        keyed = [(key(r), r["i"]) for r in rows]
        return [i for v, i in sorted(keyed, key=lambda x: (x[0] is None, -(x[0] or 0), x[1]))]

    with Page(browser, real_page) as view:
        open_step(view, real_page, 1)
        for sort, key in (
            ("d-desc", lambda r: max((abs(v) for v in actions(r, "d")), default=None)),
            ("h-desc", lambda r: max(actions(r, "h"), default=None)),
            ("plus-desc", lambda r: (r["sel"] or "").count("+")),
            ("minus-desc", lambda r: (r["sel"] or "").count("-")),
        ):
            view.page.select_option("#f-sort", sort)
            shown = view.page.locator("#trajectories tr.traj").evaluate_all(
                "rs => rs.map(r => Number(r.dataset.i))"
            )
            assert shown == order(key), sort
        offline(view)


# ---- item 7: across training ----
def test_held_out_tasks_side_by_side_at_every_evaluation_point(browser, real_run: Path, real_page: Path):
    records = read_records(real_run / "metrics.jsonl")
    logged = {r["point"]: r["accuracy"] for r in records if r.get("kind") == "eval"}
    with Page(browser, real_page) as view:
        view.page.goto(real_page.resolve().as_uri() + "#heldout")
        view.page.wait_for_selector("#heldout-view")
        points = view.page.locator("#heldout-points tbody tr")
        names = points.evaluate_all("rs => rs.map(r => r.dataset.point)")
        assert names == heldout_points(real_run)
        labels = points.locator("td:nth-child(1)").all_text_contents()
        assert labels == [
            "base",
            "RL step 1",
            "RL step 2",
            "RL end",
            "RL grpo-ds step 1",
            "RL grpo-ds step 2",
            "RL grpo-ds end",
        ]
        accuracy = dict(zip(names, points.locator("td:nth-child(2)").all_text_contents(), strict=True))
        shown = {p: float(v) for p, v in accuracy.items() if v != "-"}
        assert shown["base"] == pytest.approx(logged["base"], abs=5e-4)
        assert shown["rl"] == pytest.approx(logged["rl"], abs=5e-4)
        in_training = read_records(real_run / "metrics.jsonl", "rl")[0]["eval/accuracy"]
        assert shown["rl-step-000001"] == pytest.approx(in_training, abs=5e-4)
        arm = read_records(real_run / "grpo-ds" / "metrics.jsonl", "rl")[0]["eval/accuracy"]
        assert shown["rl-grpo-ds-step-000001"] == pytest.approx(arm, abs=5e-4)  # from the arm's own records
        samples = {p: read_rollouts(real_run / "heldout" / f"{p}.jsonl.gz") for p in names}
        tasks = view.page.locator("#heldout-tasks tr.htask")
        assert tasks.count() == 3
        task = tasks.first.get_attribute("data-task")
        marks = tasks.first.locator("td[data-point]").all_text_contents()
        assert marks == [
            "✓" if next(s for s in samples[p] if s.trajectory.task_id == task).trajectory.correct else "✗"
            for p in names
        ]
        tasks.first.locator("td").nth(1).click()
        view.page.wait_for_selector(".hcols")
        columns = view.page.locator(".hcol")
        assert columns.evaluate_all("cs => cs.map(c => c.dataset.point)") == names
        assert view.page.locator("#f-mode").input_value() == "surprisal"
        for k, point in enumerate(names):
            sample = next(s for s in samples[point] if s.trajectory.task_id == task)
            column = columns.nth(k)
            assert column.locator(".grading tr[data-key='correct'] td").text_content() == (
                "yes" if sample.trajectory.correct else "no"
            )
            spans = column.locator("span.t")
            assert spans.count() == sample.trajectory.num_action_tokens
            assert "".join(spans.all_text_contents()) == "".join(
                t for t, bit in zip(sample.tokens, sample.trajectory.action_mask, strict=True) if bit
            )
            assert any(alpha_of(spans.nth(j))[1] > 0 for j in range(spans.count()))  # coloured by surprisal
        assert view.page.locator("#h-next").count() == 1
        offline(view)


def test_a_prompt_across_steps_and_the_reason_when_it_was_drawn_once(
    browser, real_run: Path, real_page: Path
):
    steps_of: dict[str, set[int]] = {}
    for s in read_rollouts(real_run):
        steps_of.setdefault(s.prompt_text, set()).add(s.step)
    again = next(p for p, steps in steps_of.items() if len(steps) > 1)
    once = next(p for p, steps in steps_of.items() if len(steps) == 1)
    with Page(browser, real_page) as view:
        for prompt, drawn in ((again, steps_of[again]), (once, steps_of[once])):
            step = min(drawn)
            i = next(k for k, s in enumerate(read_rollouts(real_run, step=step)) if s.prompt_text == prompt)
            open_step(view, real_page, step)
            link = open_trajectory(view, i).locator("a.prompt-link")
            if len(drawn) > 1:
                assert link.text_content() == f"this prompt across steps ({len(drawn)} steps)"
            else:
                assert link.text_content() == "this prompt across steps (drawn in 1 step only: why?)"
            link.click()
            view.page.wait_for_selector("#prompt-view")
            rows = view.page.locator("#prompt-trajectories tr.traj")
            assert {int(s) for s in rows.evaluate_all("rs => rs.map(r => r.dataset.step)")} == drawn
            note = view.page.locator("#prompt-note")
            if len(drawn) > 1:
                assert note.count() == 0
            else:
                assert "drawn in one step only" in note.text_content()
                assert "env.train_seed + i" in note.text_content()
                assert note.locator("a").get_attribute("href") == "#heldout"
        offline(view)


def test_an_older_run_folder_shows_its_accuracies_and_says_samples_are_missing(
    browser, real_run: Path, tmp_path: Path
):
    old = tmp_path / "old"
    shutil.copytree(
        real_run, old, ignore=shutil.ignore_patterns("heldout", "checkpoints", "*model*", "grpo-ds")
    )
    for step in saved_steps(old):  # as an older trainer wrote them: no learner_phi key at all
        lines = gzip.decompress(step_file(old, step).read_bytes()).decode().splitlines()
        records = [json.loads(line) for line in lines]
        for record in records:
            record.pop("learner_phi")
        step_file(old, step).write_bytes(
            gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode())
        )
    with Page(browser, write_page(old)) as view:
        view.page.goto(view.page.url.split("#")[0] + "#heldout")
        view.page.wait_for_selector("#heldout-view")
        note = view.page.locator(".heldout-note").text_content()
        assert (
            "no held-out samples for base, RL step 1, RL step 2, RL end" in note and "accuracy only" in note
        )
        assert view.page.locator("#heldout-points tbody tr").count() >= 4
        assert view.page.locator("#heldout-tasks").count() == 0
        view.page.goto(view.page.url.split("#")[0] + "#step=1")
        view.page.wait_for_selector("#trajectories")
        labels = view.page.locator("#f-mode option").all_text_contents()
        assert "Φ (entropy sensitivity) (not saved)" in labels
        offline(view)


# ---- item 8: a run against a run ----
def test_show_against_overlays_the_curves_and_sets_the_held_out_tasks_side_by_side(
    browser, real_run: Path, tmp_path: Path
):
    out = tmp_path / "against.html"
    result = CliRunner().invoke(
        app, ["show", str(real_run), "--against", str(real_run / "grpo-ds"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    a = read_records(real_run / "metrics.jsonl", "rl")
    b = read_records(real_run / "grpo-ds" / "metrics.jsonl", "rl")
    with Page(browser, out) as view:
        curve = view.page.locator("#entropy-curve")

        def values(cls: str) -> list[float]:
            return curve.locator(f"circle.{cls}").evaluate_all("ns => ns.map(n => Number(n.dataset.value))")

        assert values("all") == pytest.approx([r["learner/entropy_all"] for r in a])
        assert values("all-b") == pytest.approx([r["learner/entropy_all"] for r in b])
        legends = curve.locator("text.legend").all_text_contents()
        assert (
            legends[0] == "run: all sampled trajectories"
            and legends[2] == "grpo-ds: all sampled trajectories"
        )
        assert "against grpo-ds" in view.page.locator("#nav").text_content()
        view.page.goto(out.resolve().as_uri() + "#heldout")
        view.page.wait_for_selector("#heldout-tasks")
        heads = view.page.locator("#heldout-tasks thead th").all_text_contents()
        assert heads[0] == "task" and "run · RL end" in heads and "run · RL grpo-ds end" in heads
        assert len(heads) == 1 + len(heldout_points(real_run))  # the arm's base is its parent's: shown once
        offline(view)
    # the arm shown first: its own points read "RL", the parent's base once
    page = write_page(real_run / "grpo-ds", tmp_path / "arm.html", against=real_run)
    with Page(browser, page) as view:
        view.page.goto(page.resolve().as_uri() + "#heldout")
        view.page.wait_for_selector("#heldout-points")
        labels = view.page.locator("#heldout-points td:nth-child(1)").all_text_contents()
        assert labels[:4] == [
            "grpo-ds · base",
            "grpo-ds · RL step 1",
            "grpo-ds · RL step 2",
            "grpo-ds · RL end",
        ]
        assert labels[4:] == ["run · RL step 1", "run · RL step 2", "run · RL end"]
        offline(view)
    bad = CliRunner().invoke(app, ["show", str(real_run), "--against", str(tmp_path / "nowhere")])
    assert bad.exit_code == 2 and "--against" in bad.output and "not a run folder" in bad.output
