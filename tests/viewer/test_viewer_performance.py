# ruff: noqa: F811  (browser: the fixture imported from test_viewer_browser, a parameter of each test)
"""The viewer's size and speed with every token's statistics (issue 49): a default-job-sized step (the
smollm2-arith recipe: up to 3 refill rounds of 8 prompts x 4 samples = 96 trajectories of up to 320 response
tokens, every one with learner log-probs, entropy, Φ, STARE weights and selection, as the learner records them
since issue 49) stays under 3 MB gzipped and its page paints in under 1 s; a step whose page block is 20 MB and a
2 MB tool output stay responsive (each view drawn within seconds, not minutes). The page makes no network
request. Figures are printed (pytest -s) for docs/viewer.md; bounds are loose where the machine's load decides."""

from __future__ import annotations

import dataclasses
import gzip
import random
import time
from pathlib import Path

import pytest
from test_viewer_browser import Page, browser  # noqa: F401 (the browser fixture)

from stare_agents.rollout_log import SavedRollout, write_step
from stare_agents.trajectory import Trajectory, TurnRecord
from stare_agents.viewer import write_page

WORDS = [
    " the",
    " 12",
    "print",
    "(",
    ")",
    " *",
    " 7",
    "```",
    "python",
    "\n",
    " answer",
    " is",
    "\\boxed{",
    "}",
]


def rollout(rng: random.Random, i: int, length: int, *, observation: str | None = None) -> SavedRollout:
    """A trajectory of `length` response tokens: three turns of actions with two observations between them,
    every token's learner figures (rounded as RolloutLog writes them: 5 decimals)."""
    cut1, cut2 = int(length * 0.4), int(length * 0.8)
    mask = [0 if cut1 <= k < cut1 + 30 or cut2 <= k < cut2 + 30 else 1 for k in range(length)]
    tokens = [rng.choice(WORDS) for _ in range(length)]
    if observation is not None:
        tokens[cut1] = observation
    rollout_lp = [round(-rng.expovariate(3.0), 5) if bit else 0.0 for bit in mask]
    learner = [
        round(lp + rng.gauss(0, 0.05), 5) if bit else 0.0 for lp, bit in zip(rollout_lp, mask, strict=True)
    ]
    selection = [(1 if i % 2 == 0 else -1) if bit and rng.random() < 0.1 else 0 for bit in mask]
    t = Trajectory(
        prompt_ids=[1, 2, 3],
        response_ids=list(range(length)),
        action_mask=mask,
        rollout_logprobs=rollout_lp,
        reward=float(i % 2),
        num_turns=3,
        stop_reason="answered",
        weight_version=3,
        turns=[TurnRecord("", cut1, "stop", 1, ["ok"], "", 30) for _ in range(2)]
        + [TurnRecord("", 40, "eos")],
        task_id=f"arith-{i // 4}",
        group_id=str(i // 4),
        sample_index=i % 4,
        correct=bool(i % 2),
        info={"extracted": "7", "answer": "7", "grade_reason": "correct"},
    )
    return SavedRollout(
        step=5,
        trajectory=t,
        status="trained" if i < 32 else "dropped",
        advantage=0.5 if i % 2 else -0.5,
        learner_logprobs=learner,
        learner_entropy=[round(rng.expovariate(4.0), 5) if bit else 0.0 for bit in mask],
        learner_phi=[round(rng.gauss(0, 0.05), 5) if bit else 0.0 for bit in mask],
        stare_weights=[1.1 if s > 0 else 0.9 if s < 0 else 1.0 for s in selection],
        selection=selection,
        gate_on=True,
        tokens=tokens,
        prompt_text=f"<|im_start|>user\nCompute {i // 4} x 7.<|im_end|>\n<|im_start|>assistant\n",
    )


def paint(browser, page: Path, fragment: str, ready: str) -> tuple[float, float, Page]:
    """(first contentful paint, seconds until `ready` is drawn) of `page#fragment`."""
    view = Page(browser, page)  # opens the overview
    started = time.perf_counter()
    view.page.goto(page.resolve().as_uri() + fragment)
    view.page.reload()
    view.page.wait_for_selector(ready)
    drawn = time.perf_counter() - started
    fcp = view.page.evaluate(
        "performance.getEntriesByName('first-contentful-paint').map(e => e.startTime)[0] / 1000"
    )
    return fcp, drawn, view


def test_a_default_job_sized_step_with_every_tokens_figures_is_small_and_paints_fast(browser, tmp_path: Path):
    rng = random.Random(0)
    step = write_step(tmp_path, 5, [rollout(rng, i, 320) for i in range(96)])
    size = step.stat().st_size
    page = write_page(tmp_path)
    page_gz = len(gzip.compress(page.read_bytes()))
    fcp, drawn, view = paint(browser, page, "#step=5", "#trajectories")
    try:
        print(
            f"\ndefault-sized step: {size / 1e6:.2f} MB gzipped; page {page.stat().st_size / 1e6:.2f} MB "
            f"({page_gz / 1e6:.2f} MB gzipped); first paint {fcp:.3f} s, step view drawn {drawn:.3f} s"
        )
        assert size < 3e6
        assert fcp < 1.0
        assert view.page.locator(".hist-box[data-stat='d'] rect.bin").count() > 0
        assert view.errors == [] and all(url.startswith("file://") for url in view.requests)
    finally:
        view.close()


def copies(templates: list[SavedRollout], count: int) -> list[SavedRollout]:
    """`count` trajectories made from a few templates (each its own group and task): quick to make."""
    out = []
    for i in range(count):
        template = templates[i % len(templates)]
        t = dataclasses.replace(
            template.trajectory, group_id=str(i // 4), task_id=f"arith-{i // 4}", sample_index=i % 4
        )
        out.append(dataclasses.replace(template, trajectory=t))
    return out


@pytest.mark.slow  # a 20 MB step is made, written, read and drawn: about a minute on a loaded 2-core machine
@pytest.mark.timeout(600)
def test_a_20_mb_step_and_a_2_mb_tool_output_stay_responsive(browser, tmp_path: Path):
    rng = random.Random(1)
    huge = "".join(rng.choice("abcdefghij \n") for _ in range(2_000_000))
    templates = [rollout(rng, i, 320) for i in range(1, 17)]
    saved = [rollout(rng, 0, 320, observation=huge), *copies(templates, 1450)]
    page = write_page(write_step(tmp_path, 5, saved))
    block = page.read_text(encoding="utf-8").split('id="step-5">', 1)[1].split("</script>", 1)[0]
    assert len(block.encode()) > 20e6, len(block.encode())
    fcp, drawn, view = paint(browser, page, "#step=5", "#trajectories")
    try:
        timings = {"first paint": fcp, "step view (parse, histograms, list)": drawn}
        started = time.perf_counter()
        view.page.locator("button[data-preset='mismatch > 0.1 nat']").click()
        view.page.wait_for_selector("#t-count")
        timings["token search"] = time.perf_counter() - started
        started = time.perf_counter()
        view.page.select_option("#f-sort", "d-desc")
        timings["sort by largest mismatch"] = time.perf_counter() - started
        view.page.locator("#t-clear").click()
        view.page.select_option("#f-sort", "")
        started = time.perf_counter()
        view.page.locator("#trajectories tr.traj[data-i='0']").click()
        view.page.wait_for_selector(".detail[data-i='0'] .cap-marker")
        timings["open the 2 MB tool output"] = time.perf_counter() - started
        started = time.perf_counter()
        view.page.select_option("#f-mode", "entropy")
        timings["recolour"] = time.perf_counter() - started
        print("\n20 MB step: " + "; ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        assert all(v < 20 for v in timings.values()), timings  # responsive on a loaded 2-core machine
        assert view.errors == [] and all(url.startswith("file://") for url in view.requests)
    finally:
        view.close()
