"""What `stare-agents sandbox doctor` checks: the engine, the image, the limits seen from inside, a round trip."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from stare_agents.sandbox.docker_backend import (
    DEFAULT_IMAGE,
    GVISOR_EXTRA_PIDS,
    RUNTIMES_HINT,
    DockerLimits,
    DockerSandbox,
    docker_client,
    engine_runtimes,
)
from stare_agents.sandbox.errors import SandboxError
from stare_agents.sandbox.session import Session

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
}, allow_nan=False))
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


def engine_view(session: Session) -> dict:
    """The limits the engine applied to the session's container (HostConfig), for what gVisor hides."""
    container = session.runner.channel.container
    container.reload()
    host = container.attrs["HostConfig"]
    return {
        "memory": host.get("Memory"),
        "pids": host.get("PidsLimit"),
        "nano_cpus": host.get("NanoCpus"),
        "security_opt": host.get("SecurityOpt") or [],
    }


def check_limits(
    seen: dict, limits: DockerLimits, engine: dict | None = None, gvisor: bool = False
) -> list[Check]:
    """Each limit as seen from inside; where the container cannot see it (gVisor shows no cgroup files
    and no NoNewPrivs), as the engine applied it (`engine`, from engine_view)."""
    engine = engine or {}
    memory = int(seen["memory_limit"]) if seen["memory_limit"] not in (None, "max") else None
    pids = int(seen["pids_limit"]) if seen["pids_limit"] not in (None, "max") else None
    cpus, no_new_privs = seen["cpu_quota"], seen["no_new_privs"]
    where = {}
    if memory is None and engine.get("memory"):
        memory, where["memory"] = engine["memory"], " (set by the engine; not visible inside gVisor)"
    if pids is None and engine.get("pids"):
        pids = engine["pids"] - (GVISOR_EXTRA_PIDS if gvisor else 0)
        where["pids"] = f" (engine: {engine['pids']}, of which {GVISOR_EXTRA_PIDS} for gVisor's sentry)"
    if cpus is None and engine.get("nano_cpus"):
        cpus, where["cpus"] = engine["nano_cpus"] / 1e9, " (set by the engine)"
    if no_new_privs is None and "no-new-privileges" in engine.get("security_opt", []):
        no_new_privs, where["nnp"] = "1", " (set by the engine)"
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
            f"{memory // 2**20 if memory else None} MB{where.get('memory', '')}",
        ),
        Check("pids limit", pids == limits.pids, f"{pids}{where.get('pids', '')}"),
        Check("cpu quota", cpus == limits.cpus, f"{cpus} CPUs{where.get('cpus', '')}"),
        Check("no capabilities", int(seen["cap_eff"] or "1", 16) == 0, f"CapEff {seen['cap_eff']}"),
        Check("no-new-privileges", no_new_privs == "1", f"NoNewPrivs {no_new_privs}{where.get('nnp', '')}"),
        Check("no host environment", not seen["host_env"], f"extra variables: {seen['host_env']}"),
    ]


# A session that leaves what the reset must remove: a process in a session of its own, a locked folder, a
# SysV segment (where it may create one); the next session on the same container reports what it sees.
LEAVE_BEHIND = r"""
import ctypes, os, subprocess
subprocess.Popen(["sleep", "300"], start_new_session=True)
os.makedirs("/tmp/left/inner")
os.chmod("/tmp/left", 0)
ctypes.CDLL(None).shmget(0x5354, 4096, 0o1600)
"""
LOOK_AROUND = r"""
import json, os
def stat(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
runner = stat(1)[3]
foreign = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())
           and stat(p)[3] != runner]
ipc = [line for kind in ("shm", "msg", "sem") if os.path.exists(f"/proc/sysvipc/{kind}")
       for line in open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]]
print(json.dumps({"processes": foreign, "ipc": ipc, "tmp": os.listdir("/tmp")}, allow_nan=False))
"""


def check_isolation(sandbox: DockerSandbox) -> Check:
    """One session leaves state behind; the next one on the same container must see none of it."""
    with sandbox.session() as first:
        first.run(LEAVE_BEHIND, timeout_s=20)
        container = first.runner
    with sandbox.session() as second:
        seen = json.loads(second.run(LOOK_AROUND, timeout_s=20).stdout or "{}")
        same = second.runner is container
    clean = same and seen == {"processes": [], "ipc": [], "tmp": []}
    return Check(
        "nothing survives a session",
        clean,
        "process, locked folder, SysV segment: gone" if clean else f"{seen}",
    )


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


def run_doctor(image: str = DEFAULT_IMAGE, runtime: str | None = None) -> list[Check]:
    """runtime: the container runtime to check (None: the engine's default; "runsc": gVisor)."""
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
    runtimes = engine_runtimes(client)
    if runtime is None:  # gVisor is optional: report it, never fail on it
        detail = (
            "registered as runsc" if "runsc" in runtimes else f"not registered (optional): {RUNTIMES_HINT}"
        )
        checks.append(Check("gVisor runtime", True, detail))
    elif runtime not in runtimes:
        checks.append(Check(f"runtime {runtime}", False, f"the engine has {runtimes}; {RUNTIMES_HINT}"))
        return checks
    else:
        checks.append(Check(f"runtime {runtime}", True, f"registered (the engine has {', '.join(runtimes)})"))
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        checks.append(Check("image", False, f"{image} is missing: `stare-agents sandbox build [--offline]`"))
        return checks
    checks.append(Check("image", True, f"{image} ({found.attrs.get('Size', 0) / 1e6:.0f} MB)"))
    limits = DockerLimits()
    try:
        with DockerSandbox(pool_size=1, image=image, limits=limits, runtime=runtime) as sandbox:
            with sandbox.session() as session:
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
                preloaded = session.run(
                    "import sys\nprint(all(m in sys.modules for m in ('numpy', 'sympy')))"
                )
                checks.append(
                    Check(
                        "numpy, sympy pre-imported",
                        preloaded.stdout == "True\n",
                        "sessions fork from a template",
                    )
                )
                engine = engine_view(session)
                checks += check_limits(probe_limits(session), limits, engine, sandbox.gvisor)
                denied = session.runner.info.get("denied", [])
                checks.append(
                    Check(
                        "syscall filter",
                        "io_uring_setup" in denied and "socket(AF_ALG)" in denied,
                        f"on top of the engine's seccomp profile, denies: {', '.join(denied)}",
                    )
                )
                p50, p99 = round_trip_ms(session)
                checks.append(Check("round trip print(1)", True, f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"))
            checks.append(check_isolation(sandbox))
    except SandboxError as exc:
        checks.append(Check("sandbox", False, str(exc)))
    return checks
