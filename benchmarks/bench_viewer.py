"""The viewer on a real run folder: step files' size, the page's size and how fast Chromium draws it.

    .venv/bin/python benchmarks/bench_viewer.py runs/smollm2-arith               # figures only
    .venv/bin/python benchmarks/bench_viewer.py RUN --loads 5 --screenshots docs  # + the README's screenshots

For RUN it writes the page as `stare-agents show RUN` does (into a temporary folder unless --page), then prints:
each saved step file's size on disk (gzipped JSON lines, every token's statistics as the learner records them) and
its trajectories and tokens; the page's size raw and gzipped and the time to build it; and, in headless Chromium
(`scripts/provision_browser.sh`), over --loads fresh loads of the last step (`#step=N`): the first contentful paint
and the time until the step's trajectory list is drawn, then the across-training view (`#heldout`) and the token
finder over every step (`#tokens`), medians with min-max. The page must make no network request; one it makes is
reported and fails the run (exit 1). Issue 49's bar: every step file <= 3 MB gzipped and a first paint < 1 s.

--screenshots DIR saves viewer-across-training.png (the first held-out task the table lists, graded differently
at some point, at every evaluation point) and viewer-token-search.png (the token finder over every step with the
"mismatch > 0.1 nat" preset) there.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stare_agents.rollout_log import saved_steps
from stare_agents.viewer import write_page

STEP_FILE_LIMIT = 3e6  # bytes, gzipped (issue 49)
PAINT_LIMIT_S = 1.0


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("no Chromium browser: run scripts/provision_browser.sh as root")


def step_files(run: Path) -> list[dict[str, Any]]:
    """Per saved step file: its size and what it holds."""
    rows = []
    for path in sorted((run / "rollouts").glob("*.jsonl*")):
        opener = gzip.open if path.suffix == ".gz" else open
        trajectories = tokens = 0
        with opener(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                trajectories += 1
                tokens += len(record.get("trajectory", {}).get("response_ids", []))
        rows.append(
            {"file": path.name, "bytes": path.stat().st_size, "trajectories": trajectories, "tokens": tokens}
        )
    return rows


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def measure_browser(
    page: Path, last_step: int, loads: int, screenshots: Path | None
) -> tuple[dict[str, Any], list[str]]:
    from playwright.sync_api import sync_playwright

    url = page.resolve().as_uri()
    figures: dict[str, list[float]] = {"first paint": [], "step view drawn": [], "heldout": [], "tokens": []}
    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox", "--disable-gpu"])
        for _ in range(loads):
            view = browser.new_page(viewport={"width": 1300, "height": 1150})
            view.on(
                "request",
                lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None,
            )
            view.on("pageerror", lambda e: errors.append(str(e)))
            start = time.perf_counter()
            view.goto(f"{url}#step={last_step}")
            view.wait_for_selector("#trajectories")
            figures["step view drawn"].append(time.perf_counter() - start)
            figures["first paint"].append(
                view.evaluate(
                    "performance.getEntriesByName('first-contentful-paint').map(e => e.startTime)[0] / 1000"
                )
            )
            start = time.perf_counter()
            view.evaluate("location.hash = '#heldout'")
            view.wait_for_selector("#heldout-tasks", state="attached")
            figures["heldout"].append(time.perf_counter() - start)
            start = time.perf_counter()
            view.evaluate("location.hash = '#tokens'")
            view.wait_for_selector("#token-results", state="attached")
            figures["tokens"].append(time.perf_counter() - start)
            view.close()
        if screenshots is not None:
            screenshots.mkdir(parents=True, exist_ok=True)
            view = browser.new_page(viewport={"width": 1300, "height": 1150})
            view.goto(f"{url}#heldout")
            view.wait_for_selector(".htask", state="attached")
            task = view.eval_on_selector(".htask", "row => row.dataset.task")
            view.evaluate(f"location.hash = '#heldout=' + encodeURIComponent({json.dumps(task)})")
            view.wait_for_selector("#heldout-view", state="visible")
            view.wait_for_timeout(500)
            view.evaluate("document.querySelector('#heldout-view').scrollIntoView()")
            view.screenshot(path=str(screenshots / "viewer-across-training.png"))
            view.goto(f"{url}#tokens")
            view.wait_for_selector("#token-filter", state="visible")
            view.get_by_role("button", name="mismatch > 0.1 nat").click()
            view.wait_for_timeout(800)
            view.evaluate("document.querySelector('#tokens-view').scrollIntoView()")
            view.screenshot(path=str(screenshots / "viewer-token-search.png"))
            view.close()
        browser.close()
    return {name: values for name, values in figures.items()}, requests + [f"page error: {e}" for e in errors]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a run folder (stare-agents train --out)")
    parser.add_argument("--page", type=Path, help="where to write the page (default: a temporary folder)")
    parser.add_argument("--loads", type=int, default=5, help="fresh page loads to time")
    parser.add_argument("--screenshots", type=Path, help="save the README's two screenshots into this folder")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.run.is_dir():
        raise SystemExit(f"{args.run}: not a run folder")
    steps = saved_steps(args.run)
    if not steps:
        raise SystemExit(f"{args.run}: no saved rollouts (rollouts/*.jsonl.gz)")
    files = step_files(args.run)
    for row in files:
        print(
            f"{row['file']}: {row['bytes'] / 1e6:.3f} MB gzipped, {row['trajectories']} trajectories, "
            f"{row['tokens']} response tokens"
        )
    largest = max(row["bytes"] for row in files)
    with tempfile.TemporaryDirectory() as scratch:
        page = args.page or Path(scratch) / "rollouts.html"
        start = time.perf_counter()
        write_page(args.run, page)
        built = time.perf_counter() - start
        raw = page.read_bytes()
        page_gz = len(gzip.compress(raw))
        print(f"page: {len(raw) / 1e6:.2f} MB ({page_gz / 1e6:.2f} MB gzipped), built in {built:.2f} s")
        figures, stray = measure_browser(page, max(steps), args.loads, args.screenshots)
    for name, values in figures.items():
        print(f"{name}: {spread(values)} over {len(values)} loads")
    load = os.getloadavg()[0]
    print(f"load average (1 min) at the end: {load:.2f}; CPU: {os.cpu_count()} logical")
    verdict = largest <= STEP_FILE_LIMIT and statistics.median(figures["first paint"]) < PAINT_LIMIT_S
    print(
        f"bar (every step file <= {STEP_FILE_LIMIT / 1e6:.0f} MB gzipped, first paint < {PAINT_LIMIT_S:.0f} s): "
        f"{'met' if verdict else 'NOT met'} (largest {largest / 1e6:.3f} MB)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "run": str(args.run),
                    "step_files": files,
                    "page_bytes": len(raw),
                    "page_gzipped_bytes": page_gz,
                    "build_s": built,
                    "browser_s": figures,
                    "load_average": load,
                    "bar_met": verdict,
                    "stray_requests": stray,
                },
                indent=1,
                allow_nan=False,  # strict JSON: a figure that is not a number is an error here
            )
        )
    if stray:
        print(f"the page made requests or raised: {stray[:5]}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
