# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""The viewer's display cap (issue 30, item 5), in headless Chromium: an observation or a turn's text longer
than 4,000 characters, or a run of more than 2,000 action tokens, is drawn cut with a marker saying how much
is hidden and a "show all" button that draws the rest exactly (a 200,000-character line with a hostile tail,
shown as text); search still finds words past the cap, tokens drawn later are coloured by the current mode
and by a later switch, and the page's data keeps everything."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser  # noqa: F401 (the browser fixture)
from test_viewer_research import alpha_of, log_alpha, open_trajectory

from stare_agents import viewer
from stare_agents.rollout_log import SavedRollout, write_step
from stare_agents.trajectory import Trajectory, TurnRecord
from stare_agents.viewer import write_page

CHARS, TOKENS = 4000, 2000  # the documented caps (characters per text, action tokens per run)
RLO = "\u202e"
HOSTILE_END = "</textarea><script>alert(1)</script>" + RLO


def long_line(length: int, needle: str, at: int) -> str:
    """One line (no newline) of `length` characters: digits with `needle` at `at` and HOSTILE_END last. An
    astral character (two UTF-16 units) straddles the cap: the cut must not split it."""
    digits = ("0123456789" * (length // 10 + 1))[: CHARS - 1] + "\U0001f600"
    body = digits + ("abcdefghij" * (length // 10 + 1))
    body = body[:at] + needle + body[at + len(needle) :]
    return body[: length - len(HOSTILE_END)] + HOSTILE_END


OBSERVATION = long_line(200_000, " needle-past-cap ", 150_000)
TURN_TEXT = long_line(10_000, " text-needle ", 8_000)
LONG_RUN = 2500
ACTION_TOKENS = [f" w{k}" for k in range(LONG_RUN)]
ACTION_TOKENS[2300] = " zebra-past-cap"
SURPRISAL = [0.01, 0.1, 1.0, 3.0]  # token k's: SURPRISAL[k % 4]
ENTROPY = [0.02, 0.2, 2.0, 5.0]
LPLUS_AT = 2400  # the one amplified token, past the cap


def visible(text: str) -> str:
    """`text` as the page shows it: the right-to-left override as a marked glyph."""
    return text.replace(RLO, "\u27e8U+202E\u27e9")


def utf16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def rollout(tokens: list[str], mask: list[int], turns: list[TurnRecord], **saved) -> SavedRollout:
    t = Trajectory(
        prompt_ids=[1, 2],
        response_ids=list(range(10, 10 + len(tokens))),
        action_mask=mask,
        rollout_logprobs=[-SURPRISAL[k % 4] if bit else 0.0 for k, bit in enumerate(mask)],
        reward=1.0,
        num_turns=len(turns),
        stop_reason="answered",
        turns=turns,
        task_id=f"task-{len(tokens)}",
        group_id="g",
        sample_index=0,
        correct=True,
    )
    return SavedRollout(step=0, trajectory=t, tokens=tokens, prompt_text="prompt", **saved)


@pytest.fixture(scope="module")
def long_page(tmp_path_factory) -> Path:
    """Step 0: #0 a 200,000-character observation, #1 a run of 2,500 action tokens, #2 a short one."""
    tokens = ["Run", " it", OBSERVATION, "\\boxed{1}"]  # the observation: one token, drawn alone
    mask = [1, 1, 0, 1]
    obs = rollout(
        tokens,
        mask,
        [TurnRecord("Run it", 2, "stop", 1, ["ok"], OBSERVATION, 1), TurnRecord("\\boxed{1}", 1, "eos")],
        status="dropped",
    )
    n = LONG_RUN
    run = rollout(
        ACTION_TOKENS,
        [1] * n,
        [TurnRecord("".join(ACTION_TOKENS), n, "length")],
        advantage=0.5,
        learner_logprobs=[-SURPRISAL[k % 4] for k in range(n)],
        learner_entropy=[ENTROPY[k % 4] for k in range(n)],
        stare_weights=[1.1 if k == LPLUS_AT else 1.0 for k in range(n)],
        selection=[1 if k == LPLUS_AT else 0 for k in range(n)],
        gate_on=True,
    )
    short = rollout(["short", " answer"], [1, 1], [TurnRecord("short answer", 2, "eos")], status="dropped")
    folder = tmp_path_factory.mktemp("cap")
    return write_page(write_step(folder, 0, [obs, run, short]))


def open_page(view: Page) -> None:
    view.page.wait_for_selector("#trajectories")  # a single step opens directly


def shown_text(capped) -> str:
    """The text a `.capped` element draws, without its marker."""
    return capped.evaluate(
        "node => [...node.childNodes].filter(n => !(n.classList && n.classList.contains('cap-marker')))"
        ".map(n => n.textContent).join('')"
    )


def test_the_caps_are_the_documented_ones_and_the_data_keeps_everything(long_page: Path):
    assert (viewer.CAP_CHARS, viewer.CAP_TOKENS) == (CHARS, TOKENS)
    html = long_page.read_text(encoding="utf-8")
    meta = json.loads(re.search(r'id="meta">(.*?)</script>', html, re.S).group(1))
    assert meta["cap"] == {"chars": CHARS, "tokens": TOKENS}
    step = json.loads(re.search(r'id="step-0">(.*?)</script>', html, re.S).group(1))
    assert step[0]["tok"][2] == OBSERVATION and step[1]["tok"] == ACTION_TOKENS  # cut only when drawn
    assert "</textarea><script>alert(1)</script>" not in html  # escaped in the data block


def test_a_long_observation_is_cut_at_the_cap_and_show_all_draws_it_exactly(browser, long_page: Path):
    with Page(browser, long_page) as view:
        open_page(view)
        detail = open_trajectory(view, 0)
        capped = detail.locator(".obs .capped")
        assert capped.count() == 1
        # the cut stops before the astral character at the cap instead of splitting its surrogate pair
        shown = shown_text(capped)
        assert shown == OBSERVATION[: CHARS - 1] and utf16(shown) <= CHARS
        hidden = utf16(OBSERVATION) - (CHARS - 1)
        marker = capped.locator(".cap-marker")
        assert int(marker.get_attribute("data-hidden")) == hidden
        assert f"{hidden:,} more characters hidden" in marker.text_content()
        assert f"{utf16(OBSERVATION):,} in all" in marker.text_content()
        assert "needle-past-cap" not in detail.text_content() and "alert(1)" not in detail.text_content()
        marker.locator("button.show-all").click()
        assert capped.locator(".cap-marker").count() == 0
        # the 200,000-character line, literally: the hostile tail as text, U+202E as a marked glyph
        assert capped.text_content() == visible(OBSERVATION)
        assert capped.locator("span.ctl").count() == 1
        assert view.page.locator("script").count() == 4  # meta, prompts, the step, the viewer
        assert view.page.locator("textarea").count() == 0
        assert view.errors == [] and view.dialogs == []


def test_a_long_run_of_action_tokens_draws_the_first_and_the_rest_on_request(browser, long_page: Path):
    with Page(browser, long_page) as view:
        open_page(view)
        detail = open_trajectory(view, 1)
        spans = detail.locator("span.t")
        assert spans.count() == TOKENS
        assert spans.evaluate_all("ns => ns.map(n => Number(n.dataset.j))") == list(range(TOKENS))
        marker = detail.locator(".tokens .cap-marker")
        assert int(marker.get_attribute("data-hidden")) == LONG_RUN - TOKENS
        assert f"{LONG_RUN - TOKENS:,} more tokens hidden ({LONG_RUN:,} in all)" in marker.text_content()
        assert "zebra-past-cap" not in detail.text_content()
        # drawn while a colour mode is on: the later tokens take that mode's colour
        view.page.select_option("#f-mode", "surprisal")
        marker.locator("button.show-all").click()
        assert detail.locator(".cap-marker").count() == 0
        assert spans.count() == LONG_RUN
        assert spans.evaluate_all("ns => ns.map(n => Number(n.dataset.j))") == list(range(LONG_RUN))
        assert "".join(spans.all_text_contents()) == "".join(ACTION_TOKENS)
        late = detail.locator("span.t[data-j='2300']")
        assert late.text_content() == " zebra-past-cap"
        rgb, alpha = alpha_of(late)
        assert rgb == (255, 127, 14) and alpha == pytest.approx(log_alpha(SURPRISAL[0], 1e-3, 10), abs=0.005)
        # a switch after drawing recolours them too
        view.page.select_option("#f-mode", "entropy")
        for j in (2301, 2499):
            rgb, alpha = alpha_of(detail.locator(f"span.t[data-j='{j}']"))
            assert rgb == (148, 103, 189)
            assert alpha == pytest.approx(log_alpha(ENTROPY[j % 4], 1e-3, 10), abs=0.005), j
        view.page.select_option("#f-mode", "stare")
        amplified = detail.locator("span.t.lplus")
        assert amplified.count() == 1 and amplified.get_attribute("data-j") == str(LPLUS_AT)
        assert alpha_of(detail.locator("span.t[data-j='2300']"))[1] == 0
        assert view.errors == []


def test_search_finds_words_past_the_cap(browser, long_page: Path):
    with Page(browser, long_page) as view:
        open_page(view)
        for word, row in (("needle-past-cap", "0"), ("zebra-past-cap", "1"), ("alert(1)", "0")):
            view.page.fill("#f-q", word)
            assert view.rows() == 1, word
            assert view.page.locator("#trajectories tr.traj").get_attribute("data-i") == row
            # the match sits past the cap: not drawn until "show all"
            detail = open_trajectory(view, int(row))
            assert word not in detail.text_content() and detail.locator(".cap-marker").count() == 1
            detail.locator("button.show-all").click()
            assert word in detail.text_content()
        view.page.fill("#f-q", "")
        assert view.rows() == 3
        # a short trajectory has no marker
        assert open_trajectory(view, 2).locator(".cap-marker").count() == 0
        assert view.errors == [] and view.dialogs == []


def test_text_only_turns_are_capped_too(browser, tmp_path: Path):
    sample = {
        "benchmark": "arith",
        "problem_id": "p1",
        "sample_index": 0,
        "correct": False,
        "reward": 0.0,
        "failed": False,
        "stop_reason": "turn_limit",
        "num_turns": 1,
        "turns": [
            {
                "text": TURN_TEXT,
                "num_tokens": 3000,
                "finish_reason": "stop",
                "tool_calls": 1,
                "tool_statuses": ["ok"],
                "observation": OBSERVATION,
                "observation_tokens": 50_000,
            }
        ],
    }
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(sample) + "\n")
    with Page(browser, write_page(path)) as view:
        open_page(view)
        view.page.fill("#f-q", "text-needle")  # past the cap of the turn's text
        assert view.rows() == 1
        view.page.fill("#f-q", "needle-past-cap")  # past the cap of the observation
        assert view.rows() == 1
        detail = open_trajectory(view, 0)
        text, observation = detail.locator(".tokens .capped"), detail.locator(".obs .capped")
        for capped, full in ((text, TURN_TEXT), (observation, OBSERVATION)):
            assert shown_text(capped) == full[: CHARS - 1]
            hidden = int(capped.locator(".cap-marker").get_attribute("data-hidden"))
            assert hidden == utf16(full) - (CHARS - 1)
        assert "text-needle" not in detail.text_content()
        text.locator("button.show-all").click()
        assert text.text_content() == visible(TURN_TEXT)
        assert observation.locator(".cap-marker").count() == 1  # each text expands on its own
        observation.locator("button.show-all").click()
        assert observation.text_content() == visible(OBSERVATION)
        assert view.page.locator("script").count() == 4 and view.page.locator("textarea").count() == 0
        assert view.errors == [] and view.dialogs == []
