"""GPU smoke checks for a lent machine: one command, one JSON report, every check with a deadline.

    stare-agents gpu-smoke --tier device --out gpu_smoke.json     # one GPU, <= 8 minutes; torch + transformers
    stare-agents gpu-smoke --tier node                            # 2+ GPUs, vLLM and Ray
    RAY_ADDRESS=HEAD:6379 stare-agents gpu-smoke --tier cluster   # a Ray cluster of 2+ nodes

It ships in the package (`python -m stare_agents.train.gpu_smoke` is the same command), so an installed wheel runs
it on a machine that has only torch and transformers besides the package's pure-Python dependencies; what such a
machine cannot run is skipped with the reason (vLLM or Ray missing, one GPU, no checkout for a benchmark script).

Tiers (each runs only its own checks; `--tier all` runs the three):
- device (torch only, the tiny model, the deadlines add up to 8 minutes): the GPU itself; the learner in fp32
  and bf16; the learner sharded with FSDP2 against the same step unsharded; a checkpoint round trip; the
  collectives the project uses (all-reduce, all-gather, broadcast on the device's backend, and the weight-sync
  group's bucketed broadcast); the weight sync into the HF engine on the GPU; three RL steps of the tiny recipe
  and a resume after SIGKILL.
- node (2+ GPUs, vLLM and Ray): the NCCL weight sync from a learner on one GPU into vLLM on another; a replaced
  rollout worker catching up; an engine sharded over two GPUs (tensor parallel 2) getting new weights; the
  pipelined (one-step off-policy) RL step; the agent loop against plain generation (benchmarks/bench_rollout.py).
- cluster (RAY_ADDRESS or --ray-address, and --shared-dir on storage every node mounts; 2+ nodes with a GPU
  each): every node has a GPU, runs CUDA, imports the project and reads the shared folder; the tiny recipe with
  learners on one node and engines on another, its run folder in --shared-dir (pass the custom resources with
  --train-arg). An address nothing answers on fails each check in seconds, naming it.

The checks are in smoke_device.py, smoke_node.py and smoke_cluster.py (one module a tier; what they share in
smoke_base.py); this module runs them.

Each check runs in a process of its own, killed at its deadline (status "timeout"); a check whose needs are not
met (no CUDA, one GPU, no vLLM, no cluster) is "skipped" with the reason. Status words: passed, failed,
skipped, timeout. A signal that ends the script (Ctrl-C, SIGTERM, SIGHUP) first ends the running check and every
process below it (what it started in sessions of its own too), writes the report ("interrupted") and exits with
128 + the signal's number. `--device cpu` runs the device tier's checks on the CPU (gloo instead of NCCL): a
rehearsal on a machine without a GPU (tests/test_gpu_smoke.py runs it from a built wheel). The exit status is 0
when nothing failed or timed out.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from stare_agents.train import smoke_cluster, smoke_device, smoke_node  # noqa: F401  (they register the checks)
from stare_agents.train.smoke_base import CHECKS, TIERS, Check, cluster_given, cuda_count

MODULE = "stare_agents.train.gpu_smoke"  # each check runs as `python -m MODULE --child NAME`
STATUSES = ("passed", "failed", "skipped", "timeout")
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# ---- the runner --------------------------------------------------------------------------------------------
def run_child(opts: argparse.Namespace) -> None:
    """One check, in this (child) process: its figures or its error, as JSON in --result."""
    found = next(c for c in CHECKS if c.name == opts.child)
    work = Path(opts.work)
    try:
        result = {"status": "passed", "figures": found.run(opts, work)}
    except Exception as error:  # the report says what failed; the runner goes on with the next check
        result = {
            "status": "failed",
            "reason": f"{type(error).__name__}: {error}",
            "trace": traceback.format_exc()[-3000:],
        }
    from stare_agents.jsonl import dumps

    Path(opts.result).write_text(dumps(result))
    os._exit(0)  # no waiting on threads a check left behind (engines, process groups)


def run_check(found: Check, opts: argparse.Namespace, root: Path) -> dict[str, Any]:
    deadline_s = found.deadline_s * opts.deadline_scale
    record: dict[str, Any] = {
        "name": found.name,
        "tier": found.tier,
        "what": found.what,
        "deadline_s": deadline_s,
    }
    reason = found.needs(opts)
    if reason is not None:
        return {**record, "status": "skipped", "reason": reason}
    work = root / found.name
    work.mkdir(parents=True)
    result = work / "result.json"
    command = [
        sys.executable,
        "-m",
        MODULE,
        "--child",
        found.name,
        "--work",
        str(work),
        "--result",
        str(result),
    ]
    command += [
        "--device",
        opts.device,
        "--ray-address",
        opts.ray_address or "",
        f"--deadline-scale={opts.deadline_scale}",
    ]
    command += ["--shared-dir", opts.shared_dir or ""] + [f"--train-arg={a}" for a in opts.train_args]
    started = time.monotonic()
    with (work / "output.log").open("w") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work
        )
        try:
            child.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        except Interrupted as stop:  # the script is ending: the check and all below it first
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            ended = _end_descendants()
            name = signal.Signals(stop.signum).name
            stop.record = {
                **record,
                "seconds": round(time.monotonic() - started, 1),
                "status": "failed",
                "reason": f"interrupted by {name}: the check and the {ended} process(es) below it were ended",
            }
            raise
    record["seconds"] = round(time.monotonic() - started, 1)
    with_children = _end_descendants()
    if result.is_file():
        record.update(json.loads(result.read_text()))
    elif record["seconds"] >= deadline_s:
        record.update(status="timeout", reason=f"not done within {deadline_s:g} s (killed)")
    else:
        tail = (work / "output.log").read_text()[-3000:]
        record.update(
            status="failed", reason=f"the check's process ended with {child.returncode}", output_tail=tail
        )
    if with_children:
        record["processes_left_and_ended"] = with_children
    return record


class Interrupted(BaseException):
    """A signal that ends the script arrived (`_on_signal`); `record`: the running check's, once it is ended."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.record: dict[str, Any] | None = None


def _on_signal(signum: int, frame: Any) -> None:
    for ending in ENDING_SIGNALS:  # a second Ctrl-C does not cut the clean-up short
        signal.signal(ending, signal.SIG_IGN)
    raise Interrupted(signum)


def _become_subreaper() -> bool:
    """Make this process the one that inherits whatever a check leaves behind.

    A check starts processes in sessions of their own (a training run it kills as a machine would die, an engine
    core, a Ray worker). Killing the check's process group does not reach them, and once the check is dead they
    would be re-parented to init, out of sight. As a child subreaper (Linux), this process inherits them instead,
    so `_end_descendants` finds and ends them after each check. Returns False where the kernel has no such flag.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER


def _end_descendants() -> int:
    """SIGKILL every process below this one (checks run one at a time, so all are the last check's) and reap
    them; returns how many there were. Repeats until none is left, for a process that forked while its parent
    was being killed."""
    ended: set[int] = set()
    for _ in range(100):
        left = []
        for process in psutil.Process().children(recursive=True):
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    process.kill()
                    left.append(process)
            except psutil.NoSuchProcess:
                pass
        if not left:
            break
        ended |= {p.pid for p in left}
        psutil.wait_procs(left, timeout=5)
    while True:  # reap the inherited ones that psutil did not wait for
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return len(ended)


def machine() -> dict[str, Any]:
    import torch

    import stare_agents

    info: dict[str, Any] = {
        "host": platform.node(),
        "package": str(Path(stare_agents.__file__).parent),  # a checkout's or an installed wheel's
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpus": cuda_count(),
        "cpus": os.cpu_count(),
    }
    for name in ("vllm", "ray", "transformers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as error:
            info[name] = f"not importable: {type(error).__name__}"
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stare-agents gpu-smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=[*TIERS, "all"], default="device")
    parser.add_argument(
        "--device", choices=["auto", "cpu"], default="auto", help="cpu: the device tier on the CPU"
    )
    parser.add_argument("--out", type=Path, help="the JSON report (default: printed only)")
    parser.add_argument("--only", action="append", default=[], help="run only this check (repeatable)")
    parser.add_argument("--ray-address", default="", help="cluster tier: the cluster (default: RAY_ADDRESS)")
    parser.add_argument(
        "--shared-dir", default="", help="cluster tier: a folder every node reaches (run folder)"
    )
    parser.add_argument(
        "--train-arg", dest="train_args", action="append", default=[], help="cluster tier: an override"
    )
    parser.add_argument(
        "--deadline-scale", type=float, default=1.0, help="multiply every deadline (a slow machine: 2)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the checks' work folders")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    opts.ray_address = opts.ray_address or None
    opts.shared_dir = opts.shared_dir or None
    if opts.child:
        run_child(opts)
    tiers = TIERS if opts.tier == "all" else (opts.tier,)
    chosen = [c for c in CHECKS if c.tier in tiers and (not opts.only or c.name in opts.only)]
    unknown = set(opts.only) - {c.name for c in CHECKS}
    if unknown:
        parser.error(f"no check named {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
    if any(c.tier == "cluster" for c in chosen) and cluster_given(opts) and not opts.shared_dir:
        parser.error(
            f"the cluster tier (cluster {cluster_given(opts)}) needs --shared-dir DIR: a folder every node mounts at "
            "the same path (the run folder of its training check; each node must read it)"
        )
    _become_subreaper()
    root = Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    started = time.monotonic()
    report: dict[str, Any] = {
        "report": "gpu_smoke",
        "version": 1,
        "tiers": list(tiers),
        "device": opts.device,
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "checks": [],
    }
    interrupted: Interrupted | None = None
    for ending in ENDING_SIGNALS:
        signal.signal(ending, _on_signal)
    try:
        for found in chosen:
            record = run_check(found, opts, root)
            report["checks"].append(record)
            _say(record)
    except Interrupted as stop:  # between checks, or the running one ended (its record says so)
        interrupted = stop
        _end_descendants()
        if stop.record is not None:
            report["checks"].append(stop.record)
            _say(stop.record)
        report["interrupted"] = signal.Signals(stop.signum).name
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["counts"] = {s: sum(r["status"] == s for r in report["checks"]) for s in STATUSES}
    report["ok"] = interrupted is None and report["counts"]["failed"] == report["counts"]["timeout"] == 0
    counts = ", ".join(f"{n} {status}" for status, n in report["counts"].items())
    print(
        f"{len(report['checks'])} checks: {counts} (a skipped check's reason is on its line)", file=sys.stderr
    )
    report["work"] = str(root) if opts.keep else None
    if not opts.keep:
        shutil.rmtree(root, ignore_errors=True)
    from stare_agents.jsonl import dumps

    text = dumps(report, indent=2)
    if opts.out:
        opts.out.write_text(text + "\n")
    print(text)
    if interrupted is not None:
        return 128 + interrupted.signum  # as the shell reports a process a signal ended
    return 0 if report["ok"] else 1


def _say(record: dict[str, Any]) -> None:
    reason = f"  {record['reason']}" if record.get("reason") else ""
    print(
        f"{record['status']:>8}  {record['name']} ({record.get('seconds', 0):g} s){reason}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
