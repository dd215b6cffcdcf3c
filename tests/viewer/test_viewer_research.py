# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""The viewer for research use (issue 30, item 3), in headless Chromium: per-token entropy and learner/rollout
mismatch colourings on a numeric log or quantile scale, STARE's selection cut-off, bidi and zero-width
characters made visible, the entropy curve's axes and target band with the all-sampled entropy, search,
sorting, grading details, a link per trajectory, a prompt across steps; `--step` reading only its file,
prompts stored once, no stray `null` text node. Hostile text (in a prompt, a grade reason, the search box)
is shown as text and never run."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser  # noqa: F401 (the browser fixture)
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.rollout_log import SavedRollout, read_rollouts, step_file, write_step
from stare_agents.trajectory import Trajectory, TurnRecord
from stare_agents.viewer import build_page, escape_json, write_page

RLO, LRI = "\u202e", "\u2067"
BIDI_AND_ZERO_WIDTH = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F)] + [
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    "\ufeff",
]
PROMPT_A = f"<|im_start|>user\nWhat is 3+4? </script><script>window.pwned=3</script> {LRI}marker-A"
PROMPT_B = "<|im_start|>user\nplain prompt marker-B"
GRADE_REASON = f'mismatch "<img src=x onerror=window.pwned=4>" {RLO}evil'
SEARCH_PAYLOAD = "<img src=x onerror=window.pwned=5>"

# one trained trajectory's tokens: action tokens with known rollout and learner log-probs and entropies
HIDDEN_TOKEN = " a" + "".join(BIDI_AND_ZERO_WIDTH) + "b"  # every bidi control and zero-width character
TOKENS = [
    "Let",
    " me",
    " think",
    f"{RLO}1 # admin only",
    HIDDEN_TOKEN,
    "<|im_end|>",
    "\n<tool>",
    "out",
    "</tool>\n",
]
MASK = [1, 1, 1, 1, 1, 1, 0, 0, 0]
ROLLOUT_LP = [-0.001, -0.01, -0.1, -1.0, -3.0, -0.05, 0.0, 0.0, 0.0]
LEARNER_LP = [-0.0011, -0.012, -0.09, -1.5, -3.0, -0.0501, 0.0, 0.0, 0.0]
ENTROPY = [0.002, 0.02, 0.2, 2.0, 5.0, 0.05, 0.0, 0.0, 0.0]
# L+ (positive advantage): the two highest-surprisal tokens (1.5, 3.0 nats); L- (negative): the highest (3.0)
LPLUS = [0, 0, 0, 1, 1, 0, 0, 0, 0]
LMINUS = [0, 0, 0, 0, -1, 0, 0, 0, 0]
STEPS = (0, 1, 2)


def research_trajectory(
    group: str, index: int, reward: float, extra: list[str]
) -> tuple[Trajectory, list[str]]:
    tokens = TOKENS + extra + ["\\boxed{7}"]
    mask = MASK + [1] * (len(extra) + 1)
    logprobs = ROLLOUT_LP + [-0.5] * (len(extra) + 1)
    t = Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(10, 10 + len(tokens))),
        action_mask=mask,
        rollout_logprobs=logprobs,
        reward=reward,
        num_turns=2,
        stop_reason="answered",
        weight_version=1,
        turns=[
            TurnRecord("".join(TOKENS[:6]), 6, "stop", 1, ["ok"], "out", 3),
            TurnRecord("\\boxed{7}", 1, "eos"),
        ],
        info={"extracted": "7", "grade_reason": GRADE_REASON, "score_details": {"matched": reward > 0}},
        task_id=f"task-{group}",
        group_id=group,
        sample_index=index,
        correct=reward > 0,
    )
    return t, tokens


def step_rollouts(step: int) -> list[SavedRollout]:
    saved = []
    for group, prompt, rewards, trained in (
        ("gA", PROMPT_A, (1.0, 0.0), True),
        ("gB", PROMPT_B, (0.5, 0.25), False),
    ):
        for i, reward in enumerate(rewards):
            extra = [f" word-{group}{i}-s{step}"] + [" pad"] * (3 * i + (0 if trained else 6))
            t, tokens = research_trajectory(group, i, reward, extra)
            n = len(tokens)
            tail = n - len(TOKENS)
            sign = 1 if i == 0 else -1
            saved.append(
                SavedRollout(
                    step=step,
                    trajectory=t,
                    status="trained" if trained else "dropped",
                    advantage=0.5 * sign if trained else None,
                    learner_logprobs=LEARNER_LP + [-0.4] * tail if trained else None,
                    learner_entropy=ENTROPY + [0.7] * tail if trained else None,
                    stare_weights=(
                        [1.1 if v else 1.0 for v in LPLUS]
                        if sign > 0
                        else [0.9 if v else 1.0 for v in LMINUS]
                    )
                    + [1.0] * tail
                    if trained
                    else None,
                    selection=((LPLUS if sign > 0 else LMINUS) + [0] * tail) if trained else None,
                    gate_on=True if trained else None,
                    tokens=tokens,
                    prompt_text=prompt,
                )
            )
    return saved


@pytest.fixture(scope="module")
def research_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("research") / f"run{RLO}x"
    folder.mkdir()
    records = []
    for step, trained, everything in zip(STEPS, (0.45, 0.30, 0.25), (0.12, 0.15, 0.20), strict=True):
        write_step(folder, step, step_rollouts(step))
        records.append(
            {
                "kind": "rl",
                "step": step,
                "learner/entropy": trained,
                "learner/entropy_all": everything,
                "stare/target_entropy": 0.3,
                "stare/gate_on": 1.0,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.fixture(scope="module")
def research_page(research_run: Path) -> Path:
    return write_page(research_run)


def open_step(view: Page, page: Path, fragment: str = "step=1") -> None:
    view.page.goto(page.resolve().as_uri() + "#" + fragment)
    view.page.wait_for_selector("#trajectories")


def open_trajectory(view: Page, i: int):
    view.page.locator(f"#trajectories tr.traj[data-i='{i}']").click()
    return view.page.locator(f".detail[data-i='{i}']")


def alpha_of(span) -> tuple[tuple[int, int, int], float]:
    background = span.evaluate("node => getComputedStyle(node).backgroundColor")
    numbers = [float(x) for x in re.findall(r"[\d.]+", background)]
    if background.startswith("rgba(0, 0, 0, 0)") or len(numbers) == 3:
        return tuple(int(x) for x in numbers[:3]), 0.0 if background.startswith("rgba(0, 0, 0, 0)") else 1.0
    return tuple(int(x) for x in numbers[:3]), numbers[3]


def log_alpha(value: float, lo: float, hi: float) -> float:
    value = abs(value)
    if value <= 0:
        return 0.0
    return 0.9 * min(1.0, max(0.0, (math.log10(value) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))))


def ticks(view: Page) -> list[str]:
    return view.page.locator("#scale text.tick").all_text_contents()


def action_spans(detail):
    return [detail.locator("span.t").nth(k) for k in range(detail.locator("span.t").count())]


def test_entropy_and_mismatch_colour_tokens_on_a_numeric_log_scale(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        detail = open_trajectory(view, 0)
        saved = read_rollouts(research_page.parent, step=1)[0]
        actions = [j for j, bit in enumerate(saved.trajectory.action_mask) if bit]
        spans = action_spans(detail)
        assert [int(s.get_attribute("data-j")) for s in spans] == actions
        # entropy: purple, 0.001..10 nats over four decades; the scale shows its numbers
        view.page.select_option("#f-mode", "entropy")
        assert ticks(view) == ["0.001", "0.01", "0.1", "1", "10"]
        assert "log scale" in view.page.locator("#scale-box").text_content()
        for span, j in zip(spans, actions, strict=True):
            rgb, alpha = alpha_of(span)
            assert float(span.get_attribute("data-h")) == pytest.approx(saved.learner_entropy[j], abs=1e-4)
            assert rgb == (148, 103, 189) and alpha == pytest.approx(
                log_alpha(saved.learner_entropy[j], 1e-3, 10), abs=0.005
            ), j
        # mismatch: log pi_learner - log pi_rollout; blue where the learner gives more, red where less
        view.page.select_option("#f-mode", "mismatch")
        assert ticks(view) == ["-1", "-0.1", "-0.01", "-0.001", "±0.0001", "0.001", "0.01", "0.1", "1"]
        for span, j in zip(spans, actions, strict=True):
            d = saved.learner_logprobs[j] - saved.trajectory.rollout_logprobs[j]
            assert float(span.get_attribute("data-d")) == pytest.approx(d, abs=1e-5)
            rgb, alpha = alpha_of(span)
            assert alpha == pytest.approx(log_alpha(d, 1e-4, 1), abs=0.005), j
            if alpha > 0:
                assert rgb == ((31, 119, 180) if d > 0 else (214, 39, 40)), (j, d)
        # surprisal: the same log scale; 94% of a real run's tokens are below 0.3 nats and now show
        view.page.select_option("#f-mode", "surprisal")
        low = spans[actions.index(1)]  # 0.012 nats: invisible at 0.0014 alpha on the old linear scale to 8
        assert (
            alpha_of(low)[1] == pytest.approx(log_alpha(0.012, 1e-3, 10), abs=0.005)
            and alpha_of(low)[1] > 0.2
        )
        assert view.errors == []


def test_the_quantile_scale_ranks_tokens_within_the_step_and_labels_the_quantiles(
    browser, research_page: Path
):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        detail = open_trajectory(view, 0)
        view.page.select_option("#f-mode", "entropy")
        view.page.select_option("#f-scale", "quantile")
        values = sorted(
            h
            for s in read_rollouts(research_page.parent, step=1)
            if s.learner_entropy
            for h, bit in zip(s.learner_entropy, s.trajectory.action_mask, strict=True)
            if bit
        )
        labels = view.page.locator("#scale text.quantile").all_text_contents()
        assert labels == ["min", "p25", "p50", "p75", "p90", "p99", "max"]
        shown = [
            float(v)
            for v in view.page.locator("#scale text.tick").evaluate_all("ns => ns.map(n => n.dataset.value)")
        ]
        assert shown[0] == pytest.approx(values[0]) and shown[-1] == pytest.approx(values[-1])
        assert shown[2] == pytest.approx(values[round(0.5 * (len(values) - 1))])
        for span in action_spans(detail):
            h = float(span.get_attribute("data-h"))
            rank = (sum(v < h for v in values) + sum(v <= h for v in values)) / 2 / len(values)
            assert alpha_of(span)[1] == pytest.approx(0.9 * rank, abs=0.005)
        assert "quantile scale" in view.page.locator("#scale-box").text_content()
        assert view.errors == []


def test_a_missing_per_token_field_is_said_plainly(browser, tmp_path: Path):
    saved = step_rollouts(0)
    for s in saved:
        s.learner_entropy = None  # a run whose learner did not record entropies
    page = write_page(write_step(tmp_path, 0, saved))
    with Page(browser, page) as view:
        view.page.wait_for_selector("#trajectories")
        labels = view.page.locator("#f-mode option").all_text_contents()
        assert any(label.startswith("entropy") and "(not saved)" in label for label in labels), labels
        detail = open_trajectory(view, 0)
        view.page.select_option("#f-mode", "entropy")
        note = view.page.locator("#field-note")
        assert note.count() == 1 and "per-token entropy is not in these rollout files" in note.text_content()
        assert view.page.locator("#scale").count() == 0
        assert all(alpha_of(span)[1] == 0 for span in action_spans(detail))
        assert "not saved for this trajectory" in detail.locator(".field-note").text_content()
        # a dropped trajectory has no learner log-probs: its mismatch is said to be unknown, not drawn as 0
        view.page.select_option("#f-mode", "mismatch")
        dropped = open_trajectory(view, 2)
        assert (
            "no learner log-probs for this trajectory (status dropped)"
            in dropped.locator(".field-note").text_content()
        )
        assert view.errors == []


def test_staress_selection_cutoff_is_shown_per_step_and_trajectory(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        # L+ of the positive trajectory: 1.5 and 3.0 nats (cut-off 1.5); L- of the negative: 3.0
        cells = view.page.locator("#overview td.cut").all_text_contents()
        assert cells == ["s ≥ 1.500"] * 3
        text = view.page.locator("#cutoffs").text_content()
        assert (
            "L+ 2 tokens, cut-off surprisal ≥ 1.500" in text
            and "L- 1 tokens, cut-off surprisal ≥ 3.000" in text
        )
        detail = open_trajectory(view, 0)
        assert "L+ 2 tokens, cut-off surprisal ≥ 1.500" in detail.locator(".cut").text_content()
        assert (
            "L- 1 tokens, cut-off surprisal ≥ 3.000"
            in open_trajectory(view, 1).locator(".cut").text_content()
        )
        view.page.select_option("#f-mode", "surprisal")
        marks = view.page.locator("#scale line.cut").evaluate_all(
            "ns => ns.map(n => Number(n.dataset.value))"
        )
        assert marks == [1.5, 3.0]
        assert view.errors == []


def test_bidi_and_zero_width_characters_are_shown_as_marked_glyphs(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        detail = open_trajectory(view, 0)
        detail.locator("summary").click()
        text = view.page.locator("#app").text_content()
        assert not [c for c in BIDI_AND_ZERO_WIDTH if c in text], "a bidi or zero-width character left raw"
        token = detail.locator("span.t[data-j='3']")
        assert token.text_content() == "\u27e8U+202E\u27e91 # admin only"  # never "ylno nimda # 1"
        assert token.locator("span.ctl").get_attribute("title").startswith("U+202E right-to-left override")
        glyphs = detail.locator("span.t[data-j='4'] span.ctl").all_text_contents()
        assert glyphs == [f"\u27e8U+{ord(c):04X}\u27e9" for c in BIDI_AND_ZERO_WIDTH]
        assert detail.locator("span.t[data-j='4']").text_content() == " a" + "".join(glyphs) + "b"
        assert "\u27e8U+2067\u27e9marker-A" in detail.locator(".prompt").text_content()
        assert "\u27e8U+202E\u27e9evil" in detail.locator(".grading").text_content()
        # the page's title and heading (the run folder's name holds U+202E)
        assert RLO not in view.page.title() and "\u27e8U+202E\u27e9" in view.page.title()
        assert view.page.locator("h1 span.ctl").count() == 1
        assert view.errors == []


def test_the_entropy_curve_has_axes_the_target_band_and_both_entropies(browser, research_page: Path):
    with Page(browser, research_page) as view:
        curve = view.page.locator("#entropy-curve")
        assert curve.locator(".x-axis text.tick").all_text_contents() == ["0", "1", "2"]
        y_ticks = [float(t) for t in curve.locator(".y-axis text.tick").all_text_contents()]
        assert len(y_ticks) >= 3 and y_ticks[0] == 0 and y_ticks == sorted(y_ticks) and y_ticks[-1] >= 0.39
        labels = curve.locator("text.label").all_text_contents()
        assert labels == ["RL step", "entropy (nats)"]
        band = curve.locator("rect.target-band")
        assert float(band.get_attribute("data-low")) == pytest.approx(0.21)
        assert float(band.get_attribute("data-high")) == pytest.approx(0.39)
        assert curve.locator("line.target").count() == 1
        trained = curve.locator("circle.trained").evaluate_all("ns => ns.map(n => Number(n.dataset.value))")
        everything = curve.locator("circle.all").evaluate_all("ns => ns.map(n => Number(n.dataset.value))")
        assert trained == [0.45, 0.30, 0.25] and everything == [0.12, 0.15, 0.20]
        legends = curve.locator("text.legend").all_text_contents()
        assert legends == ["all sampled trajectories", "trained batch (the gate's input)"]
        # the band sits where its values are on the y axis: the 0.39 edge above the 0.21 edge
        top, height = float(band.get_attribute("y")), float(band.get_attribute("height"))
        assert height > 0 and top > 0
        assert view.errors == []


def test_a_run_without_the_all_sampled_entropy_says_it_was_not_logged(browser, tmp_path: Path):
    write_step(tmp_path, 0, step_rollouts(0))
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "rl", "step": 0, "learner/entropy": 0.4}) + "\n"
    )
    with Page(browser, write_page(tmp_path)) as view:
        legend = view.page.locator("#entropy-curve text.legend.all").text_content()
        assert legend == "all sampled trajectories: not logged"
        assert view.page.locator("#entropy-curve circle.all").count() == 0
        assert view.page.locator("#entropy-curve circle.trained").count() == 1


def test_search_finds_text_in_tokens_prompts_and_grading_and_takes_a_payload_literally(
    browser, research_page: Path
):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        view.page.fill("#f-q", "WORD-gB1-s1")  # one trajectory's own token, any case
        assert view.rows() == 1 and view.page.locator("#trajectories tr.traj").get_attribute("data-i") == "3"
        view.page.fill("#f-q", "marker-b")  # in the prompt
        assert view.rows() == 2
        view.page.fill("#f-q", "onerror=window.pwned=4")  # in the grade reason
        assert view.rows() == 4
        for payload, expected in ((SEARCH_PAYLOAD, 0), ("(.*[", 0), ("\\boxed{", 4), ("</script>", 2)):
            view.page.fill("#f-q", payload)  # a substring, never a pattern or markup
            assert view.rows() == expected, payload
        assert view.page.locator("#f-count").text_content() == "2 of 4 shown"  # prompt A holds </script>
        assert view.page.locator("#app img").count() == 0
        assert view.page.evaluate("typeof window.pwned") == "undefined"
        view.page.fill("#f-q", "")
        assert view.rows() == 4
        assert view.errors == [] and view.dialogs == []


def test_sorting_by_reward_advantage_and_length(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)

        def order() -> list[int]:
            return [
                int(i)
                for i in view.page.locator("#trajectories tr.traj").evaluate_all(
                    "rs => rs.map(r => r.dataset.i)"
                )
            ]

        # rewards 1.0, 0.0, 0.5, 0.25; advantages 0.5, -0.5, none, none; lengths 11, 14, 17, 20
        view.page.select_option("#f-sort", "r-desc")
        assert order() == [0, 2, 3, 1]
        view.page.select_option("#f-sort", "r-asc")
        assert order() == [1, 3, 2, 0]
        view.page.select_option("#f-sort", "a-desc")
        assert order() == [0, 1, 2, 3]  # no advantage (not trained): last
        view.page.select_option("#f-sort", "a-asc")
        assert order() == [1, 0, 2, 3]
        view.page.select_option("#f-sort", "n-desc")
        assert order() == [3, 2, 1, 0]
        lengths = [
            int(x) for x in view.page.locator("#trajectories tr.traj td:nth-child(9)").all_text_contents()
        ]
        assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) == 4
        view.page.select_option("#f-sort", "n-asc")
        assert order() == [0, 1, 2, 3]
        view.page.select_option("#f-sort", "")
        assert order() == [0, 1, 2, 3]
        assert view.errors == []


def test_grading_details_are_shown_as_text(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        grading = open_trajectory(view, 0).locator(".grading")
        assert grading.locator("tr[data-key='extracted'] td").text_content() == "7"
        assert grading.locator("tr[data-key='correct'] td").text_content() == "yes"
        reason = grading.locator("tr[data-key='grade_reason'] td").text_content()
        assert reason == 'mismatch "<img src=x onerror=window.pwned=4>" \u27e8U+202E\u27e9evil'
        assert json.loads(grading.locator("tr[data-key='score_details'] td").text_content()) == {
            "matched": True
        }
        assert (
            grading.locator("img").count() == 0 and view.page.evaluate("typeof window.pwned") == "undefined"
        )
        assert view.errors == [] and view.dialogs == []


def test_eval_samples_keep_their_grading_details(tmp_path: Path):
    sample = {
        "benchmark": "arith",
        "problem_id": "p1",
        "sample_index": 0,
        "correct": False,
        "reward": 0.0,
        "failed": False,
        "stop_reason": "answered",
        "num_turns": 1,
        "extracted": "8",
        "answer": "7",
        "grade_reason": "wrong <b>answer</b>",
        "turns": [{"text": "\\boxed{8}", "num_tokens": 4, "finish_reason": "eos"}],
    }
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(sample) + "\n")
    html = build_page(path)
    step = json.loads(re.search(r'id="step-samples">(.*?)</script>', html, re.S).group(1))
    assert step[0]["grade"] == {"extracted": "8", "answer": "7", "grade_reason": "wrong <b>answer</b>"}


def test_a_link_opens_its_trajectory(browser, research_page: Path, tmp_path: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page, "step=2&traj=3")
        detail = view.page.locator(".detail[data-i='3']")
        assert detail.count() == 1 and detail.is_visible()
        assert view.page.locator("#trajectories tr.traj.open").get_attribute("data-i") == "3"
        href = detail.locator("a.permalink").get_attribute("href")
        assert href == "#step=2&traj=3"
        # a link to a trajectory the current filters hide shows it (the filters are cleared)
        open_step(view, research_page, "step=1")
        view.page.select_option("#f-group", "gA")
        view.page.evaluate("location.hash = '#step=1&traj=2'")
        view.page.wait_for_selector(".detail[data-i='2']")
        assert view.page.locator("#f-group").input_value() == ""
        assert view.errors == []
    # past the first page of 100 rows
    many = []
    for n in range(250):
        t, tokens = research_trajectory(f"g{n}", 0, 0.0, [])
        many.append(SavedRollout(step=5, trajectory=t, status="dropped", tokens=tokens))
    page = write_page(write_step(tmp_path, 5, many))
    with Page(browser, page) as view:
        view.page.goto(page.resolve().as_uri() + "#step=5&traj=230")
        view.page.wait_for_selector(".detail[data-i='230']")
        assert view.rows() == 250  # the list grew past its first 100 rows to show it
        assert view.errors == []


def test_a_prompt_across_training_steps(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        detail = open_trajectory(view, 0)
        prompt_link = detail.locator("a.prompt-link")
        assert prompt_link.text_content() == "this prompt across steps (3 steps)"
        prompt_link.click()
        view.page.wait_for_selector("#prompt-view")
        assert view.page.locator("#prompt-steps tbody tr").count() == 3
        rows = view.page.locator("#prompt-trajectories tr.traj")
        assert rows.count() == 6  # 2 samples of prompt A in each of 3 steps
        steps = rows.evaluate_all("rs => rs.map(r => r.dataset.step)")
        assert steps == ["0", "0", "1", "1", "2", "2"]
        means = view.page.locator("#prompt-steps tbody tr td:nth-child(3)").all_text_contents()
        assert means == ["0.500"] * 3
        view.page.locator("#prompt-view summary").click()
        assert (
            "</script><script>window.pwned=3</script>"
            in view.page.locator("#prompt-view .prompt").text_content()
        )
        # a row opens its trajectory in place; its step link goes to the step
        rows.nth(4).click()
        assert view.page.locator("#prompt-trajectories .detail[data-i='0']").count() == 1
        view.page.locator("#prompt-trajectories tr.traj").nth(2).locator("a").click()
        view.page.wait_for_selector("#trajectories")
        assert view.page.locator(".detail[data-i='0']").count() == 1
        assert view.page.evaluate("typeof window.pwned") == "undefined" and view.errors == []


def test_no_stray_null_text_node_under_a_short_list(browser, research_page: Path):
    with Page(browser, research_page) as view:
        open_step(view, research_page)
        assert view.rows() == 4
        texts = view.page.evaluate(
            "[...document.getElementById('list').childNodes].filter(n => n.nodeType === 3).map(n => n.data)"
        )
        assert texts == []
        assert "null" not in view.page.locator("#app").inner_text()


def test_prompts_are_stored_once_in_the_page(research_run: Path):
    html = build_page(research_run)
    for prompt in (PROMPT_A, PROMPT_B):  # each in 2 samples x 3 steps
        assert html.count(escape_json(prompt)) == 1
    assert html.count(escape_json(TOKENS[3])) == 12  # token texts are per trajectory (4 x 3 steps)


def test_step_reads_only_the_file_it_shows(research_run: Path, tmp_path: Path, caplog, monkeypatch):
    import stare_agents.rollout_log as rollout_log

    folder = tmp_path / "run"
    for step in STEPS:
        write_step(folder, step, step_rollouts(step))
    (folder / "metrics.jsonl").write_text((research_run / "metrics.jsonl").read_text())
    for step in (0, 2):  # the other steps' files: garbage that would be a notice if they were read
        step_file(folder, step).write_bytes(b"\x1f\x8bnot a gzip stream at all" * 1000)
    opened: list[str] = []
    real = rollout_log.read_step_file
    monkeypatch.setattr(rollout_log, "read_step_file", lambda path: (opened.append(str(path)), real(path))[1])
    with caplog.at_level(logging.WARNING):
        html = build_page(folder, steps=[1])
    assert opened == [str(step_file(folder, 1))]
    meta = json.loads(re.search(r'id="meta">(.*?)</script>', html, re.S).group(1))
    assert meta["notices"] == [] and [row["step"] for row in meta["overview"]] == ["1"]
    assert "step-000000" not in caplog.text and "step-000002" not in caplog.text
    result = CliRunner().invoke(
        app, ["show", str(folder), "--step", "1", "--out", str(tmp_path / "one.html")]
    )
    assert result.exit_code == 0, result.output
    assert "step-000000" not in result.output and "step-000002" not in result.output
    result = CliRunner().invoke(app, ["show", str(folder), "--step", "7"])
    assert result.exit_code == 2 and "none of the steps [7]" in result.output and "0-2" in result.output
