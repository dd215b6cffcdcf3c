"""Unit-test harness of PythonUnitTest-v0: runs in a fresh sandbox session, standard library only.

`stare_agents.envs.python_unittest` sends this file's source as the code of one sandbox call, followed by
`_driver(<params>)`. Two processes take part, and the submission lives only in the second:

    host --sandbox call--> driver (this file, the session's interpreter) --pipes--> child (`python -I`)

* The **child** imports the submission as the module `solution` (written to a fresh folder) and answers
  one request per line: call `solution.<name>(*args, **kwargs)` and reply with the returned value, encoded
  as plain data (`_encode`). Its own stdout and stderr go to /dev/null. It never sees a test, an expected
  value or the driver.
* The **driver** evaluates each test (one `assert` statement) itself; every name the test uses that is not
  a builtin is a proxy whose call is a request to the child. The comparisons, the expected values and the
  verdicts therefore stay in the driver, whose stdout (the sandbox's result channel) the child cannot write
  to: the child's descriptors are pipes to the driver, and the driver makes itself non-dumpable, so its
  /proc entries and memory are closed to the child (a non-root user in the container). What a submission can
  influence is only what its functions return, which is what is being tested.
* Time: the driver waits for each reply with a deadline (`per_test_s` per test, and the run's `budget_s`);
  a child that misses one is killed and a fresh one serves the next test. Nothing the child does can delay
  the driver past its deadlines.

The report channel (issue 21). Every process in the container runs as the same user, so the child may
signal the driver, and under gVisor it may open the driver's stdout through /proc/<pid>/fd (gVisor does not
guard those entries of a non-dumpable process; it does guard /proc/<pid>/mem and ptrace). Three things keep
the report out of its hands:

1. **Sealed.** The host sends a fresh 32-byte key with each run; the report carries an HMAC-SHA256 of its
   body under that key (`seal_report`). The key lives only in the host and in the driver's memory: not in
   any command line, environment or file, and the driver is non-dumpable from its first line to its last
   (under runc that closes its /proc entries, memory and ptrace; under gVisor its memory and ptrace). A
   report the child makes up, or one it changes, fails the host's check.
2. **Written when nothing of the submission is alive.** Before it reports, the driver kills every process
   the submission may have started and checks, twice, that none is left: its own descendants (it is a child
   subreaper where the kernel allows, so orphans stay its descendants), and in a container every process
   outside the sandbox runner's session but itself (gVisor has no subreaper; a process cannot join another
   session, so a double-forked `setsid` leaves none behind). So no process can read the report off the
   pipe, race its write or replace it. If some survive within the time bound, the driver reports nothing
   and the host scores the run as a harness violation (reward 0).
3. **Checked.** The host takes exactly one line that starts with `REPORT_TAG`, checks its seal, then its
   shape and count. Killing or stopping the driver leaves no report: reward 0, never a pass.

The driver prints one line: `REPORT_TAG` + hex HMAC + " " + JSON `{"errors": [str, ...], "load_error":
str|null, "outcomes": "PFT..."}`: one letter per test in order (P passed, F failed, T timed out) and the
messages of the first MAX_ERRORS failures (the sandbox caps its output, so the report stays small).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import hashlib
import hmac
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import time

MAX_DEPTH = 64
MAX_LINE_BYTES = 4 * 1024 * 1024  # a reply (a returned value) or request larger than this fails the test
MAX_ERRORS = 5
MAX_ERROR_CHARS = 200
REPORT_TAG = "@@stare-unittest-report@@"
SWEEP_BUDGET_S = 2.0  # ending the submission's processes before the report; past it, no report


def report_mac(key: bytes, body: str) -> str:
    """The seal of a report body under the run's key (hex HMAC-SHA256; the host checks it the same way)."""
    return hmac.new(key, REPORT_TAG.encode() + body.encode(), hashlib.sha256).hexdigest()


def seal_report(key: bytes, report: dict) -> str:
    """The report line: tag, seal, body (ASCII JSON with sorted keys)."""
    body = json.dumps(report, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return REPORT_TAG + report_mac(key, body) + " " + body


class _Unencodable(Exception):
    pass


def _encode(value, depth=0):
    """Plain data as JSON-compatible values: scalars as themselves, containers tagged. Raises _Unencodable."""
    if depth > MAX_DEPTH:
        raise _Unencodable(f"nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return {"int": str(int(value))} if abs(value) > 2**53 else int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(float(value))}
    if isinstance(value, complex):
        return {"complex": [_encode(value.real, depth + 1), _encode(value.imag, depth + 1)]}
    if isinstance(value, bytes | bytearray):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list | tuple | set | frozenset):
        tag = type(value).__name__ if type(value) in (list, tuple, set, frozenset) else _base_tag(value)
        return {tag: [_encode(item, depth + 1) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # numpy scalars and arrays
        return _encode(value.tolist(), depth + 1)
    raise _Unencodable(f"a {type(value).__name__} is not plain data")


def _base_tag(value):
    for base in (list, tuple, frozenset, set):
        if isinstance(value, base):
            return base.__name__
    raise _Unencodable(type(value).__name__)


_SCALAR_TAGS = {"int", "float", "complex", "bytes"}
_CONTAINER_TAGS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def _decode(data, depth=0):
    """The inverse of `_encode`, strict: anything else is a ValueError (the reply is not trusted)."""
    if depth > MAX_DEPTH + 1:
        raise ValueError("nested too deep")
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError("not an encoded value")
    ((tag, body),) = data.items()
    if tag == "int" and isinstance(body, str) and len(body) <= 4300:
        return int(body)
    if tag == "float" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag == "complex" and isinstance(body, list) and len(body) == 2:
        return complex(_number(_decode(body[0], depth + 1)), _number(_decode(body[1], depth + 1)))
    if tag == "bytes" and isinstance(body, str):
        return base64.b64decode(body, validate=True)
    if tag in _CONTAINER_TAGS and isinstance(body, list):
        return _CONTAINER_TAGS[tag](_decode(item, depth + 1) for item in body)
    if tag == "dict" and isinstance(body, list):
        pairs = []
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("a dict entry must be a [key, value] pair")
            pairs.append((_decode(pair[0], depth + 1), _decode(pair[1], depth + 1)))
        return dict(pairs)
    raise ValueError(f"unknown or malformed tag {tag!r}")


def _number(value):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("a complex part must be a number")
    return value


def _write_line(stream, payload):
    stream.write((json.dumps(payload, separators=(",", ":"), allow_nan=False) + "\n").encode())
    stream.flush()


# -- the child: the submission's process ------------------------------------------------------------------------
def _child(folder):
    channel_in = os.fdopen(os.dup(0), "rb")
    channel_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    sys.path.insert(0, folder)
    try:
        import solution  # noqa: F401  (the submission)

        hello = {"ready": True}
    except BaseException as error:
        hello = {"load_error": _describe(error)}
    _write_line(channel_out, hello)
    if "load_error" in hello:
        return
    module = sys.modules["solution"]
    for line in channel_in:
        request = json.loads(line)
        try:
            function = getattr(module, request["name"], None)
            if function is None:
                raise NameError("the submission defines no {!r}".format(request["name"]))
            value = function(*_decode(request["args"]), **_decode(request["kwargs"]))
            reply = json.dumps(
                {"id": request["id"], "value": _encode(value)}, separators=(",", ":"), allow_nan=False
            )
            if len(reply) >= MAX_LINE_BYTES:
                raise _Unencodable(f"the returned value takes more than {MAX_LINE_BYTES} bytes")
        except BaseException as error:
            reply = json.dumps({"id": request["id"], "error": _describe(error)}, allow_nan=False)
        channel_out.write((reply + "\n").encode())
        channel_out.flush()


def _describe(error):
    return (type(error).__name__ + ": " + str(error))[:300]


# -- the driver -------------------------------------------------------------------------------------------------
class _ChildLost(Exception):
    """The child missed its deadline, died, or broke the protocol: it is killed and replaced."""

    def __init__(self, why, timeout=False):
        super().__init__(why)
        self.timeout = timeout


class _Child:
    def __init__(self, folder, deadline):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _SOURCE + f"\n_child({folder!r})\n"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=folder,
            close_fds=True,
            start_new_session=True,
        )
        os.set_blocking(self.proc.stdin.fileno(), False)
        self.buffer = b""
        self.next_id = 0
        try:
            hello = self.read(deadline)
        except _ChildLost:
            self.kill()
            raise
        loaded = isinstance(hello, dict) and (
            hello.get("ready") is True or isinstance(hello.get("load_error"), str)
        )
        if not loaded:
            self.kill()
            raise _ChildLost("the submission's process broke the protocol while loading")
        self.load_error = hello.get("load_error")

    def read(self, deadline):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _ChildLost("timed out", timeout=True)
            if not select.select([fd], [], [], remaining)[0]:
                raise _ChildLost("timed out", timeout=True)
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise _ChildLost(f"the submission's process ended (exit status {self.exit_status()})")
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE_BYTES:
                raise _ChildLost(f"the submission's process sent more than {MAX_LINE_BYTES} bytes")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            raise _ChildLost("the submission's process broke the protocol") from None

    def send(self, data, deadline):
        """Write all of `data` to the child's stdin by the deadline (a child that stops reading cannot block)."""
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise _ChildLost("timed out", timeout=True)
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:
                raise _ChildLost(
                    f"the submission's process ended (exit status {self.exit_status()})"
                ) from None

    def call(self, name, args, kwargs, deadline):
        try:
            request = {
                "id": self.next_id,
                "name": name,
                "args": _encode(list(args)),
                "kwargs": _encode(dict(kwargs)),
            }
        except _Unencodable as error:
            raise TypeError(f"an argument to {name}() cannot be sent to the submission: {error}") from None
        data = (json.dumps(request, allow_nan=False) + "\n").encode()
        if len(data) > MAX_LINE_BYTES:
            raise TypeError(f"the arguments to {name}() take more than {MAX_LINE_BYTES} bytes")
        self.next_id += 1
        self.send(data, deadline)
        reply = self.read(deadline)
        if (
            not isinstance(reply, dict)
            or reply.get("id") != request["id"]
            or ("value" in reply) == ("error" in reply)
        ):
            raise _ChildLost("the submission's process broke the protocol")
        if "error" in reply:
            if not isinstance(reply["error"], str):
                raise _ChildLost("the submission's process broke the protocol")
            raise SubmissionError(reply["error"][:300])
        try:
            return _decode(reply["value"])
        except (ValueError, TypeError, RecursionError):
            raise _ChildLost("the submission's process returned a malformed value") from None

    def exit_status(self):
        try:
            return self.proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, 9)
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


class SubmissionError(Exception):
    """A submission's function raised; the message is its exception, as the child described it."""


class _Remote:
    """A name the submission defines, as the test sees it: calling it asks the child."""

    def __init__(self, driver, name):
        self._driver, self._name = driver, name

    def __call__(self, *args, **kwargs):
        return self._driver.call(self._name, args, kwargs)

    def __repr__(self):
        return f"<submission's {self._name}>"


class _Driver:
    def __init__(self, source, per_test_s, budget_s):
        self.folder = tempfile.mkdtemp(prefix="unittest-")
        with open(
            os.path.join(self.folder, "solution.py"), "w", encoding="utf-8", errors="surrogatepass"
        ) as f:
            f.write(source)
        self.per_test_s = per_test_s
        self.end = time.monotonic() + budget_s
        self.child = None
        self.load_failure = None  # the submission could not be loaded in time: every later call fails at once
        self.test_deadline = 0.0

    def deadline(self):
        return min(self.test_deadline, self.end)

    def call(self, name, args, kwargs):
        if self.load_failure is None and self.child is None:
            try:
                self.child = _Child(self.folder, self.deadline())
            except _ChildLost as lost:
                if lost.timeout and self.test_deadline <= self.end:
                    self.load_failure = f"TimeoutError: loading the submission took over {self.per_test_s:g}s"
                raise
            self.load_failure = self.child.load_error
        if self.load_failure is not None:
            raise SubmissionError("the submission did not load: " + self.load_failure)
        return self.child.call(name, args, kwargs, self.deadline())

    def drop_child(self):
        if self.child is not None:
            self.child.kill()
            self.child = None

    def run_test(self, test):
        code = compile(test, "<test>", "exec")
        names = {"__builtins__": builtins}
        for name in _free_names(code):
            if not hasattr(builtins, name):
                names[name] = _Remote(self, name)
        self.test_deadline = time.monotonic() + self.per_test_s
        if self.test_deadline > self.end:
            return {"passed": False, "timeout": True, "error": "not run: the time budget of the run is spent"}
        try:
            exec(code, names)
            return {"passed": True, "timeout": False, "error": None}
        except _ChildLost as lost:
            self.drop_child()
            what = f"TimeoutError: test exceeded {self.per_test_s:g}s" if lost.timeout else str(lost)
            return {"passed": False, "timeout": lost.timeout, "error": what}
        except AssertionError:
            return {"passed": False, "timeout": False, "error": "failed: " + test}
        except Exception as error:
            return {"passed": False, "timeout": False, "error": _describe(error)}


def _free_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _free_names(const)
    return names


def _prctl(option, value):
    try:
        import ctypes

        return ctypes.CDLL(None).prctl(option, value, 0, 0, 0) == 0
    except Exception:
        return False


PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def _stat(pid):
    """(state, ppid, session) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _has_live_threads(pid):
    """Whether a process /proc shows as a zombie still runs threads (its main thread left with raw exit)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1]) > 1
    except (OSError, ValueError, IndexError):
        pass
    return False


def _in_container():
    """In a sandbox container the runner is PID 1, runs as this user and is this process's parent (a
    local runner never is PID 1: there PID 1 is the host's init, and only descendants are swept)."""
    try:
        return os.getppid() == 1 and os.stat("/proc/1").st_uid == os.getuid()
    except OSError:
        return False


def _submission_pids():
    """Live processes the submission may have started: this process's descendants and, in a container,
    every process outside the runner's session (PID 1's: the runner, its template and spare) but this one."""
    me = os.getpid()
    runner_session = os.getsid(1) if _in_container() else None
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit() and int(name) not in (1, me):
            entry = _stat(int(name))
            if entry is not None:
                table[int(name)] = entry
    found = []
    for pid, (state, ppid, session) in table.items():
        if state in ("Z", "X") and not _has_live_threads(pid):
            continue  # a true zombie: nothing runs in it
        outside = runner_session is not None and session != runner_session
        ancestor, steps = ppid, 0
        while ancestor not in (me, 0, 1) and ancestor in table and steps < 4096:
            ancestor, steps = table[ancestor][1], steps + 1
        if outside or ancestor == me:
            found.append(pid)
    return found


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _end_submission_processes(budget_s=SWEEP_BUDGET_S):
    """SIGKILL the submission's processes until two sweeps in a row find none; False if the budget ran out
    first (a process can only be made by a live one, so an empty sweep after the kills means none is left)."""
    until = time.monotonic() + budget_s
    empty = 0
    while time.monotonic() < until:
        _reap()
        pids = _submission_pids()
        if not pids:
            empty += 1
            if empty == 2:
                return True
            continue
        empty = 0
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        time.sleep(0.001)
    return False


def _driver(params):
    # first of all, and never undone: the submission's processes (same user) cannot open this process's
    # /proc entries (runc), read its memory or ptrace it (both), and orphans they leave stay its descendants
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    key = bytes.fromhex(params.pop("key"))
    driver = _Driver(params["source"], params["per_test_s"], params["budget_s"])
    outcomes, errors = [], []
    try:
        for test in params["tests"]:
            result = driver.run_test(test)
            outcomes.append("P" if result["passed"] else "T" if result["timeout"] else "F")
            if not result["passed"] and len(errors) < MAX_ERRORS:
                errors.append(result["error"][:MAX_ERROR_CHARS])
        load_error = driver.load_failure[:MAX_ERROR_CHARS] if driver.load_failure else None
    finally:
        driver.drop_child()
    if not _end_submission_processes():
        sys.stderr.write("harness: processes of the submission survived every kill; no report\n")
        return
    report = {"load_error": load_error, "outcomes": "".join(outcomes), "errors": errors}
    sys.stdout.write(seal_report(key, report) + "\n")
    sys.stdout.flush()


_SOURCE = ""  # this file's text, for the child's command line: the host sets it in the code it sends
