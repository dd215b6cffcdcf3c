"""A trainer whose local sandbox runs hostile code: run as a script by test_sandbox_local_reach.py.

    python local_reach_trainer.py '{"project": ..., "marker": ...}'

It starts a LocalSandbox with two interpreters from a project folder of its own (a copy of
envs/_grader_worker.py in it), gives session B a variable and a scratch file, and has session A's code try
what a hostile model's code would: connect to the Docker socket, chmod and utime the project's file, signal
this process and B's interpreter (by its pid on the host), read B's scratch file and a token in this
process's home folder ($HOME), and find this process in /proc (its command line carries `marker`). Then B must still hold its variable and the file must be as it
was. Prints one JSON object: what the code reported, and what the trainer saw.
"""

from __future__ import annotations

import json
import os
import sys

ATTACK = r"""
import errno, json, os, signal, socket
report = {"uid": os.getuid()}
for path in DOCKER_SOCKETS:
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(path)
        report["docker " + path] = "reached"
    except OSError as exc:
        report["docker " + path] = type(exc).__name__
    finally:
        sock.close()
for name, attempt in (
    ("chmod", lambda: os.chmod(PROJECT_FILE, 0)),
    ("utime", lambda: os.utime(PROJECT_FILE, (1, 1))),
    ("write", lambda: open(PROJECT_FILE, "a").write("pwned")),
):
    try:
        attempt()
        report[name] = "done"
    except OSError as exc:
        report[name] = errno.errorcode.get(exc.errno, type(exc).__name__)
for name, pid, sig in (("signal trainer", TRAINER, 0), ("kill other session", OTHER, signal.SIGKILL)):
    try:
        os.kill(pid, sig)
        report[name] = "done"
    except OSError as exc:
        report[name] = type(exc).__name__
for name, path in (("read other scratch", OTHER_FILE), ("read home", HOME_FILE)):
    try:
        report[name] = open(path).read()
    except OSError as exc:
        report[name] = type(exc).__name__
seen = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            if MARKER.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                seen.append(int(entry))
        except OSError:
            pass
report["trainer in /proc"] = seen
print(json.dumps(report))
"""


def host_pid(outer: int, ns_pid: int) -> int:
    """The host's pid of the process that is `ns_pid` in its own PID namespace, below the runner `outer`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    stack = [outer]
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status") as f:
                spaces = next(line for line in f if line.startswith("NSpid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        if int(spaces[-1]) == ns_pid:
            return pid
    raise LookupError(f"no process {ns_pid} under {outer}")


def main(options: dict) -> dict:
    from stare_agents.sandbox import LocalSandbox

    project = options["project"]
    os.chdir(project)
    target = os.path.join(project, "envs", "_grader_worker.py")
    before = os.stat(target)
    home_file = os.path.expanduser("~/.stare-test-token")  # a token in the trainer's home folder
    with open(home_file, "w") as handle:
        handle.write("home-secret")
    with (
        LocalSandbox(2, allow_host_execution=True, preimport=()) as sandbox,
        sandbox.session() as other,
        sandbox.session() as attacker,
    ):
        setup = (
            "import os\nx = 41\nopen('secret.txt', 'w').write('b-secret')\nprint(os.getpid(), os.getcwd())"
        )
        ns_pid, folder = other.run(setup).stdout.split()
        other_pid = host_pid(other.runner.channel.process.pid, int(ns_pid))
        values = {
            "DOCKER_SOCKETS": ("/var/run/docker.sock", "/run/docker.sock"),
            "PROJECT_FILE": target,
            "TRAINER": os.getpid(),
            "OTHER": other_pid,
            "OTHER_FILE": os.path.join(folder, "secret.txt"),
            "MARKER": options["marker"],
            "HOME_FILE": home_file,
        }
        code = "".join(f"{name} = {value!r}\n" for name, value in values.items()) + ATTACK
        result = attacker.run(code)
        after = os.stat(target)
        return {
            "code": json.loads(result.stdout) if result.ok else result.output(),
            "other session": other.run("print(x)").stdout.strip(),
            "other interpreter alive": os.path.exists(f"/proc/{other_pid}"),
            "file unchanged": (after.st_mode, after.st_mtime_ns, after.st_size)
            == (before.st_mode, before.st_mtime_ns, before.st_size),
            "trainer uid": os.getuid(),
        }


if __name__ == "__main__":
    print("REPORT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
