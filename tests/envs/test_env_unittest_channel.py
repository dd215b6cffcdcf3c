"""The unit-test report channel against a submission that attacks it, under runc, gVisor (runsc) and locally.

PythonUnitTest-v0's driver (envs/_unittest_harness.py) reports on its stdout, a pipe the submission's process
can open through /proc under gVisor (non-dumpable does not guard /proc/<pid>/fd there) and, under runc, once
the driver is dumpable again. Each attack below runs for real: it reads the channel, replaces the report,
races its write, forges a report and leaves or kills the driver, or hunts for the report's key. None of
them may earn more than the submission's return values deserve: the palindrome task's constant `True`
deserves 3/5, and every attack that forges a full pass either fails or is scored 3/5 from the genuine report.

A recording wrapper around the real sandbox keeps each call's code and raw result, so that a test can see
the driver's stdout as the host received it (the key is in the code; the thief's evidence in the stdout).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import pytest
from support import require

from stare_agents.envs._unittest_harness import REPORT_TAG
from stare_agents.sandbox import DockerLimits, DockerSandbox, docker_status

RUNTIMES = ("runc", "runsc")
DESERVED = 3 / 5  # constant True on is_palindrome: 3 tests expect True, 2 expect False


class Recording:
    """The real sandbox, with each call's (code, result) kept for the test to inspect."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.calls: list[tuple[str, Any]] = []

    @contextlib.contextmanager
    def session(self, **kwargs: Any) -> Iterator[Any]:
        with self.sandbox.session(**kwargs) as session:
            yield _RecordingSession(session, self.calls)


class _RecordingSession:
    def __init__(self, session: Any, calls: list) -> None:
        self.session, self.calls = session, calls

    def run(self, code: str, **kwargs: Any) -> Any:
        result = self.session.run(code, **kwargs)
        self.calls.append((code, result))
        return result


@pytest.fixture(
    scope="module",
    params=[
        "local",
        pytest.param("runc", marks=[pytest.mark.docker, pytest.mark.timeout(300)]),
        pytest.param("runsc", marks=[pytest.mark.docker, pytest.mark.timeout(300)]),
    ],
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "local":
        yield request.getfixturevalue("local_sandbox")
        return
    available, reason = docker_status(runtime=request.param)
    require(available, f"a Docker engine with the sandbox image and the {request.param} runtime", reason)
    box = DockerSandbox(
        pool_size=1, limits=DockerLimits(memory_mb=512, pids=64, cpus=1.0), runtime=request.param
    )
    box.start()
    yield box
    box.close()


def episode(sandbox: Any, solution: str, **kwargs: Any) -> tuple[float, dict, Recording]:
    recording = Recording(sandbox)
    env = gym.make("stare_agents/PythonUnitTest-v0", sandbox=recording, **kwargs)
    env.reset(seed=0, options={"index": 0})  # is_palindrome
    _, reward, terminated, _, info = env.step(f"```python\n{solution}\n```")
    assert terminated and 0.0 <= reward <= 1.0
    assert len(recording.calls) == 1
    return reward, info, recording


def report_lines(recording: Recording) -> list[str]:
    _, result = recording.calls[0]
    return [line for line in result.stdout.splitlines() if REPORT_TAG in line]


# A process of the submission that outlives its call: double fork, own session (out of the driver's kill of
# the child's process group), started when the submission is imported.
DETACH = """
import os, signal, sys, time
DRIVER = os.getppid()
def detach(job):
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    try:
        job()
    finally:
        os._exit(0)
"""

CORRECT = """
def is_palindrome(s):
    t = ''.join(c for c in s.lower() if c.isalnum())
    return t == t[::-1]
"""

CONSTANT_TRUE = """
def is_palindrome(s):
    return True
"""

# Reads the driver's stdout (the report channel) the moment it can open it; a report it sees is replaced by
# one with every letter a pass, and "STOLEN" marks that it got there.
THIEF = (
    DETACH
    + r"""
def thief():
    import re
    until = time.monotonic() + 30
    reader = writer = None
    seen = b""
    while time.monotonic() < until:
        try:
            os.kill(DRIVER, 0)
        except OSError:
            return
        if reader is None:
            try:
                reader = os.open('/proc/%d/fd/1' % DRIVER, os.O_RDONLY | os.O_NONBLOCK)
                writer = os.open('/proc/%d/fd/1' % DRIVER, os.O_WRONLY)
            except OSError:
                reader = None
                time.sleep(0.0005)
                continue
        try:
            seen += os.read(reader, 1 << 16)
        except BlockingIOError:
            time.sleep(0.0002)
            continue
        for line in seen.split(b'\n'):
            if b'report' in line and b'outcomes' in line:
                forged = re.sub(rb'[FT](?=[PFT]*")', b'P', line)
                os.write(writer, b'STOLEN\n' + forged + b'\n')
                return
detach(thief)
"""
    + CONSTANT_TRUE
)

# Writes reports in every format the harness used (and the current one, sealed with keys it makes up or
# finds anywhere it can read), to every descriptor and to the driver's stdout, then leaves.
FORGE_LINES = r"""
def forged_lines(keys):
    import hashlib, hmac, json, re
    body = '{"load_error": null, "outcomes": "PPPPP", "errors": []}'
    lines = [body, '@@stare-report-' + '0' * 32 + '@@' + body]
    try:
        import __main__ as harness  # the child runs the harness's source: its helpers are here
        for key in keys:
            lines.append(harness.seal_report(key, json.loads(body)))
    except Exception as error:
        lines.append('no harness helper: %r' % (error,))
    return ('\n'.join(lines) + '\n').encode()

def readable_secrets():
    import re
    blob = b''
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        for entry in ('cmdline', 'environ', 'maps', 'fd/0', 'fd/200'):
            try:
                fd = os.open('/proc/%s/%s' % (pid, entry), os.O_RDONLY | os.O_NONBLOCK)
                try:
                    blob += os.read(fd, 1 << 20)
                finally:
                    os.close(fd)
            except OSError:
                pass
    try:
        with open('/proc/%d/mem' % DRIVER, 'rb') as mem:
            for line in open('/proc/%d/maps' % DRIVER):
                start, end = (int(x, 16) for x in line.split()[0].split('-'))
                mem.seek(start)
                blob += mem.read(min(end - start, 1 << 22))
    except OSError:
        pass
    keys = [bytes.fromhex(k.decode()) for k in set(re.findall(rb'[0-9a-f]{64}', blob))][:500]
    return keys + [os.urandom(32)]
"""

FORGE_AND_EXIT = (
    DETACH
    + FORGE_LINES
    + r"""
blob = forged_lines(readable_secrets())
try:
    with open('/proc/%d/fd/1' % DRIVER, 'wb') as out:
        out.write(blob)
except OSError:
    pass
sys.__stdout__.write(blob.decode())
for fd in range(0, 64):  # its own reply pipe among them: the driver then drops this process
    try:
        os.write(fd, blob)
    except OSError:
        pass
os._exit(0)
"""
)

FORGE_AND_KILL = (
    DETACH
    + FORGE_LINES
    + r"""
def forge_then_kill():
    blob = forged_lines([os.urandom(32)]).splitlines()[-1] + b'\n'  # one line, sealed with a made-up key
    try:
        with open('/proc/%d/fd/1' % DRIVER, 'wb') as out:
            out.write(blob)
    except OSError:
        pass
    os.kill(DRIVER, signal.SIGKILL)
detach(forge_then_kill)
"""
    + CORRECT.replace("return t == t[::-1]", "return None")
)

STOP_THE_DRIVER = (
    DETACH
    + """
detach(lambda: os.kill(DRIVER, signal.SIGSTOP))
time.sleep(0.2)
"""
    + CONSTANT_TRUE
)


def test_a_correct_submission_earns_everything(sandbox) -> None:
    reward, info, recording = episode(sandbox, CORRECT)
    assert reward == 1.0, info["score_details"]
    assert len(report_lines(recording)) == 1


def test_a_thief_on_the_channel_sees_nothing_and_replaces_nothing(sandbox) -> None:
    """The thief is alive while the tests run and tries to read the report as it is written: the driver
    ends every process of the submission before it writes, so the genuine report arrives, alone."""
    reward, info, recording = episode(sandbox, THIEF)
    _, result = recording.calls[0]
    assert "STOLEN" not in result.stdout, result.stdout
    assert reward == pytest.approx(DESERVED), info["score_details"]
    assert info["score_details"]["violation"] is None
    assert len(report_lines(recording)) == 1


@pytest.mark.parametrize("attack", ["forge_and_exit", "forge_and_kill"])
def test_forged_reports_earn_nothing(sandbox, attack: str, request: pytest.FixtureRequest) -> None:
    """forge_and_exit: reports in every format, sealed with a made-up key and with every 64-hex string the
    submission can read anywhere in the container, written everywhere it can; then it leaves. forge_and_kill:
    one report sealed with a made-up key on the driver's stdout, then the driver is killed before it reports."""
    solution = FORGE_AND_EXIT if attack == "forge_and_exit" else FORGE_AND_KILL
    reward, info, recording = episode(sandbox, solution)
    assert reward == 0.0 and not info["correct"], info["score_details"]
    runtime = request.node.callspec.params["sandbox"]
    if runtime == "runsc":  # gVisor lets the forgery onto the channel: the seal is what refuses it
        assert len(report_lines(recording)) >= (2 if attack == "forge_and_exit" else 1)
        violation = info["score_details"]["violation"]
        if attack == "forge_and_kill" and violation is None:
            # the race went to the driver (seen under load): it reported, every test failing (the submission
            # returns None) or stopped at its deadline (T, seen in CI under load), before the forger's line or
            # kill; that honest report, the only sealed one, is what was graded
            assert info["score_details"]["tests_passed"] == 0, info["score_details"]
            honest = [body_of(line)["outcomes"] for line in sealed(recording)]
            assert len(honest) == 1 and set(honest[0]) <= set("FT"), (honest, info["score_details"])
        elif attack == "forge_and_kill" and "expected one report line" in violation:
            # the race went both ways (seen in CI under load): the driver's honest report and the forged line
            # both reached the channel; two reports are refused whatever their seals say
            assert len(report_lines(recording)) >= 2, info["score_details"]
        elif attack == "forge_and_kill":
            assert "seal does not match" in violation, info["score_details"]
    for line in sealed(recording):  # whatever reached the host sealed with the key reports no pass
        assert body_of(line)["outcomes"] != "PPPPP"


def body_of(line: str) -> dict:
    return json.loads(line[len(REPORT_TAG) :].partition(" ")[2])


def sealed(recording: Recording) -> list[str]:
    """The report lines that reached the host sealed with the episode's key (the driver's own)."""
    code, _ = recording.calls[0]
    key = bytes.fromhex(re.search(r'"key": "([0-9a-f]{64})"', code).group(1))
    kept = []
    for line in report_lines(recording):
        assert line.startswith(REPORT_TAG)
        mac, _, body = line[len(REPORT_TAG) :].partition(" ")
        if hmac.compare_digest(mac, hmac.new(key, body.encode(), hashlib.sha256).hexdigest()):
            kept.append(line)
    return kept


def test_a_stopped_driver_is_a_timeout_worth_nothing(sandbox) -> None:
    # a stopped driver spends no CPU: the wall-clock cap (4 x the CPU limit unless given) is what ends it
    reward, info, _ = episode(
        sandbox, STOP_THE_DRIVER, tool_timeout_s=3.0, tool_wall_timeout_s=4.0, per_test_timeout_s=1.0
    )
    assert reward == 0.0 and info["grade_reason"] in ("timeout", "harness_violation"), info["score_details"]
