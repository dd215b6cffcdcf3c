"""The interpreter behind a sandbox session: a supervisor process and the worker it drives.

This file runs in two places with the standard library only: as the main process (PID 1) of every sandbox
container, and as a plain subprocess for `LocalSandbox`. The host imports it too, for the framing helpers.

    host --frames on stdin/stdout--> supervisor --frames on a pipe pair--> worker (the Python the code runs in)

The supervisor holds no user state and never runs user code. Per call it hands the code to the worker,
reads the worker's file descriptors 1 and 2 (pipes, so output written by C extensions and subprocesses is
caught as well), keeps the head and the tail of each stream up to a cap, enforces the timeout and reports
one result frame. The worker keeps the session's namespace between calls.

Timeout: at the deadline the supervisor sends SIGINT, which raises KeyboardInterrupt inside the running
code; the worker unwinds, the call is reported as "timeout" and the session keeps every variable, including
whatever the interrupted call had already assigned. If the code does not stop within the grace period
(it swallows the interrupt, it is stuck in C code) or a timed-out call leaves threads running, the worker is
killed and a fresh one started: the call is still "timeout", and stderr says that the session's state was
lost. A worker that dies (signal, out of memory, segfault, os._exit) is reported as "killed" and replaced
the same way. Processes the code starts do not outlive its call (in a container; locally, after a timeout).

Between sessions the host sends "reset": every process but the supervisor is killed, the scratch folder
(/tmp) and /dev/shm are emptied and a fresh worker is started.

Frames: 4-byte big-endian length + JSON header; a result frame from the supervisor is followed by the raw
stdout and stderr bytes whose lengths the header gives. In a container the host starts this file as
`python3 -I -c <its source>`, so the image never holds a stale copy of it.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import io
import json
import linecache
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
import weakref

_LEN = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024


def encode_frame(header: dict, *blobs: bytes) -> bytes:
    payload = json.dumps(header, separators=(",", ":")).encode()
    return b"".join((_LEN.pack(len(payload)), payload, *blobs))


def _read_exact(fd: int, n: int) -> bytes | None:
    """Blocking read of exactly n bytes from fd; None on EOF."""
    chunks = []
    while n:
        try:
            chunk = os.read(fd, n)
        except InterruptedError:
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame_fd(fd: int) -> dict | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (size,) = _LEN.unpack(head)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[written:]


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


# --------------------------------------------------------------------------------------------- worker


def _move_high(fd: int) -> int:
    """Duplicate fd to a high close-on-exec number so the user's subprocesses never inherit it."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200)
    os.close(fd)
    return high


def _format_exception(exc: BaseException) -> str:
    tb = exc.__traceback__
    # drop the runner's own frames, keep the user's (files named "<cell N>")
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _compile_cell(source: str, filename: str, echo: bool):
    """Compile source; with echo, the value of a trailing expression is printed (like a notebook cell)."""
    import ast

    tree = ast.parse(source, filename, "exec")
    last = None
    if echo and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


_popens: weakref.WeakSet = weakref.WeakSet()  # the code's subprocess.Popen objects


def _track_popens() -> None:
    """Remember every Popen the code makes, so reaping never steals the exit status it will wait for."""
    if getattr(subprocess.Popen, "_stare_tracked", False):
        return
    subprocess.Popen._stare_tracked = True
    original_init = subprocess.Popen.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _popens.add(self)

    subprocess.Popen.__init__ = __init__


def _reap_children(pids: list[int]) -> None:
    """Collect the zombies among `pids` (killed by the supervisor) that no Popen object will wait for."""
    waited_for = {p.pid for p in list(_popens) if p.returncode is None}
    for pid in pids:
        if pid in waited_for:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def worker_main(ctl_in: int, ctl_out: int, forked: bool = False) -> None:
    """Serve calls on the control pipes until they close. forked: a spare made by the template (below)."""
    worker_pid = os.getpid()
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux") and not forked:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:  # when memory runs out, the kernel should pick this process, never the supervisor
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    memory_bytes = int(os.environ.pop("STARE_SANDBOX_MEMORY_BYTES", "0") or 0)
    if memory_bytes > 0:  # local backend only: a container's memory is bounded by its cgroup instead
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    ctl_in, ctl_out = _move_high(ctl_in), _move_high(ctl_out)
    saved_out = _move_high(os.dup(1))
    saved_err = _move_high(os.dup(2))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _track_popens()
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    cell = 0

    while True:
        try:
            request = read_frame_fd(ctl_in)
        except KeyboardInterrupt:  # an interrupt that arrived just after a call ended
            continue
        if request is None:
            os._exit(0)
        if request.get("op") == "ping":  # the supervisor checks that a spare lives before handing it over
            try:
                _write_all(ctl_out, encode_frame({"status": "ok"}))
            except OSError:
                os._exit(1)
            continue
        if forked and cell == 0:  # a spare from the template, now given its session: become ordinary
            os.setsid()
            if libc is not None:
                libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            if "numpy" in sys.modules:  # its own random state, not the template's
                sys.modules["numpy"].random.seed()
        cell += 1
        status = "error"
        out = err = None
        if request.get("reap"):  # the supervisor killed processes the code forked: collect the zombies
            _reap_children(request["reap"])
        try:
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            # line-buffered, as on a terminal: print() output keeps its place among the lines that
            # subprocesses and C code write straight to the file descriptors
            out = io.TextIOWrapper(
                io.FileIO(1, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True
            )
            err = io.TextIOWrapper(
                io.FileIO(2, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True
            )
            sys.stdout, sys.stderr = out, err
            scope = (
                {"__name__": "__main__", "__builtins__": builtins} if request.get("stateless") else namespace
            )
            source = request["code"]
            filename = f"<cell {cell}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                body, last = _compile_cell(source, filename, bool(request.get("echo")))
                exec(body, scope)
                if last is not None:
                    value = eval(last, scope)
                    if value is not None:
                        print(repr(value))
                status = "ok"
            except SystemExit as exc:
                if exc.code in (None, 0):
                    status = "ok"
                else:
                    status = "error"
                    print(exc.code if isinstance(exc.code, str) else f"SystemExit: {exc.code}", file=err)
            except KeyboardInterrupt:
                status = "interrupted"
            except BaseException as exc:
                status = "error"
                err.write(_format_exception(exc))
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except KeyboardInterrupt:
            status = "interrupted"
        except BaseException as exc:  # the runner's own bookkeeping failed (e.g. the code closed fds)
            status = "error"
            with contextlib.suppress(OSError):
                os.write(saved_err, f"sandbox runner error: {exc!r}\n".encode())
        if os.getpid() != worker_pid:  # a process the code forked fell through to here: end it quietly
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            os._exit(0 if status == "ok" else 1)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (out, err, sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except BaseException:
                pass
        if libc is not None:
            libc.fflush(None)
        import threading

        reply = encode_frame({"status": status, "threads": threading.active_count()})
        try:
            _write_all(ctl_out, reply)
        except OSError:
            os._exit(1)


# ------------------------------------------------------------------------------------------- template
#
# A fresh interpreter per session costs a Python start plus the imports the code makes (numpy ~0.1 s,
# sympy ~0.5 s of CPU, again for every session). The template is a pristine interpreter that has imported
# `preimport` and never runs user code; each session's worker is forked from it (copy-on-write, the
# modules already loaded and their pages shared). The template keeps one spare worker forked ahead, so a
# reset between sessions only kills the old worker and hands over the spare.
# Template and spare are non-dumpable from birth (code in the container can neither ptrace them nor read
# their memory or pipes) and stay in the supervisor's session, which the code's processes cannot join; the
# stray-process sweep spares exactly that session. A spare becomes an ordinary worker (own session,
# dumpable, reseeded) when it receives its first call. If the code kills or stops the template or the
# spare, the supervisor notices, falls back to starting workers the slow way, and makes a new template
# between sessions, when none of the code's processes is left. Noticing takes a ping: a spare that the
# code's kill(-1) hit may still be exiting when it is handed over (waitpid cannot tell it from a live one,
# least of all on a busy machine), but a process with SIGKILL pending never runs Python again, so only a
# spare that answers the supervisor, after every process of the code is gone, is handed over.


def template_main(sock_fd: int, workdir: str, preimport: list[str]) -> None:
    import importlib
    import socket

    libc = _libc()
    if libc is not None:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    sock = socket.socket(fileno=sock_fd)
    sock.sendall(b"A")  # armed: nothing can tamper with this process any more
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("500")  # out of memory: workers (1000) go first, then this, never the supervisor
    memory_bytes = int(os.environ.pop("STARE_SANDBOX_MEMORY_BYTES", "0") or 0)
    if memory_bytes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("ast", "fcntl", "threading", *preimport):  # the worker's own lazy imports, then the user's
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if "numpy" in sys.modules:  # loaded lazily by numpy; every worker reseeds it
        with contextlib.suppress(Exception):
            importlib.import_module("numpy.random")
    _track_popens()
    import gc

    gc.collect()
    gc.freeze()  # the workers' garbage collector then leaves these objects (and their shared pages) alone
    sock.sendall(b"R")  # ready to fork workers
    while True:
        try:
            command = sock.recv(1)
        except InterruptedError:
            continue
        if command != b"F":
            os._exit(0)
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid_r, pid_w = os.pipe()
        middle = os.fork()
        if middle == 0:  # double fork: the worker is re-parented to the supervisor, which can wait for it
            try:
                worker = os.fork()
                if worker == 0:  # a spare worker: in the supervisor's session and non-dumpable until used
                    for fd in (sock.fileno(), to_worker_w, from_worker_r, out_r, err_r, pid_r, pid_w):
                        os.close(fd)
                    devnull = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(devnull, 0)
                    os.dup2(out_w, 1)
                    os.dup2(err_w, 2)
                    for fd in (devnull, out_w, err_w):
                        os.close(fd)
                    os.chdir(workdir)
                    worker_main(to_worker_r, from_worker_w, forked=True)
                    os._exit(0)
                os.write(pid_w, struct.pack(">I", worker))
            finally:
                os._exit(0)
        os.close(pid_w)  # so that the read below ends if the middle process could not fork
        os.waitpid(middle, 0)
        worker_pid = _read_exact(pid_r, 4)
        mine = (to_worker_w, from_worker_r, out_r, err_r)
        try:
            if worker_pid is not None:
                socket.send_fds(sock, [worker_pid], list(mine))
        finally:
            for fd in (to_worker_r, from_worker_w, out_w, err_w, pid_r, *mine):
                os.close(fd)


class _Forked:
    """The Popen-like handle of a worker forked by the template (a child of the supervisor after the
    double fork): pid, returncode, poll, wait, kill."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if until is not None and time.monotonic() > until:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.001)
        return self.returncode

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


# ----------------------------------------------------------------------------------------- supervisor


class _Capture:
    """Keeps the first and the last `cap // 2` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail[-self.half :])

    def result(self) -> bytes:
        tail = bytes(self.tail[-self.half :])
        if not self.truncated:
            return bytes(self.head) + tail
        head = bytes(self.head)
        # cut at UTF-8 character boundaries so the host decodes both halves cleanly
        for back in range(1, min(4, len(head)) + 1):
            byte = head[-back]
            if byte & 0xC0 == 0xC0:  # a lead byte: keep it only if its sequence is complete
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                if back < need:
                    head = head[:-back]
                break
            if byte & 0x80 == 0:
                break
        start = 0
        while start < min(4, len(tail)) and tail[start] & 0xC0 == 0x80:
            start += 1
        tail = tail[start:]
        skipped = self.total - len(head) - len(tail)
        return head + f"\n... [{skipped} bytes of output truncated] ...\n".encode() + tail


class Supervisor:
    def __init__(
        self,
        mode: str,
        python: str,
        workdir: str,
        max_output: int,
        grace_s: float,
        memory_hint: str,
        memory_bytes: int = 0,
        preimport: tuple[str, ...] = (),
        remove_workdir: bool = False,
    ) -> None:
        self.memory_bytes = memory_bytes
        self.remove_workdir = remove_workdir
        self.preimport = preimport
        self.template: subprocess.Popen | None = None
        self.template_sock = None
        self.spare: tuple[_Forked, list[int]] | None = None  # a forked, idle worker and its pipes
        self.spare_requested = False  # the template is forking one; its answer is unread
        self.mode = mode
        self.python = python
        self.max_output = max_output
        self.grace_s = grace_s
        self.memory_hint = memory_hint
        self.workdir = workdir
        self.worker: subprocess.Popen | None = None
        self.reap_next: list[int] = []  # processes killed here that may be zombie children of the worker
        self.ctl_w = self.ctl_r = self.out_r = self.err_r = -1
        # Signals from the code: PID 1 of a container only receives those it handles, and Python handles
        # SIGINT (KeyboardInterrupt). A no-op handler (not SIG_IGN, which children would inherit) makes
        # every one of these harmless here.
        for sig in (
            signal.SIGINT,
            signal.SIGTERM,
            signal.SIGHUP,
            signal.SIGQUIT,
            signal.SIGUSR1,
            signal.SIGUSR2,
            signal.SIGALRM,
        ):
            signal.signal(sig, _ignore_signal)
        libc = _libc()
        if libc is not None:
            if mode == "docker":  # nothing in the container may ptrace or read this process's memory
                libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            else:  # orphans of the code are re-parented here, so they can be reaped and killed
                # (no PDEATHSIG here: it fires when the host *thread* that started us ends; the host
                # closing our stdin ends us instead)
                libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if mode == "local":  # a session of our own: the one the template and its spares live in
            with contextlib.suppress(OSError):
                os.setsid()

    # -- worker lifecycle
    def _worker_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.workdir,
            "TMPDIR": self.workdir,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
        }
        if self.memory_bytes:
            env["STARE_SANDBOX_MEMORY_BYTES"] = str(self.memory_bytes)
        return env

    def start_template(self) -> None:
        """Start the template (only while none of the code's processes is alive) and wait until it has
        imported `preimport`, so that every session's worker starts with them."""
        import socket

        self.stop_template()
        if not self.preimport:
            return
        mine, theirs = socket.socketpair()
        process = subprocess.Popen(
            [
                *_self_command(self.python),
                "template",
                str(theirs.fileno()),
                self.workdir,
                ",".join(self.preimport),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            cwd=self.workdir,
            env=self._worker_env(),
        )
        theirs.close()
        mine.settimeout(120)
        try:
            armed = mine.recv(1) == b"A" and mine.recv(1) == b"R"
        except OSError:
            armed = False
        if not armed:
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()
            mine.close()
            return
        self.template, self.template_sock = process, mine

    def stop_template(self) -> None:
        """End the template and its spare. (A spare it was still forking reads end-of-file on its control
        pipe, whose other end only the template held, and exits by itself.)"""
        if self.template is not None:
            with contextlib.suppress(OSError):
                self.template.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.template.wait(timeout=5)
            self.template_sock.close()
        if self.spare is not None:
            handle, fds = self.spare
            with contextlib.suppress(OSError):
                handle.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.wait(timeout=5)
            for fd in fds:
                os.close(fd)
        self.template, self.template_sock = None, None
        self.spare, self.spare_requested = None, False
        self._reap()

    def _request_spare(self) -> None:
        os.kill(self.template.pid, signal.SIGCONT)  # in case the code stopped it
        self.template_sock.sendall(b"F")
        self.spare_requested = True

    def _collect_spare(self) -> None:
        import socket

        self.template_sock.settimeout(5)
        message, fds, _, _ = socket.recv_fds(self.template_sock, 4, 4)
        self.spare_requested = False
        if len(message) != 4 or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            raise OSError("the template answered with a short message")
        self.spare = (_Forked(_LEN.unpack(message)[0]), fds)

    def fork_worker(self) -> bool:
        """Hand over the template's spare worker (and have it fork the next one); False (and the
        template dropped) if it cannot give one now."""
        if self.template is None:
            return False
        try:
            for _ in range(2):  # a spare the code killed meanwhile is replaced once
                if self.spare is None:
                    if not self.spare_requested:
                        self._request_spare()
                    self._collect_spare()
                handle, fds = self.spare
                self.spare = None
                with contextlib.suppress(OSError):
                    os.kill(handle.pid, signal.SIGCONT)
                if handle.poll() is None and self._answers(fds[0], fds[1]):
                    break
                if handle.returncode is None:  # dying or mute: it must not linger
                    with contextlib.suppress(OSError):
                        handle.kill()
                for fd in fds:
                    os.close(fd)
            else:
                raise OSError("the spare workers keep dying")
        except OSError:
            self.stop_template()
            return False
        self.ctl_w, self.ctl_r, self.out_r, self.err_r = fds
        for fd in (self.out_r, self.err_r, self.ctl_r):
            os.set_blocking(fd, False)
        self.worker = handle
        try:
            self._request_spare()  # the next one is forked while this session runs
        except OSError:
            self.stop_template()
        return True

    @staticmethod
    def _answers(ctl_w: int, ctl_r: int, timeout_s: float = 5.0) -> bool:
        """Whether a spare answers a ping on its (blocking) control pipes: a dying one closes them instead."""
        try:
            _write_all(ctl_w, encode_frame({"op": "ping"}))
        except OSError:
            return False
        until = time.monotonic() + timeout_s
        reply = bytearray()
        while len(reply) < 4 or len(reply) < 4 + _LEN.unpack(reply[:4])[0]:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return False
            try:
                ready, _, _ = select.select([ctl_r], [], [], remaining)
                data = os.read(ctl_r, 1 << 16) if ready else b""
            except InterruptedError:
                continue
            except OSError:
                return False
            if not data:
                return False
            reply += data
        return bytes(reply) == encode_frame({"status": "ok"})

    def spawn_worker(self) -> None:
        if self.fork_worker():
            return
        to_worker_r, self.ctl_w = os.pipe()
        self.ctl_r, from_worker_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        env = self._worker_env()
        self.worker = subprocess.Popen(
            [*_self_command(self.python), "worker", str(to_worker_r), str(from_worker_w)],
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            pass_fds=(to_worker_r, from_worker_w),
            cwd=self.workdir,
            env=env,
            start_new_session=True,
        )
        for fd in (to_worker_r, from_worker_w, out_w, err_w):
            os.close(fd)
        for fd in (out_r, err_r, self.ctl_r):
            os.set_blocking(fd, False)
        self.out_r, self.err_r = out_r, err_r

    def kill_code(self) -> None:
        """SIGKILL the worker and every process the code started; the pipes stay open for draining."""
        if self.worker is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.worker.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self.worker.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=5)
        self.kill_strays(keep_worker=False)

    def stop_worker(self) -> None:
        self.kill_code()
        for fd in (self.ctl_w, self.ctl_r, self.out_r, self.err_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.ctl_w = self.ctl_r = self.out_r = self.err_r = -1
        self.worker = None
        self.reap_next = []

    def restart_worker(self) -> None:
        self.stop_worker()
        self.spawn_worker()

    def _pids(self, select_process) -> list[int]:
        """Live processes (not this one) for which select_process(pid, /proc/pid/stat fields) holds.

        A process whose main thread ended while other threads run on (the raw `exit` syscall) shows as a
        zombie ("Z") in /proc/<pid>/stat; it is alive as long as its status counts more than one thread.
        Only true zombies are left out (their parents, or this process, collect them)."""
        pids = []
        try:
            names = os.listdir("/proc")
        except OSError:  # no procfs (not Linux): nothing to find
            return pids
        for name in names:
            if not name.isdigit() or int(name) in (1, os.getpid()):
                continue
            pid = int(name)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
            except OSError:
                continue
            if fields[0] in ("Z", "X") and not _has_live_threads(pid):
                continue
            if select_process(pid, fields):
                pids.append(pid)
        return pids

    def _stray_pids(self, keep_worker: bool) -> list[int]:
        keep_pid = self.worker.pid if keep_worker and self.worker is not None else -1
        group = self.worker.pid if self.worker is not None else -1
        own_session = os.getsid(0)  # the template and its spares; the code's processes cannot join it
        me = os.getpid()

        def is_stray(pid: int, fields: list[str]) -> bool:
            if pid == keep_pid or int(fields[3]) == own_session:
                return False
            # locally, only the code's own processes: its process group, or orphans re-parented here
            return self.mode == "docker" or int(fields[2]) == group or int(fields[1]) == me

        return self._pids(is_stray)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            spare = self.spare[0] if self.spare is not None else None
            for handle in (self.worker, self.template, spare):  # reaped here, so not by its handle
                if handle is not None and pid == handle.pid:
                    handle.returncode = os.waitstatus_to_exitcode(status)

    def kill_strays(self, keep_worker: bool = True, budget_s: float = 2.0) -> list[int]:
        """SIGKILL every process the code started (all but this one and, if kept, the worker), again and
        again until none is left or `budget_s` has passed (a fork bomb keeps making new ones)."""
        killed: set[int] = set()
        until = time.monotonic() + budget_s
        while True:
            self._reap()
            pids = self._stray_pids(keep_worker)
            if not pids or time.monotonic() > until:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.001)
        self._reap()
        return sorted(killed)

    def wipe_scratch(self) -> None:
        for root in (self.workdir, "/dev/shm") if self.mode == "docker" else (self.workdir,):
            try:
                names = os.listdir(root)
            except OSError:
                continue
            for name in names:
                path = os.path.join(root, name)
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, onerror=_force_remove)
                    else:
                        os.unlink(path)
                except OSError:
                    pass

    # -- one call
    def run(self, request: dict) -> tuple[dict, bytes, bytes]:
        started = time.monotonic()
        timeout_s = float(request.get("timeout_s") or 10.0)
        cap = int(request.get("max_output") or self.max_output)
        out, err = _Capture(cap), _Capture(cap)
        notes: list[str] = []
        if self.worker is None or self.worker.poll() is not None:
            self.restart_worker()
        job = {k: request.get(k) for k in ("code", "stateless", "echo")}
        job["reap"], self.reap_next = self.reap_next, []
        try:
            _write_all(self.ctl_w, encode_frame(job))
        except OSError:  # the worker died between calls (e.g. a thread of the code ended it)
            self.restart_worker()
            _write_all(self.ctl_w, encode_frame(job))

        deadline = started + timeout_s
        interrupted = hard_killed = died = False
        reply_buf = bytearray()
        reply: dict | None = None
        streams = {self.out_r: out, self.err_r: err}
        watch = [self.ctl_r, self.out_r, self.err_r]
        while reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not interrupted:
                    interrupted = True
                    with contextlib.suppress(OSError):
                        os.kill(self.worker.pid, signal.SIGINT)
                    deadline = time.monotonic() + self.grace_s
                    continue
                hard_killed = True
                break
            try:
                ready, _, _ = select.select(watch, [], [], remaining)
            except InterruptedError:
                continue
            for fd in ready:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if fd == self.ctl_r:
                    if not data:
                        died = True
                        break
                    reply_buf += data
                    if len(reply_buf) >= 4:
                        (size,) = _LEN.unpack(reply_buf[:4])
                        if len(reply_buf) >= 4 + size:
                            reply = json.loads(bytes(reply_buf[4 : 4 + size]))
                elif data:
                    streams[fd].feed(data)
                else:
                    watch.remove(fd)
            if died:
                break

        if hard_killed or died:
            code = None
            if died and self.worker is not None:
                try:
                    code = self.worker.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    code = None
            self.kill_code()
            self._drain(streams)
            self.restart_worker()
            if hard_killed:
                status = "timeout"
                notes.append(
                    f"TimeoutError: the code ran past the {timeout_s:g} s limit and did not stop when "
                    f"interrupted; the interpreter was restarted and this session's variables were lost"
                )
            else:
                status = "killed"
                notes.append(_death_note(code, self.memory_hint))
        else:
            status = reply["status"]
            restart = False
            if interrupted or status == "interrupted":
                status = "timeout"
                message = f"TimeoutError: the code ran past the {timeout_s:g} s limit and was interrupted"
                if reply.get("threads", 1) > 1:
                    restart = True
                    message += (
                        "; threads it started were still running, so the interpreter was restarted and "
                        "this session's variables were lost"
                    )
                else:
                    message += "; the session's variables are kept"
                notes.append(message)
            # processes the code left behind end with its call (locally: only after a timeout), before
            # the pipes are drained, so that a background writer cannot keep the call open
            if restart:
                self.kill_code()
            elif status == "timeout" or self.mode == "docker":
                self.reap_next = self.kill_strays()
            self._drain(streams)
            if restart:
                self.restart_worker()
        err_bytes = err.result()
        if notes:
            if err_bytes and not err_bytes.endswith(b"\n"):
                err_bytes += b"\n"
            err_bytes += ("\n".join(notes) + "\n").encode()
        out_bytes = out.result()
        header = {
            "status": status,
            "truncated": out.truncated or err.truncated,
            "duration_s": time.monotonic() - started,
            "stdout": len(out_bytes),
            "stderr": len(err_bytes),
        }
        return header, out_bytes, err_bytes

    def _drain(self, streams: dict, budget_s: float = 0.5) -> None:
        """Read what is left in the output pipes (bounded: a live writer could go on forever)."""
        until = time.monotonic() + budget_s
        for fd, capture in streams.items():
            if fd < 0:
                continue
            while time.monotonic() < until:
                try:
                    data = os.read(fd, 1 << 16)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                capture.feed(data)

    def serve(self) -> None:
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError):  # the host went away: nobody to answer
            pass
        finally:
            self.stop_worker()
            self.stop_template()
            if self.remove_workdir:  # local backend: the host made it for us; gone with us, however we end
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _serve(self) -> None:
        self.start_template()
        self.spawn_worker()
        while True:
            request = read_frame_fd(0)
            if request is None:
                break
            op = request.get("op")
            if op == "run":
                header, out, err = self.run(request)
                _write_all(1, encode_frame(header, out, err))
            elif op == "reset":
                self.stop_worker()
                self.wipe_scratch()
                if self.preimport and (self.template is None or self.template.poll() is not None):
                    self.start_template()  # the code killed it; now none of its processes is left
                self.spawn_worker()
                _write_all(1, encode_frame({"status": "ok", "stdout": 0, "stderr": 0}))
            elif op == "ping":
                info = {"status": "ok", "stdout": 0, "stderr": 0, "uid": os.getuid(), "python": sys.version}
                _write_all(1, encode_frame(info))
            else:
                _write_all(1, encode_frame({"status": "error", "error": f"unknown op {op!r}"}))


def _ignore_signal(signum, frame) -> None:
    pass


def _has_live_threads(pid: int) -> bool:
    """Whether a process that /proc shows as a zombie still has running threads (its main thread ended
    with the raw exit syscall). Read from the status file's thread count: /proc/<pid>/task cannot be
    listed for such a process under gVisor."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1]) > 1
    except (OSError, ValueError, IndexError):
        return False
    return False


def _self_command(python: str) -> list[str]:
    """How to start this file again: by path, or (in a container, where the host passes the source with
    `python -c`, so the image never holds a stale copy) by the same source, read back from /proc."""
    if "__file__" in globals():
        return [python, "-I", os.path.abspath(__file__)]
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    source = argv[argv.index(b"-c") + 1].decode()
    return [python, "-I", "-c", source]


def _force_remove(func, path, _exc_info) -> None:
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
        func(path)
    except OSError:
        pass


def _death_note(code: int | None, memory_hint: str) -> str:
    if code is not None and code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        cause = ""
        if sig == signal.SIGKILL:
            cause = f" (most likely out of memory: the limit is {memory_hint})" if memory_hint else ""
        elif sig == signal.SIGSEGV:
            cause = " (a segmentation fault, e.g. from ctypes or unbounded recursion)"
        what = f"was killed by {name}{cause}"
    elif code is not None:
        what = f"exited with code {code}"
    else:
        what = "stopped answering"
    return f"the interpreter {what}; it was restarted and this session's variables were lost"


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        worker_main(int(argv[1]), int(argv[2]))
        return
    if argv[:1] == ["template"]:
        template_main(int(argv[1]), argv[2], [name for name in argv[3].split(",") if name])
        return
    import argparse

    parser = argparse.ArgumentParser(description="stare-agents sandbox supervisor")
    parser.add_argument("--mode", choices=("docker", "local"), default="docker")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--workdir", default="/tmp", help="scratch folder: the cwd, emptied on reset")
    parser.add_argument("--max-output", type=int, default=32 * 1024)
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--memory-hint", default="", help="the memory limit in words, for error messages")
    parser.add_argument("--memory-bytes", type=int, default=0, help="RLIMIT_AS for the worker (local mode)")
    parser.add_argument("--preimport", default="", help="comma-separated modules the template imports")
    parser.add_argument("--remove-workdir", action="store_true", help="delete --workdir on exit (local mode)")
    args = parser.parse_args(argv)
    Supervisor(
        args.mode,
        args.python,
        args.workdir,
        args.max_output,
        args.grace,
        args.memory_hint,
        args.memory_bytes,
        tuple(name for name in args.preimport.split(",") if name),
        args.remove_workdir,
    ).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
