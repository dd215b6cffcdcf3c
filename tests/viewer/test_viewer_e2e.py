"""End to end: the tiny recipe trains two RL steps, saves every trajectory with the learner's per-token
outputs, and `stare-agents show` renders the run in headless Chromium with the saved STARE weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser  # noqa: F401 (the browser fixture)
from typer.testing import CliRunner

from stare_agents.cli import app
from stare_agents.records import read_records
from stare_agents.rollout_log import read_rollouts, saved_steps
from stare_agents.train.config import load_config


@pytest.fixture(scope="module")
def tiny_run(tiny_two_step_run) -> Path:
    """The suite's two-step tiny run (tests/conftest.py). Target entropy 10: the gate is on every step, so
    STARE reweights tokens the page must show."""
    return tiny_two_step_run.folder


def test_a_training_run_saves_every_trajectory_with_the_learners_outputs(tiny_run: Path):
    assert saved_steps(tiny_run) == [0, 1]
    records = {r["step"]: r for r in read_records(tiny_run / "metrics.jsonl", "rl")}
    for step in (0, 1):
        saved = read_rollouts(tiny_run, step=step)
        assert len(saved) == 8  # tiny: 2 prompts x 4 samples, all trained (no dynamic sampling)
        trained = [s for s in saved if s.status == "trained"]
        assert len(trained) == records[step]["data/kept_trajectories"]
        for s in trained:
            n = len(s.trajectory.response_ids)
            assert len(s.learner_logprobs) == len(s.stare_weights) == len(s.tokens) == n
            assert s.gate_on is True and isinstance(s.advantage, float)
            for bit, lp, rollout_lp in zip(
                s.trajectory.action_mask, s.learner_logprobs, s.trajectory.rollout_logprobs, strict=True
            ):
                if not bit:
                    assert lp == 0.0 and rollout_lp == 0.0
        lplus = sum(w > 1 for s in trained for w in s.stare_weights)
        actions = sum(s.trajectory.num_action_tokens for s in trained)
        assert lplus == round(records[step]["stare/lplus_share"] * actions)
    assert read_records(tiny_run / "metrics.jsonl", "sft-step")  # SFT loss per optimiser step


def test_show_renders_the_run(tiny_run: Path, browser):  # noqa: F811
    result = CliRunner().invoke(app, ["show", str(tiny_run)])
    assert result.exit_code == 0, result.output
    page_path = Path(result.output.strip().splitlines()[-1])
    assert page_path == tiny_run / "rollouts.html"
    meta = json.loads(page_path.read_text().split('id="meta">', 1)[1].split("</script>", 1)[0])
    target = load_config(path=tiny_run / "config.yaml").algorithm().stare.target_entropy
    assert meta["target"] == target and all(r["target"] == target for r in meta["overview"])
    view = Page(browser, page_path)
    try:
        assert view.page.locator("#overview tbody tr").count() == 2
        for step in (0, 1):  # the colours of the most reweighted trajectory of each step, as saved
            view.page.goto(page_path.resolve().as_uri() + f"#step={step}")
            view.page.wait_for_selector("#trajectories")
            assert view.rows() == 8
            saved = read_rollouts(tiny_run, step=step)
            chosen = max(range(len(saved)), key=lambda i: sum(w > 1 for w in saved[i].stare_weights or []))
            view.page.locator(f"#trajectories tr.traj[data-i='{chosen}']").click()
            spans = view.page.locator(f".detail[data-i='{chosen}'] span.t")
            weights = saved[chosen].stare_weights or [1.0] * len(saved[chosen].tokens)
            assert spans.count() == saved[chosen].trajectory.num_action_tokens
            for k in range(spans.count()):
                j = int(spans.nth(k).get_attribute("data-j"))
                assert ("lplus" in spans.nth(k).get_attribute("class").split()) == (weights[j] > 1)
        assert view.errors == []
    finally:
        view.close()
    bad = CliRunner().invoke(app, ["show", str(tiny_run / "missing")])
    assert bad.exit_code == 2 and "no such run folder or file" in bad.output
