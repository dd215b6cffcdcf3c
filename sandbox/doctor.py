"""What `stare-agents sandbox doctor` checks: the engine, the image, the limits seen from inside, a round trip."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from stare_agents.sandbox.docker_backend import DEFAULT_IMAGE, DockerLimits, DockerSandbox, docker_client
from stare_agents.sandbox.pool import SandboxError, Session

# Runs inside a container and reports what the code there can see and do.
LIMITS_PROBE = r"""
import json, os, socket

def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None

status = dict(line.split(":\t", 1) for line in read("/proc/self/status").splitlines() if ":\t" in line)
cpu_max = read("/sys/fs/cgroup/cpu.max")
quota, period = (cpu_max.split() if cpu_max else
                 (read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")))
def writable(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return True
    except OSError:
        return False
def connects(host):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((host, 80))
        return True
    except OSError:
        return False
    finally:
        s.close()
interfaces = [l.split(":")[0].strip() for l in read("/proc/net/dev").splitlines()[2:]]
print(json.dumps({
    "uid": os.getuid(),
    "interfaces": interfaces,
    "connects_out": connects("172.17.0.1") or connects("1.1.1.1"),
    "root_writable": writable("/stare-probe") or writable("/etc/stare-probe"),
    "tmp_writable": writable("/tmp/stare-probe"),
    "memory_limit": read("/sys/fs/cgroup/memory.max") or read("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "pids_limit": read("/sys/fs/cgroup/pids.max") or read("/sys/fs/cgroup/pids/pids.max"),
    "cpu_quota": None if quota in (None, "max", "-1") else int(quota) / int(period),
    "cap_eff": status.get("CapEff"),
    "no_new_privs": status.get("NoNewPrivs"),
    "host_env": sorted(k for k in os.environ if k not in ("PATH", "HOME", "TMPDIR", "LANG", "HOSTNAME")
                       and not k.endswith("_NUM_THREADS") and not k.startswith("PYTHON") and k != "MPLBACKEND"),
}))
"""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def probe_limits(session: Session) -> dict:
    result = session.run(LIMITS_PROBE, timeout_s=20)
    if result.status != "ok":
        raise SandboxError(f"the limits probe failed ({result.status}): {result.stderr}")
    return json.loads(result.stdout)


def check_limits(seen: dict, limits: DockerLimits) -> list[Check]:
    memory = int(seen["memory_limit"]) if seen["memory_limit"] not in (None, "max") else None
    pids = int(seen["pids_limit"]) if seen["pids_limit"] not in (None, "max") else None
    return [
        Check("non-root user", seen["uid"] != 0, f"uid {seen['uid']}"),
        Check(
            "no network", seen["interfaces"] == ["lo"] and not seen["connects_out"], f"{seen['interfaces']}"
        ),
        Check("read-only root", not seen["root_writable"], "writing / and /etc fails"),
        Check("tmpfs /tmp writable", seen["tmp_writable"], "/tmp"),
        Check(
            "memory limit",
            memory == limits.memory_mb * 1024 * 1024,
            f"{memory // 2**20 if memory else None} MB",
        ),
        Check("pids limit", pids == limits.pids, f"{pids}"),
        Check("cpu quota", seen["cpu_quota"] == limits.cpus, f"{seen['cpu_quota']} CPUs"),
        Check("no capabilities", int(seen["cap_eff"] or "1", 16) == 0, f"CapEff {seen['cap_eff']}"),
        Check("no-new-privileges", seen["no_new_privs"] == "1", f"NoNewPrivs {seen['no_new_privs']}"),
        Check("no host environment", not seen["host_env"], f"extra variables: {seen['host_env']}"),
    ]


def round_trip_ms(session: Session, calls: int = 300) -> tuple[float, float]:
    """(p50, p99) in ms of `print(1)` through one warm session."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        result = session.run("print(1)")
        times.append((time.perf_counter() - started) * 1e3)
        if result.stdout != "1\n":
            raise SandboxError(f"print(1) returned {result}")
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]


def run_doctor(image: str = DEFAULT_IMAGE) -> list[Check]:
    checks: list[Check] = []
    try:
        client = docker_client(timeout_s=10)
    except SandboxError as exc:
        return [Check("docker engine", False, str(exc))]
    info = client.info()
    checks.append(
        Check(
            "docker engine",
            True,
            f"{info.get('ServerVersion')} ({info.get('Driver')}, cgroup v{info.get('CgroupVersion', '?')}, "
            f"{info.get('NCPU')} CPUs)",
        )
    )
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        checks.append(Check("image", False, f"{image} is missing: `stare-agents sandbox build [--offline]`"))
        return checks
    checks.append(Check("image", True, f"{image} ({found.attrs.get('Size', 0) / 1e6:.0f} MB)"))
    limits = DockerLimits()
    try:
        with DockerSandbox(pool_size=1, image=image, limits=limits) as sandbox, sandbox.session() as session:
            checks.append(Check("pool start", True, f"1 container in {sandbox.pool_start_seconds:.2f} s"))
            versions = session.run(
                "import sys, numpy, scipy, sympy\n"
                "print(sys.version.split()[0], numpy.__version__, scipy.__version__, sympy.__version__)",
                timeout_s=60,
            )
            checks.append(
                Check(
                    "python, numpy, scipy, sympy",
                    versions.status == "ok",
                    versions.stdout.strip() or versions.stderr.strip()[-200:],
                )
            )
            preloaded = session.run("import sys\nprint(all(m in sys.modules for m in ('numpy', 'sympy')))")
            checks.append(
                Check(
                    "numpy, sympy pre-imported", preloaded.stdout == "True\n", "sessions fork from a template"
                )
            )
            checks += check_limits(probe_limits(session), limits)
            p50, p99 = round_trip_ms(session)
            checks.append(Check("round trip print(1)", True, f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"))
    except SandboxError as exc:
        checks.append(Check("sandbox", False, str(exc)))
    return checks
