"""`stare-agents gpu-smoke` (stare_agents/train/gpu_smoke.py) on a machine without a GPU: one JSON report whose
every check is passed, failed, skipped (with the reason) or timed out; the GPU checks skipped for want of CUDA; the
device tier's checks run on the CPU (`--device cpu`, gloo for NCCL) from an installed wheel and pass; a check past
its deadline is killed with what it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch

SMOKE = [sys.executable, "-m", "stare_agents.train.gpu_smoke"]  # = stare-agents gpu-smoke
STATUSES = {"passed", "failed", "skipped", "timeout"}
CHECK_KEYS = {"name", "tier", "what", "deadline_s", "status"}
# the smoke's work folders (train/gpu_smoke.py: mkdtemp "gpu-smoke-") in this test process's temporary folder: a
# process naming one is this test's (another pytest worker's smoke runs in its own TMPDIR)
OURS = os.path.join(tempfile.gettempdir(), "gpu-smoke-")


def smoke(tmp_path: Path, *args: str, timeout: float = 600, wheel=None) -> tuple[int, dict]:
    """The smoke command's exit status and report: from the checkout, or from `wheel` (an installed one)."""
    out = tmp_path / "report.json"
    command = [*SMOKE, "--out", str(out), *args]
    if wheel is None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    else:
        command = [str(wheel.console_script), "gpu-smoke", *command[len(SMOKE) :]]
        done = wheel.run(command, cwd=tmp_path, timeout=timeout)
    report = json.loads(out.read_text())  # strict JSON: no NaN
    assert json.loads(done.stdout) == report  # the same report on stdout
    assert {"report", "version", "tiers", "device", "machine", "checks", "counts", "ok", "wall_s"} <= set(
        report
    )
    for check in report["checks"]:
        assert set(check) >= CHECK_KEYS and check["status"] in STATUSES, check
        assert check["status"] == "passed" or check["reason"], check  # anything else says why
    assert report["counts"] == {s: sum(c["status"] == s for c in report["checks"]) for s in STATUSES}
    return done.returncode, report


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the GPU checks would run")
def test_without_cuda_every_gpu_check_is_skipped_and_says_why(tmp_path):
    code, report = smoke(tmp_path, "--tier", "all", timeout=120)
    assert code == 0 and report["ok"] and report["machine"]["cuda_available"] is False
    tiers = {c["tier"] for c in report["checks"]}
    assert tiers == {"device", "node", "cluster"}
    assert all(c["status"] == "skipped" for c in report["checks"])
    for check in report["checks"]:
        expected = {"device": "no CUDA device", "node": "needs 2+ CUDA GPUs", "cluster": "no cluster"}[
            check["tier"]
        ]
        assert expected in check["reason"], check


@pytest.mark.slow
def test_the_device_tier_runs_on_the_cpu_from_the_installed_wheel(tmp_path, installed_wheel):
    code, report = smoke(tmp_path, "--tier", "device", "--device", "cpu", wheel=installed_wheel)
    assert report["machine"]["package"].startswith(str(installed_wheel.target))
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert set(statuses.values()) == {"passed"}, report["checks"]
    assert code == 0 and report["ok"]
    assert set(statuses) == {
        "device",
        "learner_precision",
        "learner_sharding",
        "checkpoint_round_trip",
        "collectives",
        "sync_into_hf_engine",
        "rl_steps_and_resume",
    }
    assert sum(c["deadline_s"] for c in report["checks"]) <= 480  # the device tier fits 8 minutes
    resumed = next(c for c in report["checks"] if c["name"] == "rl_steps_and_resume")["figures"]
    assert resumed["weight_versions"] == [1, 2, 3]


def test_a_check_past_its_deadline_is_killed_with_its_processes(tmp_path):
    before = {p.pid for p in psutil.process_iter()}
    code, report = smoke(
        tmp_path, "--device", "cpu", "--only", "rl_steps_and_resume", "--deadline-scale", "0.02", timeout=120
    )
    (check,) = report["checks"]
    assert check["status"] == "timeout" and "3.6 s" in check["reason"], check
    assert code == 1 and report["ok"] is False and report["counts"]["timeout"] == 1
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and OURS in " ".join(p.info["cmdline"] or ())
    ]
    assert left == []


def test_what_a_check_started_in_a_session_of_its_own_is_ended_after_the_check_dies(tmp_path):
    """A check that starts a training run with start_new_session and is then SIGKILLed leaves that run
    orphaned, outside the check's process group: the script, a child subreaper, inherits it and ends it."""
    marker = f"orphan-{tmp_path.name}"
    program = f"""
import os, signal, subprocess, sys, time
from stare_agents.train import gpu_smoke
assert gpu_smoke._become_subreaper()
check = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}], start_new_session=True, **quiet)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}], **quiet)
print("started", flush=True)
time.sleep(300)
'''], stdout=subprocess.PIPE, start_new_session=True)
assert check.stdout.readline() == b"started\\n"
os.killpg(check.pid, signal.SIGKILL)
check.wait()
print(gpu_smoke._end_descendants())
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 1  # the run in its own session, at least, was left and ended
    time.sleep(0.2)
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or ())]
    assert left == []


def test_a_machine_with_only_torch_hears_every_reason_a_node_check_is_skipped(monkeypatch, tmp_path):
    """One GPU, no vLLM, no Ray, an installed package without the benchmarks folder: each reason is named."""
    from stare_agents.train import smoke_base

    monkeypatch.setattr(smoke_base, "cuda_count", lambda: 1)
    monkeypatch.setattr(smoke_base, "has_module", lambda name: name not in ("vllm", "ray"))
    monkeypatch.setattr(smoke_base, "BENCH_ROLLOUT", tmp_path / "benchmarks" / "bench_rollout.py")
    assert smoke_base.needs_node(None) == "needs 2+ CUDA GPUs, found 1; needs vllm and ray installed"
    reason = smoke_base.needs_node_and_checkout(None)
    assert reason.startswith("needs 2+ CUDA GPUs, found 1; needs vllm and ray installed; needs benchmarks/")
    assert "in the repository, not the installed package" in reason


def _below(pid: int, needle: str, timeout_s: float) -> psutil.Process:
    """The first process below `pid` whose command line has `needle`, waited for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in psutil.Process(pid).children(recursive=True):
            try:
                if needle in " ".join(process.cmdline()):
                    return process
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no process with {needle!r} below {pid} within {timeout_s} s")


@pytest.mark.parametrize(
    ("signum", "waits_for"),
    [
        (signal.SIGTERM, "stare_agents.cli train"),  # the check's training run, in a session of its own
        (signal.SIGINT, "--child rl_steps_and_resume"),  # Ctrl-C as soon as the check runs
    ],
)
def test_a_signal_to_the_script_ends_its_check_and_everything_below_it(tmp_path, signum, waits_for):
    out = tmp_path / "report.json"
    command = [*SMOKE, "--device", "cpu", "--only", "rl_steps_and_resume", "--out", str(out)]
    script = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        below = _below(script.pid, waits_for, timeout_s=120)
        family = [below, *below.children(recursive=True)]
        sent = time.monotonic()
        script.send_signal(signum)
        stdout, stderr = script.communicate(timeout=30)
    finally:
        script.kill()
    assert time.monotonic() - sent < 15, stderr
    assert script.returncode == 128 + signum, stderr
    report = json.loads(out.read_text())
    assert json.loads(stdout) == report and report["ok"] is False
    assert report["interrupted"] == signal.Signals(signum).name
    (record,) = report["checks"]
    assert (
        record["status"] == "failed" and f"interrupted by {signal.Signals(signum).name}" in record["reason"]
    )
    time.sleep(0.2)
    assert [p.pid for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert [
        p.pid for p in psutil.process_iter(["cmdline"]) if OURS in " ".join(p.info["cmdline"] or ())
    ] == []


def test_an_unreachable_cluster_fails_each_check_in_seconds_naming_the_address(tmp_path):
    started = time.monotonic()
    code, report = smoke(
        tmp_path,
        "--tier",
        "cluster",
        "--ray-address",
        "127.0.0.1:9",
        "--shared-dir",
        str(tmp_path),
        timeout=120,
    )
    assert code == 1 and [c["status"] for c in report["checks"]] == ["failed", "failed"], report["checks"]
    for check in report["checks"]:
        assert "cannot reach the cluster at 127.0.0.1:9" in check["reason"] and check["seconds"] < 30, check
    assert time.monotonic() - started < 90


def test_the_cluster_tier_needs_a_folder_every_node_mounts(tmp_path):
    done = subprocess.run(
        [*SMOKE, "--tier", "cluster", "--ray-address", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "needs --shared-dir DIR: a folder every node mounts" in done.stderr


def test_a_node_without_a_gpu_or_the_shared_folder_is_named_with_what_it_lacks():
    from stare_agents.train.smoke_cluster import node_problems

    ok = {"cuda": 8, "shared": True, "shared_error": None, "project": "/opt/x"}
    answers = {
        "10.0.0.5": ok,
        "10.0.0.6": {**ok, "cuda": 0},  # two CPU nodes passed the old check
        "10.0.0.7": {**ok, "shared": False, "shared_error": "cannot read /shared/.gpu-smoke-x: No such file"},
    }
    problems = node_problems(answers, {"10.0.0.5": 8, "10.0.0.6": 0, "10.0.0.7": 8})
    assert problems == [
        "node 10.0.0.6 lacks a GPU (torch sees 0, Ray counts 0; start Ray there with its GPUs: `ray start ... "
        "--num-gpus=N`)",
        "node 10.0.0.7 lacks the shared folder (cannot read /shared/.gpu-smoke-x: No such file; mount it at the "
        "same path on every node)",
    ]
    assert node_problems({"10.0.0.5": ok}, {"10.0.0.5": 0})[0].startswith(
        "node 10.0.0.5 lacks a GPU (torch sees 8, Ray counts 0"
    )
