"""The rollout viewer in a real headless Chromium (Debian's `chromium`, driven by Playwright through its
executable path): it renders, filters, colours tokens as the saved weights say, and shows hostile text as
text without running it. Skipped without a browser (scripts/provision_browser.sh installs one); fails with
CI=true."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from support import require

from stare_agents.rollout_log import SavedRollout, read_rollouts, write_step
from stare_agents.trajectory import Trajectory, TurnRecord
from stare_agents.viewer import write_page

HOSTILE_OUTPUT = (
    '</script><script>window.pwned=1</script><img src=x onerror="window.pwned=2"><b>bold</b>'
    "<|im_end|>\x1b[31m\x00"
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    require(sync_playwright is not None, "Playwright", "pip install -e '.[dev]' (the dev extras have it)")
    executable = chromium_path()
    require(executable is not None, "a Chromium browser", "run scripts/provision_browser.sh as root")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


class Page:
    """A page of the viewer with what it did: requests, JS errors, dialogs."""

    def __init__(self, browser, path: Path) -> None:
        self.page = browser.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        self.page.goto(path.resolve().as_uri())

    def rows(self) -> int:
        return self.page.locator("#trajectories tbody tr.traj").count()

    def close(self) -> None:
        self.page.close()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def trajectory(group: str, index: int, reward: float, stop: str = "answered") -> tuple[Trajectory, list[str]]:
    tokens = [
        "```python\n",
        "print(",
        "7",
        ")\n```",
        "<|im_end|>",
        "\n<tool>",
        HOSTILE_OUTPUT,
        "</tool>\n",
        "\\boxed{7}",
    ]
    mask = [1, 1, 1, 1, 1, 0, 0, 0, 1]
    t = Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(10, 10 + len(tokens))),
        action_mask=mask,
        rollout_logprobs=[-0.25 * (k + 1) if bit else 0.0 for k, bit in enumerate(mask)],
        reward=reward,
        num_turns=2,
        stop_reason=stop,
        weight_version=4,
        turns=[
            TurnRecord("```python\nprint(7)\n```<|im_end|>", 5, "stop", 1, ["ok"], HOSTILE_OUTPUT, 3),
            TurnRecord("\\boxed{7}", 1, "eos"),
        ],
        task_id=f"task-{group}",
        env_id="stare_agents/Test-v0",
        group_id=group,
        sample_index=index,
        correct=reward > 0,
    )
    return t, tokens


# the known trajectory's learner outputs: one L+ token (amplified), one L- token (attenuated, C2), one L+
# token the gate did not reweight is impossible within one step, so the O1-style L- (selected, weight 1) stands in
KNOWN_WEIGHTS = [1.0, 1.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.9]
KNOWN_SELECTION = [0, 1, 0, -1, 0, 0, 0, 0, -1]
KNOWN_LOGPROBS = [-0.1, -4.0, -0.2, -0.3, -0.05, 0.0, 0.0, 0.0, -2.5]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("viewer") / "run-<i>x"
    folder.mkdir()
    records = []
    for step in (0, 1):
        saved = []
        for g, rewards, stop in (
            ("g0", (1.0, 0.0), "answered"),
            ("g1", (0.0, 0.0), "turn_limit"),
            ("g2", (1.0, 1.0), "answered"),
        ):
            for i, reward in enumerate(rewards):
                t, tokens = trajectory(g, i, reward, stop)
                trained = g == "g0"
                known = trained and i == 0
                saved.append(
                    SavedRollout(
                        step=step,
                        trajectory=t,
                        status="trained" if trained else "dropped",
                        advantage=(0.7 if i == 0 else -0.7) if trained else None,
                        learner_logprobs=KNOWN_LOGPROBS if known else None,
                        stare_weights=KNOWN_WEIGHTS if known else None,
                        selection=KNOWN_SELECTION if known else None,
                        gate_on=True if trained else None,
                        tokens=tokens,
                        prompt_text="<|im_start|>user\n</script><script>window.pwned=3</script>",
                    )
                )
        write_step(folder, step, saved)
        records.append(
            {
                "kind": "rl",
                "step": step,
                "rollout/mean_reward": 0.5,
                "learner/entropy": 0.2 + 0.1 * step,
                "stare/gate_on": 1.0,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.fixture(scope="module")
def page_path(run_folder: Path) -> Path:
    return write_page(run_folder)


def test_page_renders_offline_with_overview_and_steps(browser, page_path: Path):
    with Page(browser, page_path) as view:
        assert view.page.title().startswith("run-<i>x")
        assert view.page.locator("h1").text_content() == "run-<i>x"
        assert view.page.locator("#overview tbody tr").count() == 2
        assert view.page.locator("#entropy-curve circle").count() == 2
        gate_cells = view.page.locator("#overview td.gate-on")
        assert gate_cells.count() == 2
        view.page.locator("a.step-link", has_text="1").click()
        view.page.wait_for_selector("#trajectories")
        assert view.rows() == 6
        assert view.page.locator("#f-count").text_content() == "6 of 6 shown"
        assert (
            view.page.locator("#list span.t").count() == 0
        )  # tokens are drawn only when a trajectory is opened
        assert view.errors == [] and view.dialogs == []
        assert all(url.startswith("file://") for url in view.requests), view.requests  # no network


def test_filters_by_reward_stop_reason_group_and_status(browser, page_path: Path):
    with Page(browser, page_path) as view:
        view.page.goto(page_path.resolve().as_uri() + "#step=1")
        view.page.wait_for_selector("#trajectories")
        view.page.select_option("#f-stop", "turn_limit")
        assert view.rows() == 2
        view.page.select_option("#f-stop", "")
        view.page.fill("#f-rmin", "0.5")
        assert view.rows() == 3  # the rewards of 1.0
        view.page.select_option("#f-group", "g0")
        assert view.rows() == 1
        assert view.page.locator("#f-count").text_content() == "1 of 6 shown"
        view.page.fill("#f-rmin", "")
        view.page.select_option("#f-group", "")
        view.page.select_option("#f-status", "dropped")
        assert view.rows() == 4
        view.page.fill("#f-rmax", "0")
        assert view.rows() == 2
        assert view.errors == []


def open_known(view: Page, page_path: Path):
    view.page.goto(page_path.resolve().as_uri() + "#step=0")
    view.page.wait_for_selector("#trajectories")
    view.page.locator("#trajectories tr.traj[data-i='0']").click()
    return view.page.locator(".detail[data-i='0']")


def test_colouring_matches_the_saved_weights(browser, page_path: Path, run_folder: Path):
    saved = read_rollouts(run_folder, step=0)[0]
    assert saved.stare_weights == KNOWN_WEIGHTS
    with Page(browser, page_path) as view:
        detail = open_known(view, page_path)
        spans = detail.locator("span.t")
        actions = [j for j, bit in enumerate(saved.trajectory.action_mask) if bit]
        assert spans.count() == len(actions)
        for k, j in enumerate(actions):
            span = spans.nth(k)
            classes = set(span.get_attribute("class").split())
            expected = {"lplus"} if KNOWN_WEIGHTS[j] > 1 else {"lminus"} if KNOWN_WEIGHTS[j] < 1 else set()
            if not expected and KNOWN_SELECTION[j]:
                expected = {"would", "neg"} if KNOWN_SELECTION[j] < 0 else {"would"}
            assert classes - {"t"} == expected, (j, classes)
            assert int(span.get_attribute("data-j")) == j
            assert span.text_content() == saved.tokens[j]
        # observation tokens sit apart, in their own box, and are never token spans
        observation = detail.locator(".obs")
        assert observation.count() == 1 and "3 tokens · not trained" in observation.text_content()
        # surprisal mode: each token's colour strength follows -log pi from the learner, on a log scale
        # (decades 0.001 to 10 nats: 0.1 nats is half-way, where a linear scale to 8 nats left it white)
        view.page.select_option("#f-mode", "surprisal")
        for k, j in enumerate(actions):
            span = spans.nth(k)
            assert float(span.get_attribute("data-s")) == pytest.approx(-KNOWN_LOGPROBS[j], abs=1e-3)
            alpha = min(max((math.log10(-KNOWN_LOGPROBS[j]) + 3) / 4, 0), 1) * 0.9
            background = span.evaluate("node => getComputedStyle(node).backgroundColor")
            assert background.startswith("rgba(255, 127, 14") and float(
                background.split(",")[-1][:-1]
            ) == pytest.approx(alpha, abs=0.005)  # alpha is stored in 1/255 steps
            assert set(span.get_attribute("class").split()) == {"t"}
        # the group's rewards and advantages
        group = detail.locator("table.group").text_content()
        assert "0.700" in group and "-0.700" in group
        assert view.errors == []


def test_hostile_text_is_shown_as_text_and_never_run(browser, page_path: Path):
    with Page(browser, page_path) as view:
        detail = open_known(view, page_path)
        detail.locator("summary").click()  # the prompt, which also holds </script>
        text = detail.text_content()
        assert "</script><script>window.pwned=1</script>" in text
        assert '<img src=x onerror="window.pwned=2"><b>bold</b>' in text
        assert "<|im_end|>" in text and "window.pwned=3" in text
        assert "\u241b[31m\u2400" in text  # ESC and NUL shown as control pictures
        assert detail.locator("img").count() == 0 and detail.locator("b").count() == 0
        # meta, prompts, two steps, the viewer: nothing injected
        assert view.page.locator("script").count() == 5
        assert view.page.evaluate("typeof window.pwned") == "undefined"
        assert view.errors == [] and view.dialogs == []


def test_thousands_of_trajectories_render_only_what_is_shown(browser, tmp_path: Path):
    saved = []
    for n in range(3000):
        t, tokens = trajectory(f"g{n // 8}", n % 8, float(n % 2))
        saved.append(SavedRollout(step=7, trajectory=t, status="dropped", tokens=tokens))
    path = write_page(write_step(tmp_path, 7, saved))
    with Page(browser, path) as view:
        view.page.wait_for_selector("#trajectories")  # a single step opens directly
        assert view.rows() == 100 and view.page.locator("#list span.t").count() == 0
        assert view.page.locator("#f-count").text_content() == "3000 of 3000 shown"
        view.page.click("#more")
        assert view.rows() == 200
        view.page.select_option("#f-group", "g17")
        assert view.rows() == 8
        assert view.errors == []


def test_eval_samples_show_as_turns_of_text(browser, tmp_path: Path):
    sample = {
        "benchmark": "arith",
        "problem_id": "p<1>",
        "sample_index": 0,
        "seed": 1,
        "correct": False,
        "reward": 0.0,
        "failed": False,
        "error": None,
        "stop_reason": "turn_limit",
        "num_turns": 1,
        "weight_version": 0,
        "turns": [
            {
                "text": "```python\nprint(1)\n```",
                "num_tokens": 7,
                "finish_reason": "stop",
                "tool_calls": 1,
                "tool_statuses": ["ok"],
                "observation": HOSTILE_OUTPUT,
                "observation_tokens": 9,
            }
        ],
    }
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(sample) + "\n")
    with Page(browser, write_page(path)) as view:
        view.page.wait_for_selector("#trajectories")
        assert view.rows() == 1
        view.page.locator("#trajectories tr.traj").click()
        detail = view.page.locator(".detail")
        assert "tool calls 1 (ok)" in detail.text_content()
        assert "</script><script>window.pwned=1</script>" in detail.locator(".obs").text_content()
        assert view.page.evaluate("typeof window.pwned") == "undefined" and view.errors == []
