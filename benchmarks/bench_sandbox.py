"""Sandbox latency and throughput: the warm pool before and after issue 10's reset, under runc and gVisor,
and against `docker run` / `docker exec` per call.

    flock /tmp/stare-heavy.lock .venv/bin/python benchmarks/bench_sandbox.py [--pool-size 4] [--calls 2000]

Measures, in one run and with every DockerSandbox limit in force (no network, memory, pids, CPU quota,
read-only root + tmpfs, non-root, no capabilities, no-new-privileges; fd-level stdout/stderr capture):
  * side by side for the code before issue 10 (`--before`, default the commit before its first change,
    loaded from git into a temporary package) and the current code, each under runc and under runsc
    (gVisor, when the engine has it): pool start, single-session `print(1)` p50 / p99, and session churn
    (one-call sessions `import numpy, sympy; print(1)` per second across the pool, which includes the
    reset between sessions and, now, the check that nothing is left);
  * for the current code under runc: p90 / mean, throughput across the pool (one session per container
    calling `print(1)` in a loop), memory per warm container and containerd shim;
  * the same `print(1)` with `docker run --rm` per call and with `docker exec` into a warm container,
  * LocalSandbox for reference (no isolation).

    flock /tmp/stare-heavy.lock .venv/bin/python benchmarks/bench_sandbox.py --cpu-share [--rounds 3]

measures only what `DockerLimits.low_priority` buys (needs root): the CPU seconds a container's busy loop
gets in 2 s of wall time on one CPU where a process of the host spins too, at normal and at low priority
(the test suite checks the cgroup settings; a share under load is a figure, not a pass/fail).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from stare_agents.sandbox import DEFAULT_IMAGE, DockerLimits, DockerSandbox, LocalSandbox
from stare_agents.sandbox.docker_backend import GVISOR_EXTRA_PIDS, docker_client, engine_runtimes

console = Console(width=120)
REPO = Path(__file__).resolve().parents[1]
BEFORE = "f124040^"  # the code before issue 10's first change


def load_before(commit: str) -> tuple[type, str]:
    """DockerSandbox of `commit`, imported from a temporary copy of its sandbox/ as `sandbox_before`."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="stare-bench-before-")) / "sandbox_before"
    folder.mkdir()
    for name in ("__init__", "docker_backend", "local", "pool", "result", "runner"):
        source = subprocess.run(
            ["git", "show", f"{sha}:sandbox/{name}.py"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        (folder / f"{name}.py").write_text(source.replace("stare_agents.sandbox", "sandbox_before"))
    sys.path.insert(0, str(folder.parent))
    return importlib.import_module("sandbox_before.docker_backend").DockerSandbox, sha


def make_before(cls: type, runtime: str, pool_size: int, image: str, limits) -> object:
    """The old DockerSandbox had no `runtime`; give its containers the runtime, and under gVisor the same
    pids headroom for the sentry that the current code gives (without it the sentry dies)."""
    sandbox = cls(pool_size=pool_size, image=image, limits=limits)
    original = sandbox.container_config

    def container_config():
        create, host = original()
        host["runtime"] = runtime
        if runtime == "runsc":
            host["pids_limit"] = limits.pids + GVISOR_EXTRA_PIDS
        return create, host

    sandbox.container_config = container_config
    return sandbox


def percentiles(times_s: list[float]) -> dict[str, float]:
    ms = sorted(t * 1e3 for t in times_s)

    def pick(q: float) -> float:
        return ms[min(len(ms) - 1, round(q * (len(ms) - 1)))]

    return {"p50_ms": pick(0.5), "p90_ms": pick(0.9), "p99_ms": pick(0.99), "mean_ms": statistics.fmean(ms)}


def session_latency(sandbox, calls: int, warmup: int = 200) -> dict[str, float]:
    with sandbox.session() as session:
        for _ in range(warmup):
            session.run("print(1)")
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            result = session.run("print(1)")
            times.append(time.perf_counter() - started)
            assert result.stdout == "1\n", result
    return percentiles(times)


def pool_throughput(sandbox, seconds: float) -> dict[str, float]:
    """One thread and session per container, `print(1)` in a loop for `seconds`."""
    counts = [0] * sandbox.pool_size
    failures: list[str] = []
    barrier = threading.Barrier(sandbox.pool_size + 1)
    stop = threading.Event()

    def loop(i: int) -> None:
        with sandbox.session() as session:
            session.run("print(1)")
            barrier.wait()
            while not stop.is_set():
                result = session.run("print(1)")
                if result.stdout != "1\n":
                    failures.append(repr(result))
                counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(sandbox.pool_size)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert not failures, failures[:3]
    return {"calls_per_s": sum(counts) / elapsed, "sessions": sandbox.pool_size}


def session_churn(sandbox, seconds: float) -> dict[str, float]:
    """One-call sessions (`import numpy, sympy; print(1)`) from one thread per container: what an RL
    rollout with a short episode per session sees, including the wipe between sessions."""
    counts = [0] * sandbox.pool_size
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < stop:
            result = sandbox.run("import numpy, sympy\nprint(1)")
            assert result.stdout == "1\n", result
            counts[i] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(sandbox.pool_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"sessions_per_s": sum(counts) / (time.perf_counter() - started)}


def memory_per_container(sandbox) -> dict[str, float]:
    client = docker_client()
    usages, shims = [], []
    for runner in list(sandbox._pool._free):
        container = client.containers.get(runner.channel.container.id)
        stats = container.stats(stream=False)["memory_stats"]
        cache = stats.get("stats", {}).get(
            "total_inactive_file", stats.get("stats", {}).get("inactive_file", 0)
        )
        usages.append((stats["usage"] - cache) / 2**20)
        shims.append(_shim_rss_mib(container.id))
    return {"container_mib": statistics.fmean(usages), "shim_mib": statistics.fmean(shims)}


def _shim_rss_mib(container_id: str) -> float:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"containerd-shim" in cmdline and container_id.encode() in cmdline:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            return int(line.split()[1]) / 1024
        except OSError:
            continue
    return float("nan")


def limit_flags(limits: DockerLimits) -> list[str]:
    """The `docker run` flags of the same limits, for the per-call baselines."""
    return [
        "--network=none",
        f"--memory={limits.memory_mb}m",
        f"--memory-swap={limits.memory_mb}m",
        f"--pids-limit={limits.pids}",
        f"--cpus={limits.cpus}",
        "--read-only",
        f"--tmpfs=/tmp:rw,nosuid,nodev,noexec,size={limits.tmpfs_mb}m",
        f"--user={limits.user}",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--log-driver=none",
    ]


def docker_run_per_call(image: str, limits: DockerLimits, calls: int) -> dict[str, float]:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        out = subprocess.run(
            ["docker", "run", "--rm", *limit_flags(limits), image, "python3", "-c", "print(1)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        times.append(time.perf_counter() - started)
        assert out == "1\n", out
    return percentiles(times)


def docker_exec_per_call(image: str, limits: DockerLimits, calls: int) -> dict[str, float]:
    name = f"stare-bench-exec-{os.getpid()}"
    subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--rm",
            "--name",
            name,
            "--label",
            "stare-agents.sandbox.bench=1",
            *limit_flags(limits),
            image,
            "sleep",
            "infinity",
        ],
        capture_output=True,
        check=True,
    )
    try:
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            out = subprocess.run(
                ["docker", "exec", name, "python3", "-c", "print(1)"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            times.append(time.perf_counter() - started)
            assert out == "1\n", out
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    return percentiles(times)


def compare(args, limits: DockerLimits, runtimes: list[str]) -> dict[str, dict]:
    """Pool start, print(1) latency and session churn for before/after x runtimes, `args.rounds` times,
    the variants interleaved within each round (so that load from elsewhere hits them alike)."""
    before_cls, sha = load_before(args.before)
    rounds: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        for runtime in runtimes:
            for code in ("before", "after"):
                if code == "before":
                    sandbox = make_before(before_cls, runtime, args.pool_size, args.image, limits)
                else:
                    sandbox = DockerSandbox(
                        pool_size=args.pool_size, image=args.image, limits=limits, runtime=runtime
                    )
                name = f"{code} ({sha if code == 'before' else 'now'}), {runtime}"
                console.print(f"round {round_index + 1}/{args.rounds}: {name}")
                with sandbox:
                    row = {"start_s": sandbox._pool.start_seconds}
                    row.update(session_latency(sandbox, args.calls))
                    row.update(session_churn(sandbox, args.seconds))
                rounds.setdefault(name, []).append(row)
    return {
        name: {
            **{key: statistics.median(r[key] for r in rows) for key in rows[0]},
            "rounds": rows,
        }
        for name, rows in rounds.items()
    }


BUSY_LOOP = """
import time
start, cpu = time.monotonic(), time.process_time()
while time.monotonic() - start < 2.0:
    pass
print(time.process_time() - cpu)
"""


def cpu_seconds_beside_a_busy_process(limits: DockerLimits, cpu: int, image: str) -> float:
    """CPU seconds a container's busy loop gets in 2 s of wall time on `cpu`, where a process of this host
    (at its usual priority) spins too, from before the container starts."""
    spinner = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        with DockerSandbox(pool_size=1, image=image, limits=limits) as box:
            time.sleep(0.5)  # the spinner is on its CPU
            result = box.run(BUSY_LOOP, timeout_s=30)
            if not result.ok:
                raise RuntimeError(f"the busy loop failed: {result.stderr}")
            if limits.low_priority and not box.low_priority_set:
                raise RuntimeError("the containers' CPU weight was not lowered (needs root; see the log)")
            return float(result.stdout)
    finally:
        spinner.kill()
        spinner.wait()


def cpu_share(args) -> dict[str, list[float]]:
    """`--cpu-share`: normal against low priority, `args.rounds` alternating rounds, on this process's last CPU."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    base = dict(memory_mb=256, pids=64, cpus=1.0, tmpfs_mb=16, cpuset=str(cpu))
    figures: dict[str, list[float]] = {"normal": [], "low": []}
    for _ in range(args.rounds):
        for name, low in (("normal", False), ("low", True)):
            limits = DockerLimits(**base, low_priority=low)
            figures[name].append(cpu_seconds_beside_a_busy_process(limits, cpu, args.image))
    table = Table(f"CPU-s of 2 s on CPU {cpu} beside a busy host process", "median", "min", "max")
    for name, values in figures.items():
        table.add_row(name, *(f"{v:.2f}" for v in (statistics.median(values), min(values), max(values))))
    console.print(table)
    console.print(
        f"low / normal: {statistics.median(figures['low']) / statistics.median(figures['normal']):.3f} "
        f"(the weight is a 16th: ~0.06 of the CPU when the other process never yields)"
    )
    return figures


def _spread(rows: list[dict], key: str, digits: int) -> str:
    values = sorted(r[key] for r in rows)
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({values[0]:.{digits}f}-{values[-1]:.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2000, help="calls for the single-session latency")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of throughput and churn runs")
    parser.add_argument("--run-calls", type=int, default=10, help="calls for `docker run` per call")
    parser.add_argument("--exec-calls", type=int, default=30, help="calls for `docker exec` per call")
    parser.add_argument("--before", default=BEFORE, help="git commit of the 'before' code")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the before/after comparison")
    parser.add_argument("--no-extras", action="store_true", help="only the before/after x runtime table")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--cpu-share",
        action="store_true",
        help="only the CPU share of a low-priority container beside a busy process (needs root)",
    )
    args = parser.parse_args()

    limits = DockerLimits()
    figures: dict[str, dict] = {}
    if args.cpu_share:
        console.print(f"cores: {os.cpu_count()}, load {os.getloadavg()[0]:.1f}, image: {args.image}")
        figures["cpu_share"] = cpu_share(args)
        _write(args.json, figures)
        return
    runtimes = ["runc"] + (["runsc"] if "runsc" in engine_runtimes(docker_client()) else [])
    load = os.getloadavg()
    console.print(f"cores: {os.cpu_count()}, load {load[0]:.1f}, image: {args.image}, limits: {limits}")
    figures["compare"] = compare(args, limits, runtimes)
    table = Table(
        f"pool of {args.pool_size}; median (min-max) of {args.rounds} rounds",
        "start s",
        "print(1) p50 ms",
        "print(1) p99 ms",
        "churn sessions/s",
    )
    for name, f in figures["compare"].items():
        rows = f["rounds"]
        table.add_row(
            name,
            _spread(rows, "start_s", 2),
            _spread(rows, "p50_ms", 2),
            _spread(rows, "p99_ms", 2),
            _spread(rows, "sessions_per_s", 1),
        )
    console.print(table)
    figures["load_average"] = {"before": load[0], "after": os.getloadavg()[0]}
    if args.no_extras:
        _write(args.json, figures)
        return

    with DockerSandbox(pool_size=args.pool_size, image=args.image, limits=limits) as sandbox:
        figures["pool"] = {"start_s": sandbox.pool_start_seconds, "containers": args.pool_size}
        figures["warm pool, 1 session"] = session_latency(sandbox, args.calls)
        figures["warm pool, throughput"] = pool_throughput(sandbox, args.seconds)
        figures["memory"] = memory_per_container(sandbox)  # idle, after use: template + spare + worker
    figures["docker exec per call"] = docker_exec_per_call(args.image, limits, args.exec_calls)
    figures["docker run per call"] = docker_run_per_call(args.image, limits, args.run_calls)
    with LocalSandbox(allow_host_execution=True, pool_size=args.pool_size) as local:
        figures["LocalSandbox, 1 session"] = session_latency(local, args.calls)
        figures["LocalSandbox, throughput"] = pool_throughput(local, args.seconds)
        figures["LocalSandbox, session churn"] = session_churn(local, args.seconds)

    table = Table("print(1), now, runc", "p50 ms", "p90 ms", "p99 ms", "mean ms", "calls/s")
    for name in (
        "warm pool, 1 session",
        "docker exec per call",
        "docker run per call",
        "LocalSandbox, 1 session",
    ):
        f = figures[name]
        table.add_row(
            name,
            f"{f['p50_ms']:.2f}",
            f"{f['p90_ms']:.2f}",
            f"{f['p99_ms']:.2f}",
            f"{f['mean_ms']:.2f}",
            f"{1e3 / f['mean_ms']:.0f}",
        )
    for name in ("warm pool, throughput", "LocalSandbox, throughput"):
        f = figures[name]
        table.add_row(f"{name} ({f['sessions']} sessions)", "", "", "", "", f"{f['calls_per_s']:.0f}")
    console.print(table)
    console.print(
        f"LocalSandbox session churn {figures['LocalSandbox, session churn']['sessions_per_s']:.0f}/s; "
        f"pool start: {figures['pool']['start_s']:.2f} s for {args.pool_size} containers; "
        f"memory per warm container: {figures['memory']['container_mib']:.1f} MiB in the container + "
        f"{figures['memory']['shim_mib']:.1f} MiB containerd shim on the host"
    )
    figures["load_average"]["end"] = os.getloadavg()[0]
    _write(args.json, figures)


def _write(path: str | None, figures: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
