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

Between sessions the host sends "reset": every process but the supervisor's own is killed (whatever it
looks like: a process whose main thread has ended shows as a zombie while its other threads run on), the
SysV IPC objects are removed and the scratch folders (/tmp, /dev/shm, /dev/mqueue) emptied within a time
bound; then the supervisor checks that no process, IPC object or file of the code is left before it hands
over a fresh worker, and answers "error" otherwise (the host then replaces the container).

The worker's replies are checked (status word, types, size, call number): code in the worker can write to
its control pipe, and whatever it forges there is that call's "error", never a crash. The host channel is
authenticated (see ChannelKey). A syscall filter stacked on the engine's seccomp profile denies io_uring,
AF_ALG/AF_VSOCK sockets and foreign ABIs (see install_syscall_filter).

Frames: 4-byte big-endian length + JSON header; a result frame from the supervisor is followed by the raw
stdout and stderr bytes whose lengths the header gives; between host and supervisor every frame after the
first also carries a 32-byte MAC. In a container the host starts this file as
`python3 -I -c <its source>`, so the image never holds a stale copy of it.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import io
import json
import linecache
import math
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_LEN = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a request holds the code, which the host caps at 16 MiB
RESET_BUDGET_S = 5.0  # killing, removing and wiping between sessions; past it the container is replaced


def encode_frame(header: dict, *blobs: bytes) -> bytes:
    payload = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
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
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38


# ------------------------------------------------------------------------------ the host's channel
#
# Host and supervisor sign every frame after the first: HMAC-SHA256 over a direction byte, the frame's
# number in its direction and the frame, appended as 32 bytes. The key is the content of the host's first
# frame ("hello"), read before any code runs, and lives only in the supervisor's memory, never in its
# arguments or environment. Under runc the code cannot open PID 1's pipes at all; under gVisor it can
# (it does not guard /proc/<pid>/fd of non-dumpable processes), and then it can still only break its own
# session's channel, never forge or replay a frame for a later session.

MAC_BYTES = 32


class ChannelKey:
    """Seals frames in one direction and checks the other direction's, each with its own frame count."""

    HOST = b"H"  # host -> supervisor
    SUPERVISOR = b"S"  # supervisor -> host

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.sent = 0
        self.received = 0

    def _mac(self, direction: bytes, number: int, frame: bytes) -> bytes:
        import hashlib
        import hmac

        return hmac.new(self.key, direction + number.to_bytes(8, "big") + frame, hashlib.sha256).digest()

    def seal(self, direction: bytes, frame: bytes) -> bytes:
        mac = self._mac(direction, self.sent, frame)
        self.sent += 1
        return frame + mac

    def verify(self, direction: bytes, frame: bytes, mac: bytes) -> bool:
        import hmac

        expected = self._mac(direction, self.received, frame)
        self.received += 1
        return hmac.compare_digest(expected, mac)


class Tampered(Exception):
    """A frame on the host channel failed its check: the code wrote into or read from it (gVisor)."""


class HostGone(Exception):
    """The host closed the channel."""


# ----------------------------------------------------------------------------- the syscall filter
#
# Installed by the supervisor before anything else and inherited by every process in the container, on
# top of the engine's own seccomp profile (filters stack; with no-new-privileges no capability is needed).
# It denies (EPERM) what Docker's current default profile denies and older engines (Debian's 20.10)
# allow: the io_uring_* calls (their operations bypass seccomp), socket(AF_ALG) (the kernel crypto API,
# CVE-2026-31431) and socket(AF_VSOCK) (host-guest channels); and every foreign ABI (i386 / x32), whose
# socketcall multiplexer a filter cannot inspect. Where the supervisor cannot list the SysV IPC objects or
# POSIX message queues it must remove between sessions (gVisor has no /proc/sysvipc and no /dev/mqueue),
# creating them is denied as well.

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALL_NUMBERS = {
    "x86_64": {"socket": 41, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240},
    "aarch64": {"socket": 198, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180},
}
IO_URING = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}  # same on every ABI
X32_SYSCALL_BIT = 0x40000000
DENIED_SOCKET_FAMILIES = {"AF_ALG": 38, "AF_VSOCK": 40}
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM


def syscall_filter(machine: str, block_ipc: bool, block_mqueue: bool) -> tuple[list[tuple], list[str]]:
    """The classic-BPF program of the filter for `machine` as (code, jt, jf, k) tuples, and what it denies."""
    numbers = SYSCALL_NUMBERS[machine]
    denied_calls = dict(IO_URING)
    if block_ipc:
        denied_calls.update({name: numbers[name] for name in ("shmget", "semget", "msgget")})
    if block_mqueue:
        denied_calls["mq_open"] = numbers["mq_open"]
    # (op, argument, jump-if-true label, jump-if-false label); labels resolve to relative offsets
    program: list[tuple] = [("ld", 4), ("jeq", AUDIT_ARCH[machine], None, "deny"), ("ld", 0)]
    if machine == "x86_64":
        program.append(("jge", X32_SYSCALL_BIT, "deny", None))
    program += [("jeq", number, "deny", None) for number in denied_calls.values()]
    program += [("jeq", numbers["socket"], None, "allow"), ("ld", 16)]  # args[0]: the address family
    program += [("jeq", family, "deny", None) for family in DENIED_SOCKET_FAMILIES.values()]
    program += [("label", "allow"), ("ret", _RET_ALLOW), ("label", "deny"), ("ret", _RET_EPERM)]
    labels, position = {}, 0
    for step in program:
        if step[0] == "label":
            labels[step[1]] = position
        else:
            position += 1
    instructions, position = [], 0
    for step in program:
        if step[0] == "label":
            continue
        position += 1
        if step[0] == "ld":  # BPF_LD | BPF_W | BPF_ABS
            instructions.append((0x20, 0, 0, step[1]))
        elif step[0] == "ret":  # BPF_RET | BPF_K
            instructions.append((0x06, 0, 0, step[1]))
        else:  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K; None: fall through to the next instruction
            jt = 0 if step[2] is None else labels[step[2]] - position
            jf = 0 if step[3] is None else labels[step[3]] - position
            instructions.append((0x15 if step[0] == "jeq" else 0x35, jt, jf, step[1]))
    denied = [*denied_calls, *(f"socket({name})" for name in DENIED_SOCKET_FAMILIES), "foreign ABIs"]
    return instructions, denied


def install_syscall_filter(block_ipc: bool, block_mqueue: bool) -> list[str]:
    """Install the filter on this process (and so on everything it starts); returns what it denies."""
    import platform

    machine = platform.machine()
    libc = _libc()
    if machine not in SYSCALL_NUMBERS or libc is None or not sys.platform.startswith("linux"):
        raise OSError(f"no syscall filter for {sys.platform}/{machine}")
    instructions, denied = syscall_filter(machine, block_ipc, block_mqueue)
    code = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *step) for step in instructions))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = SockFprog(len(instructions), ctypes.addressof(code))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(PR_SET_SECCOMP, 2, ctypes.byref(program), 0, 0) != 0:  # SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return denied


# ------------------------------------------------------------------------- local mode: writes confined
#
# The local backend has no container, so the supervisor confines writes with Landlock (Linux >= 5.13,
# unprivileged): it and everything it starts may create, change or remove files only under its scratch
# folder (and write to /dev/null-like devices). The project, the venv and the run folder stay as they were.
# Where the kernel has them (Landlock ABI >= 6, Linux >= 6.12) two scopes come with it: the code can signal
# no process outside its domain and connect to no abstract unix socket made outside it.

LANDLOCK_SYSCALLS = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # the same on every arch
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_WRITE_ACCESS = {  # bit: (name, first ABI that knows it)
    1 << 1: ("write_file", 1),
    1 << 4: ("remove_dir", 1),
    1 << 5: ("remove_file", 1),
    1 << 6: ("make_char", 1),
    1 << 7: ("make_dir", 1),
    1 << 8: ("make_reg", 1),
    1 << 9: ("make_sock", 1),
    1 << 10: ("make_fifo", 1),
    1 << 11: ("make_block", 1),
    1 << 12: ("make_sym", 1),
    1 << 13: ("refer", 2),
    1 << 14: ("truncate", 3),
}
LANDLOCK_SCOPES = {1 << 0: "abstract_unix_socket", 1 << 1: "signal"}  # both since ABI 6
LANDLOCK_SCOPES_SINCE = 6
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
CONFINE_ENV = "STARE_SANDBOX_CONFINE_WRITES"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        return 0
    version = libc.syscall(LANDLOCK_SYSCALLS["create_ruleset"], None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, int(version))


def confine_writes(writable_dir: str) -> None:
    """Allow this process and its descendants to write only beneath `writable_dir` (and to a few devices)
    and, where the kernel has the scopes, to signal or reach by abstract unix socket only processes of their
    own domain; OSError where Landlock is missing or refuses."""
    abi = landlock_abi()
    libc = _libc()
    if abi < 1 or libc is None:
        raise OSError("Landlock is not available here (Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK needed)")
    handled = sum(bit for bit, (_, since) in LANDLOCK_WRITE_ACCESS.items() if since <= abi)
    if abi >= LANDLOCK_SCOPES_SINCE:  # handled_access_fs, handled_access_net (none), scoped
        attr = struct.pack("=QQQ", handled, 0, sum(LANDLOCK_SCOPES))
    else:
        attr = struct.pack("=Q", handled)
    ruleset = libc.syscall(LANDLOCK_SYSCALLS["create_ruleset"], attr, len(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        file_access = handled & ((1 << 1) | (1 << 14))  # a device node: only writing and truncating apply
        for path, access in [(writable_dir, handled), *((dev, file_access) for dev in WRITABLE_DEVICES)]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                if path == writable_dir:
                    raise
                continue
            try:
                rule = struct.pack("=Qi", access, fd)
                if libc.syscall(LANDLOCK_SYSCALLS["add_rule"], ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(LANDLOCK_SYSCALLS["restrict_self"], ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


# ----------------------------------------------------------------------- local mode: namespaces of its own
#
# The local backend has no container, so before anything of the code exists the runner makes the parts of one
# that decide what the code can reach (`isolate`):
#   - namespaces of its own: user (non-root only: this user mapped to itself, so the runner is never uid 0 in
#     it), mount, PID, network (loopback only) and IPC, all in one unshare() call; without them nothing runs;
#   - the PID namespace: the supervisor is its PID 1 and /proc shows only its processes, so the code can
#     neither see nor signal the trainer, its environment processes or another session's interpreter (and the
#     kernel ends every process of the code when the supervisor ends);
#   - every mount read-only and nosuid, the scratch folder alone writable: the code cannot chmod, utime or
#     chown a file of the project, the venv or anywhere else (Landlock confines content writes, not those);
#   - folders covered by an empty read-only tmpfs with only the interpreter's own paths bound back: /run and
#     /var/run (the Docker socket and every other daemon's), the user's home (tokens, keys, caches) and the
#     scratch folder's parent (other sessions' scratch folders), and, for a runner started by root, every
#     folder others cannot search on the way to the interpreter (a pyenv under /root).
# Root then becomes `nobody`; a non-root runner re-executes itself, which drops the capabilities it held in
# its user namespace. The process the host started stays in the host's mount namespace: it waits for PID 1
# and removes the scratch folder after it (inside, that folder is a mount point and cannot be removed).
# Later user namespaces the code makes cannot undo any of it: the mounts it inherits are locked together
# (the covering tmpfs cannot be unmounted, the read-only flag not cleared).

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 1 << 18
MOUNT_SETATTR = 442  # the same on every arch
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
ALWAYS_HIDDEN = ("/run", "/var/run")  # daemons' sockets: Docker's, containerd's, D-Bus, rootless Docker's
# folders every user may write to: other programs' sockets (tmux, ssh-agent, X11), files and shared memory
SHARED_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    encoded = [None if value is None else value.encode() for value in (source, target, fstype, data)]
    _check(
        libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]), f"mount {target}"
    )


def _set_mount_attr(path: str, *, add: int = 0, clear: int = 0, recursive: bool = False) -> None:
    """mount_setattr(2): add or clear MOUNT_ATTR_* flags of the mount at `path` (and the mounts below it)."""
    attr = ctypes.create_string_buffer(struct.pack("=QQQQ", add, clear, 0, 0))
    flags = AT_RECURSIVE if recursive else 0
    result = _libc().syscall(
        ctypes.c_long(MOUNT_SETATTR),
        ctypes.c_long(AT_FDCWD),
        path.encode(),
        ctypes.c_long(flags),
        attr,
        ctypes.c_long(len(attr.raw)),
    )
    _check(result, f"mount_setattr {path}")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _first_unreachable(path: str) -> str | None:
    """The outermost folder on the way to `path` that others cannot search (o+x missing), or None."""
    current = "/"
    for part in Path(path).parts[1:]:
        if not os.stat(current).st_mode & 0o001:
            return current
        current = os.path.join(current, part)
    return None


def folders_to_cover(workdir: str, hide: list[str], needed: list[str], other_user: bool) -> list[str]:
    """The folders `isolate` covers, outermost first, none inside another: ALWAYS_HIDDEN, SHARED_SCRATCH, `hide`,
    the scratch folder's parent and (for another user) the unreachable folders on the way to `needed`. Never
    "/"."""
    wanted = [*ALWAYS_HIDDEN, *SHARED_SCRATCH, *hide, os.path.dirname(workdir)]
    if other_user:
        wanted += [folder for folder in map(_first_unreachable, needed) if folder]
    real = sorted(
        {os.path.realpath(folder) for folder in wanted if os.path.isdir(folder)}, key=lambda f: f.count("/")
    )
    covered: list[str] = []
    for folder in real:
        if folder != "/" and not any(_within(folder, outer) for outer in covered):
            covered.append(folder)
    return covered


def _bind_back(path: str, fd: int) -> None:
    """Bind the file or folder open as `fd` (O_PATH, taken before its folder was covered) at `path` again."""
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)


def enter_namespaces() -> int:
    """unshare() the namespaces and fork; returns the child's pid in the parent, 0 in the child (PID 1 of the
    new PID namespace, killed when the parent dies). Only the child enters the new mount namespace, so that
    the parent can remove the scratch folder, a mount point there, after it. OSError where the kernel refuses."""
    libc = _libc()
    if libc is None or not sys.platform.startswith("linux"):
        raise OSError("namespaces need Linux")
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    _check(libc.unshare(ctypes.c_int(flags)), "unshare")
    if flags & CLONE_NEWUSER:  # this user mapped to itself: never uid 0 inside
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    child = os.fork()
    if child == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _check(libc.unshare(ctypes.c_int(CLONE_NEWNS)), "unshare(CLONE_NEWNS)")
    return child


def wait_outside(child: int, workdir: str | None) -> None:
    """The parent's part: hand the host's pipes to the child alone, wait for it, remove the scratch folder
    (`workdir`, if given) and exit as it did."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def listening_unix_sockets() -> list[str]:
    """The paths of the unix sockets bound in this network namespace (/proc/net/unix), abstract ones left out
    (the runner's network namespace has its own)."""
    try:
        with open("/proc/net/unix", "rb") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return []
    paths = []
    for line in lines:
        fields = line.split(None, 7)  # Num RefCount Protocol Flags Type St Inode Path
        if len(fields) == 8 and fields[7].startswith(b"/"):
            paths.append(os.fsdecode(fields[7]))
    return sorted(set(paths))


def sockets_to_cover(sockets: list[str], workdir: str, covered: list[str]) -> list[str]:
    """The socket files among `sockets` that stay in sight after `covered` is covered: outside the scratch
    folder and every covered folder, and a socket still (a stale entry may have gone)."""
    import stat

    found = []
    for path in sockets:
        if any(_within(path, folder) for folder in [workdir, *covered]):
            continue
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            continue  # gone, or out of this user's reach (then also out of the code's)
    return found


def isolate(
    workdir: str, hide: list[str], needed: list[str], other_user: bool, sockets: list[str] = ()
) -> list[str]:
    """In the new mount namespace (as its owner): the mounts described above, and /dev/null over each of
    `sockets` (the host's bound unix sockets) left in sight; returns the covered folders, then those sockets."""
    workdir = os.path.realpath(workdir)
    needed = [os.path.realpath(path) for path in needed]
    covered = folders_to_cover(workdir, hide, needed, other_user)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may reach the host's mount table
    _set_mount_attr("/", add=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, recursive=True)
    # the interpreter's paths under a covered folder (outermost only), then always the scratch folder, which
    # must be a mount of its own to be made writable again
    keep = sorted({p for p in needed if any(_within(p, f) for f in covered)}, key=lambda p: p.count("/"))
    keep = [path for i, path in enumerate(keep) if not any(_within(path, outer) for outer in keep[:i])]
    fds = [(path, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path in [*keep, workdir]]
    try:
        for folder in covered:
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        for path, fd in fds:
            _bind_back(path, fd)
    finally:
        for _, fd in fds:
            os.close(fd)
    _set_mount_attr(workdir, clear=MOUNT_ATTR_RDONLY)  # bound back from the read-only tree: writable again
    for folder in covered:
        _set_mount_attr(folder, add=MOUNT_ATTR_RDONLY)
    hidden_sockets = sockets_to_cover(list(sockets), workdir, covered)
    for path in hidden_sockets:  # a socket elsewhere: connect() finds /dev/null there, no socket
        _mount("/dev/null", path, None, MS_BIND)
        _set_mount_attr(path, add=MOUNT_ATTR_RDONLY)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # this PID namespace's processes only
    os.chdir(workdir)
    return [*covered, *hidden_sockets]


def become(uid: int, gid: int) -> None:
    """Leave root for `uid`/`gid` with no supplementary groups (and with them every capability)."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() == 0 or os.getegid() != gid:
        raise OSError("still root after setuid")


def isolation_problems(workdir: str, covered: list[str]) -> list[str]:
    """What of `isolate`'s promises does not hold in this process (checked by the supervisor before it
    answers the host's hello)."""
    import socket
    import stat

    problems = []
    if os.getpid() != 1:
        problems.append(f"not PID 1 of a PID namespace of its own (pid {os.getpid()})")
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"]:
        problems.append(f"network interfaces {interfaces} (only lo expected)")
    if not os.statvfs("/").f_flag & os.ST_RDONLY:
        problems.append("/ is writable")
    if os.statvfs(workdir).f_flag & os.ST_RDONLY:
        problems.append(f"the scratch folder {workdir} is read-only")
    for folder in covered:
        if not os.path.isdir(folder):  # a socket covered by /dev/null
            if stat.S_ISSOCK(os.stat(folder).st_mode):
                problems.append(f"the socket {folder} is in reach")
        elif not os.statvfs(folder).f_flag & os.ST_RDONLY:
            problems.append(f"{folder} is not covered")
        elif folder in ALWAYS_HIDDEN and os.listdir(folder):
            problems.append(f"{folder} is not empty")
    if os.geteuid() == 0:
        problems.append("running as root")
    return problems


def _confine_from_env() -> None:
    """In the template and in spawned workers (local backend): confine writes to the folder the supervisor
    named, or end the process, so that no code runs unconfined. (The supervisor itself stays outside, so
    that it can remove the scratch folder; Landlock keeps the confined code from tracing it.)"""
    folder = os.environ.pop(CONFINE_ENV, "")
    if not folder:
        return
    try:
        confine_writes(folder)
    except OSError as exc:
        os.write(2, f"sandbox: cannot confine writes to {folder}: {exc}\n".encode())
        os._exit(70)


# --------------------------------------------------------------------------- shared state between sessions

SYSV_KINDS = ("shm", "msg", "sem")
IPC_RMID = 0


def sysv_ids(kind: str) -> list[int] | None:
    """Ids of the SysV IPC objects of one kind in this IPC namespace, whatever their permissions; None
    where /proc/sysvipc does not exist (gVisor: creating them is denied there instead)."""
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    return [int(line.split()[1]) for line in lines if line.strip()]


def remove_sysv_ipc() -> None:
    """IPC_RMID every SysV object (the code's user created them all, so it may remove them all)."""
    libc = _libc()
    if libc is None:
        return
    for kind in SYSV_KINDS:
        for ident in sysv_ids(kind) or []:
            if kind == "shm":
                libc.shmctl(ident, IPC_RMID, None)
            elif kind == "msg":
                libc.msgctl(ident, IPC_RMID, None)
            else:
                libc.semctl(ident, 0, IPC_RMID)


def empty_folder(root: str, until: float) -> bool:
    """Remove everything inside `root`, whatever its permissions, depth or size; False if `until` (a
    time.monotonic() value) passes first.

    No recursion and no long paths: only `root`'s own entries are handled. A folder is made accessible,
    its files are unlinked and its sub-folders moved up into `root`, then it is removed; the moved ones
    come up in a later pass. Only two descriptors are open at a time.
    """
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return True  # no such folder: nothing to empty
    moved = 0
    try:
        while True:
            found = False
            with os.scandir(root_fd) as entries:
                for entry in entries:
                    found = True
                    if time.monotonic() > until:
                        return False
                    moved = _remove_entry(root_fd, entry.name, moved, until)
            if not found:
                return True
    finally:
        os.close(root_fd)


def _remove_entry(root_fd: int, name: str, moved: int, until: float) -> int:
    with contextlib.suppress(IsADirectoryError, PermissionError, FileNotFoundError):
        os.unlink(name, dir_fd=root_fd)
        return moved
    with contextlib.suppress(OSError):  # an empty folder
        os.rmdir(name, dir_fd=root_fd)
        return moved
    try:  # a folder with content: nothing of the code runs now, so `name` cannot change under us
        os.chmod(name, 0o700, dir_fd=root_fd)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    except OSError:
        return moved
    try:
        with os.scandir(fd) as entries:
            for count, entry in enumerate(entries):
                if count % 256 == 0 and time.monotonic() > until:
                    return moved
                try:
                    os.unlink(entry.name, dir_fd=fd)
                    continue
                except IsADirectoryError:
                    pass
                except OSError:
                    continue
                with contextlib.suppress(OSError):
                    os.chmod(entry.name, 0o700, dir_fd=fd)  # renaming a folder writes its ".."
                for _ in range(8):
                    moved += 1
                    try:
                        os.rename(entry.name, f".stare-wipe-{moved}", src_dir_fd=fd, dst_dir_fd=root_fd)
                        break
                    except OSError:
                        continue
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=root_fd)
    return moved


class Sweep:
    """What the code leaves outside its worker, found, removed and checked gone: its processes, its SysV IPC
    objects and the files in the scratch folders.

    The code's processes are every process but PID 1, this supervisor, the supervisor's own session (the
    template and its spare live there, and the code's processes cannot join it) and, when kept, the worker.
    Uncontained (locally, without a PID namespace of its own) only the worker's process group and the
    orphans re-parented to the supervisor are the code's. `processes()` gives the supervisor's handles
    (worker, template, spare), each None where there is none.
    """

    def __init__(self, mode: str, workdir: str, contained: bool, processes: Callable[[], tuple]) -> None:
        self.mode = mode
        self.workdir = workdir
        self.contained = contained
        self.processes = processes
        self.pid = os.getpid()
        self.clean = True  # the last kill_strays left no process of the code (but the worker, if kept)

    def scratch_roots(self) -> tuple[str, ...]:
        if self.mode != "docker":
            return (self.workdir,)
        return tuple(root for root in (self.workdir, "/dev/shm", "/dev/mqueue") if os.path.isdir(root))

    def reap(self) -> None:
        """Collect every child that has ended; a handle's own process gets its exit code on the handle."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for handle in self.processes():  # reaped here, so not by its handle
                if handle is not None and pid == handle.pid:
                    handle.returncode = os.waitstatus_to_exitcode(status)

    @staticmethod
    def _scan(
        select_process, zombies: bool = False, skip: tuple[int, ...] = ()
    ) -> list[tuple[int, list[str]]]:
        """(pid, /proc/pid/stat fields after the name) of the processes (not PID 1, this one or `skip`) for
        which select_process(pid, fields) holds; fields[0] is the state, then ppid, pgrp, session, ...

        A process whose main thread ended while other threads run on (the raw `exit` syscall) shows as a
        zombie ("Z") in /proc/<pid>/stat; it is alive as long as its status counts more than one thread.
        True zombies are left out (their parents, or this process, collect them) unless `zombies`."""
        found = []
        try:
            names = os.listdir("/proc")
        except OSError:  # no procfs (not Linux): nothing to find
            return found
        left_out = (1, os.getpid(), *skip)
        for name in names:
            if not name.isdigit() or int(name) in left_out:
                continue
            pid = int(name)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if not zombies and fields[0] in ("Z", "X") and not _has_live_threads(pid):
                continue
            if select_process(pid, fields):
                found.append((pid, fields))
        return found

    @classmethod
    def _pids(cls, select_process) -> list[int]:
        """Live processes (not PID 1 or this one) for which select_process(pid, stat fields) holds."""
        return [pid for pid, _ in cls._scan(select_process)]

    def _is_code(self, keep_pid: int):
        """Whether a process (pid, stat fields) is the code's: not the supervisor's session (the template and
        its spares; the code's processes cannot join it) and not `keep_pid`."""
        worker = self.processes()[0]
        group = worker.pid if worker is not None else -1
        own_session = os.getsid(0)
        me = os.getpid()

        def is_code(pid: int, fields: list[str]) -> bool:
            if pid == keep_pid or int(fields[3]) == own_session:
                return False
            # uncontained, only the code's own processes: its process group, or orphans re-parented here
            return self.contained or int(fields[2]) == group or int(fields[1]) == me

        return is_code

    def strays(self, keep_worker: bool) -> list[int]:
        """The code's live processes (the worker too, unless kept)."""
        worker = self.processes()[0]
        keep_pid = worker.pid if keep_worker and worker is not None else -1
        return self._pids(self._is_code(keep_pid))

    def cpu_ticks(self, worker_only: bool = False) -> int:
        """The CPU time (clock ticks) of the worker and every other process of the code, live or ended but not
        yet collected: each one's user and system time plus that of the children it collected. Within a call
        this only grows (a child's time moves to its parent when collected, and the supervisor collects
        nothing during a call) except for children a process lets the kernel collect unseen (SIGCHLD ignored),
        whose time is lost: the wall-clock cap still bounds those. worker_only: read the worker alone."""
        handles = self.processes()
        total = 0
        if handles[0] is not None:
            fields = _stat_fields(handles[0].pid)
            total += _ticks(fields) if fields is not None else 0
        if worker_only:
            return total
        skip = tuple(h.pid for h in handles if h is not None)  # the worker (counted above), template, spare
        return total + sum(_ticks(fields) for _, fields in self._scan(self._is_code(-1), True, skip))

    def _only_known_processes(self, keep_worker: bool) -> bool:
        """Contained: whether /proc lists no process but this one, the template, its spare and (if kept) the
        worker. Cheaper than reading every process's stat file (gVisor: 3 ms per call)."""
        if not self.contained:
            return False
        worker, template, spare = self.processes()
        known = {1, self.pid}
        for handle in (template, spare, worker if keep_worker else None):
            if handle is not None:
                known.add(handle.pid)
        try:
            return all(int(name) in known for name in os.listdir("/proc") if name.isdigit())
        except OSError:
            return False

    def kill_strays(self, keep_worker: bool = True, budget_s: float = 2.0) -> list[int]:
        """SIGKILL every process the code started (all but the supervisor's own and, if kept, the worker),
        again and again until none is left or `budget_s` has passed (a fork bomb keeps making new ones)."""
        killed: set[int] = set()
        until = time.monotonic() + budget_s
        self.clean = False
        while True:
            self.reap()
            if self._only_known_processes(keep_worker):  # the common case, one directory read
                self.clean = True
                break
            pids = self.strays(keep_worker)
            self.clean = not pids
            if not pids or time.monotonic() > until:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.001)
        if killed:
            self.reap()
        return sorted(killed)

    def wipe(self, until: float) -> list[str]:
        """Between sessions, once the worker and every process of the code are killed: remove the IPC objects
        and empty the scratch folders by `until`, then say what is left ([]: nothing)."""
        if self.contained:  # an IPC namespace of its own
            remove_sysv_ipc()
        wiped = True
        for root in self.scratch_roots():
            wiped = empty_folder(root, until) and wiped
        problems = self.leftovers()
        if not wiped:
            problems.insert(0, f"the scratch folders could not be emptied within {RESET_BUDGET_S:g} s")
        return problems

    def leftovers(self) -> list[str]:
        """What of the code is left: processes, IPC objects, files in the scratch folders."""
        problems = []
        self.reap()
        pids = [] if self._only_known_processes(keep_worker=False) else self.strays(keep_worker=False)
        if pids:
            problems.append(f"processes of the code are alive: {pids[:10]}")
        if self.contained:
            for kind in SYSV_KINDS:
                ids = sysv_ids(kind)
                if ids:
                    problems.append(f"SysV {kind} objects are left: {ids[:10]}")
        for root in self.scratch_roots():
            try:
                names = os.listdir(root)
            except OSError:
                continue
            if names:
                problems.append(f"{root} is not empty: {sorted(names)[:5]}")
        return problems


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the process's name (state, ppid, ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ticks(fields: list[str]) -> int:
    """utime + stime + cutime + cstime (fields 14-17 of /proc/<pid>/stat) in clock ticks."""
    return sum(int(value) for value in fields[11:15])


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MIN_CPU_POLL_S = 0.01  # how often the CPU limit is checked at most (a tick is 0.01 s)
MAX_CPU_POLL_S = 0.5  # and at least


class CallTimer:
    """When to interrupt one call: once its code has used its CPU time (looked up as often as it could reach it:
    a short call is never looked at) or has run to the wall-clock cap; after the interrupt, `grace_until`."""

    def __init__(self, limits: CallLimits, clock: CpuClock, started: float) -> None:
        self.limits = limits
        self.clock = clock
        self.wall_deadline = started + limits.wall_s
        self.check_at = time.monotonic() + clock.next_check(limits.cpu_s, 0.0)
        self.grace_until = math.inf

    def reached(self, now: float) -> str | None:
        """ "cpu" or "wall" once that limit is reached, else None."""
        if now >= self.check_at:
            used = self.clock.used()
            # over the limit in two reads in a row: a child collected between two reads of one scan can count
            # twice in it, never in the next one too
            if used >= self.limits.cpu_s and self.clock.used() >= self.limits.cpu_s:
                return "cpu"
            self.check_at = now + self.clock.next_check(self.limits.cpu_s, used)
        return "wall" if now >= self.wall_deadline else None

    def next_look(self) -> float:
        """The time (time.monotonic()) at which `reached` should be asked again."""
        return min(self.wall_deadline, self.check_at)


class CpuClock:
    """The CPU seconds the code of one call has used since the clock was made (`used()`), and when to look
    next (`next_check`). Started before the job is sent; `worker_only` where no other process of the code can
    be alive (the supervisor has just removed them): then it reads one file instead of scanning /proc."""

    def __init__(self, sweep: Sweep, worker_only: bool) -> None:
        self.sweep = sweep
        self.start = sweep.cpu_ticks(worker_only)
        try:
            self.cpus = max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            self.cpus = os.cpu_count() or 1

    def used(self) -> float:
        return max(0, self.sweep.cpu_ticks() - self.start) / CLOCK_TICKS

    def next_check(self, limit_s: float, used_s: float) -> float:
        """Seconds until the code could reach `limit_s` at the earliest (all CPUs it may run on busy), within
        [MIN_CPU_POLL_S, MAX_CPU_POLL_S]: a busy call is checked a few dozen times, a short one never."""
        return min(MAX_CPU_POLL_S, max(MIN_CPU_POLL_S, (limit_s - used_s) / self.cpus))


def _pipe_empty(fd: int) -> bool:
    """Whether nothing is buffered in the pipe `fd` belongs to (either end); False if that is unknown."""
    import fcntl
    import termios

    count = ctypes.c_int(-1)
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return False
    return count.value == 0


def _discard(fd: int) -> None:
    """Read and drop what a non-blocking pipe holds."""
    while True:
        try:
            if not os.read(fd, 1 << 16):
                return
        except (BlockingIOError, InterruptedError, OSError):
            return


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


def worker_main(ctl_in: int, ctl_out: int, forked: bool = False, secret: bytes = b"") -> None:
    """Serve calls on the control pipes until they close. forked: a spare made by the template (below),
    whose first frame must be the supervisor's ping carrying `secret`; anything else ends it."""
    worker_pid = os.getpid()
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux") and not forked:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:  # when memory runs out, the kernel should pick this process, never the supervisor
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    _confine_from_env()  # local backend: before any code runs (a forked spare inherits the template's)
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
    greeted = not forked
    out = err = None  # text streams on fds 1 and 2, made again only when the code closed them

    while True:
        try:
            request = read_frame_fd(ctl_in)
        except KeyboardInterrupt:  # an interrupt that arrived just after a call ended
            continue
        if request is None:
            os._exit(0)
        if not greeted:  # only the supervisor knows the secret: a frame someone else queued ends the spare
            if request.get("op") != "ping" or request.get("secret") != secret.hex():
                os._exit(1)
            greeted = True
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
        if request.get("reap"):  # the supervisor killed processes the code forked: collect the zombies
            _reap_children(request["reap"])
        try:
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            # line-buffered, as on a terminal: print() output keeps its place among the lines that
            # subprocesses and C code write straight to the file descriptors
            if out is None or out.closed:
                out = io.TextIOWrapper(
                    io.FileIO(1, "w", closefd=False), "utf-8", "backslashreplace", line_buffering=True
                )
            if err is None or err.closed:
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

        reply = encode_frame(
            {"status": status, "threads": threading.active_count(), "call": request.get("call")}
        )
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
# Under gVisor the code can open a spare's pipes through /proc (non-dumpable does not guard them there).
# So each spare gets a secret from the template (over a socket, which /proc cannot open) and ends itself
# unless its first frame is the supervisor's ping with that secret; and before that ping, once every
# process of the code is gone, the supervisor checks that nothing is queued to the spare and throws away
# whatever was written into the pipes it reads. Nothing the code wrote there can reach the next session.


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
    _confine_from_env()
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
        secret = os.urandom(16)
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
                    worker_main(to_worker_r, from_worker_w, forked=True, secret=secret)
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
                socket.send_fds(sock, [worker_pid + secret], list(mine))
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


@dataclass
class CallEnd:
    """How the wait for one call's reply ended (see `Supervisor._wait_for_reply`)."""

    reply: dict | None = None  # the worker's reply (see _worker_reply), if one came
    interrupted: bool = False  # a limit was reached (or a cancel came) and SIGINT was sent
    limit: str = "cpu"  # which limit was reached: "cpu" (CPU time) or "wall" (the wall-clock cap)
    cpu_s: float = 0.0  # CPU seconds the code used until the wait ended
    hard_killed: bool = False  # the grace period after the interrupt passed too
    died: bool = False  # the worker's control pipe closed
    cancelled: bool = False  # the host cancelled the call or went away
    violation: str = ""  # what the code wrote to the control channel


@dataclass(frozen=True)
class Outcome:
    """What a call comes to: its status, the notes appended to its stderr, and whether the interpreter is
    killed with everything it started and a fresh one started (the session's variables lost)."""

    status: str  # one of STATUSES on the host: "ok", "error", "timeout", "killed"
    notes: tuple[str, ...] = ()
    restart: bool = False


LOST = "the interpreter was restarted and this session's variables were lost"


def limit_note(end: CallEnd, limits: CallLimits) -> str:
    """What the code ran into, in words: its CPU limit, or the wall-clock cap while it slept or waited."""
    if end.limit == "wall":
        return (
            f"TimeoutError: the code ran past the {limits.wall_s:g} s wall-clock limit while using "
            f"{end.cpu_s:.2f} s of its {limits.cpu_s:g} s of CPU time (it slept, waited, or got little CPU)"
        )
    return f"TimeoutError: the code used its {limits.cpu_s:g} s of CPU time"


def call_outcome(
    end: CallEnd, limits: CallLimits, exit_code: int | None = None, memory_hint: str = ""
) -> Outcome:
    """The status a call gets, the notes that say why, and whether its interpreter is restarted, from how the
    wait for its reply ended. exit_code: the worker's, where it died (None: unknown)."""
    if end.violation:  # whatever the code forged there is the call's error
        note = f"SandboxError: the code wrote to the sandbox's control channel ({end.violation}); {LOST}"
        return Outcome("error", (note,), restart=True)
    if end.hard_killed:
        what = "the call was cancelled" if end.cancelled else limit_note(end, limits)
        return Outcome("timeout", (f"{what} and did not stop when interrupted; {LOST}",), restart=True)
    if end.died or end.reply is None:
        return Outcome("killed", (_death_note(exit_code, memory_hint),), restart=True)
    status = end.reply["status"]
    if not (end.interrupted or status == "interrupted"):
        return Outcome(status)
    if end.cancelled:
        note = "CancelledError: the caller cancelled the call and it was interrupted"
    else:
        note = f"{limit_note(end, limits)} and was interrupted"
    if end.reply["threads"] > 1:  # threads it started run on: the interpreter cannot be trusted to be idle
        note += f"; threads it started were still running, so {LOST}"
        return Outcome("timeout", (note,), restart=True)
    return Outcome("timeout", (note + "; the session's variables are kept",))


def compose_reply(
    outcome: Outcome, out: _Capture, err: _Capture, duration_s: float, cpu_s: float = 0.0
) -> tuple[dict, bytes, bytes]:
    """The reply frame's header, stdout and stderr: the notes after the code's own stderr; `truncated` when
    either stream lost its middle; `duration_s` wall-clock and `cpu_s` CPU seconds of the call."""
    err_bytes = err.result()
    if outcome.notes:
        if err_bytes and not err_bytes.endswith(b"\n"):
            err_bytes += b"\n"
        err_bytes += ("\n".join(outcome.notes) + "\n").encode()
    out_bytes = out.result()
    header = {
        "status": outcome.status,
        "truncated": out.truncated or err.truncated,
        "duration_s": duration_s,
        "cpu_s": cpu_s,
        "stdout": len(out_bytes),
        "stderr": len(err_bytes),
    }
    return header, out_bytes, err_bytes


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
        self.spare: tuple[_Forked, list[int], bytes] | None = None  # a forked, idle worker, pipes, secret
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
        self.call = 0  # calls so far; the worker's reply must name the current one
        self.pid = os.getpid()
        self.host = _HostInput(0)
        self.key: ChannelKey | None = None  # from the host's first frame
        self.deferred: list[dict] = []  # host requests that arrived during a call
        self.clock: CpuClock | None = None  # the CPU time of the call in progress (or the last one)
        self.only_worker = True  # no process of the code but the worker can be alive (see CpuClock)
        self.denied: list[str] = []  # what the syscall filter denies (set by main)
        self.isolation: dict | None = None  # local mode: the namespaces and mounts around it (set by main)
        # every process here but this one's session is the code's: a container, or (local mode) the PID
        # namespace this process is PID 1 of
        self.contained = mode == "docker" or os.getpid() == 1
        self.sweep = Sweep(mode, workdir, self.contained, self._processes)
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
        if self.mode == "local":  # the code's processes may write only in the scratch folder
            env[CONFINE_ENV] = self.workdir
        return env

    def _processes(self) -> tuple:
        """(worker, template, spare): the handles of the supervisor's processes, None where there is none. A
        spare the template has forked meanwhile is collected first, so that the sweep knows its pid."""
        if self.spare_requested and self.spare is None and self.template_sock is not None:
            with contextlib.suppress(OSError, ValueError):
                if select.select([self.template_sock], [], [], 0)[0]:
                    self._collect_spare()
        return self.worker, self.template, self.spare[0] if self.spare is not None else None

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
            handle, fds, _ = self.spare
            with contextlib.suppress(OSError):
                handle.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                handle.wait(timeout=5)
            for fd in fds:
                os.close(fd)
        self.template, self.template_sock = None, None
        self.spare, self.spare_requested = None, False
        self.sweep.reap()

    def _request_spare(self) -> None:
        os.kill(self.template.pid, signal.SIGCONT)  # in case the code stopped it
        self.template_sock.sendall(b"F")
        self.spare_requested = True

    def _collect_spare(self) -> None:
        import socket

        self.template_sock.settimeout(5)
        message, fds, _, _ = socket.recv_fds(self.template_sock, 20, 4)
        self.spare_requested = False
        if len(message) != 20 or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            raise OSError("the template answered with a short message")
        self.spare = (_Forked(_LEN.unpack(message[:4])[0]), fds, message[4:])

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
                handle, fds, secret = self.spare
                self.spare = None
                # nothing of the code runs now: what sits in the spare's pipes was not written by it
                untouched = _pipe_empty(fds[0])
                for fd in fds[1:]:
                    os.set_blocking(fd, False)
                    _discard(fd)
                with contextlib.suppress(OSError):
                    os.kill(handle.pid, signal.SIGCONT)
                if untouched and handle.poll() is None and self._answers(fds[0], fds[1], secret=secret):
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
        for fd in (self.out_r, self.err_r, self.ctl_r, self.ctl_w):
            os.set_blocking(fd, False)
        self.worker = handle
        try:
            self._request_spare()  # the next one is forked while this session runs
        except OSError:
            self.stop_template()
        return True

    @staticmethod
    def _answers(ctl_w: int, ctl_r: int, timeout_s: float = 5.0, secret: bytes = b"") -> bool:
        """Whether a spare answers a ping on its control pipes: a dying one closes them instead."""
        ping = {"op": "ping", "secret": secret.hex()} if secret else {"op": "ping"}
        try:
            _write_all(ctl_w, encode_frame(ping))
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
        # every process of the code was killed before (restart, reset) or none ever ran (start)
        self.only_worker = self.sweep.clean
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
        for fd in (out_r, err_r, self.ctl_r, self.ctl_w):
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
        self.sweep.kill_strays(keep_worker=False)

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

    # -- between sessions
    def reset(self) -> str:
        """End the session: kill every process of the code, remove the IPC objects, empty the scratch
        folders, then check that all of that holds before a fresh worker is handed over. Returns "" when the
        container is clean, else what is left (the host then replaces the container)."""
        until = time.monotonic() + RESET_BUDGET_S
        self.stop_worker()
        problems = self.sweep.wipe(until)
        if problems:
            return "; ".join(problems)
        if self.preimport and (self.template is None or self.template.poll() is not None):
            self.start_template()  # the code killed it; now none of its processes is left
        self.spawn_worker()
        return ""

    # -- one call
    def run(self, request: dict) -> tuple[dict, bytes, bytes]:
        """One call, in named steps: send the job to the worker, wait for its reply (streaming its output,
        answering a timeout or a cancel), settle what happened (status and notes; restart or reap), and
        compose the reply."""
        started = time.monotonic()
        limits = CallLimits.from_request(request)
        cap = request.get("max_output")
        cap = cap if type(cap) is int and 64 <= cap <= self.max_output else self.max_output
        out, err = _Capture(cap), _Capture(cap)
        pending = self._send_job(request)  # (may restart the worker: its pipes are read after this)
        streams = {self.out_r: out, self.err_r: err}
        end = self._wait_for_reply(pending, streams, limits, started)
        outcome = self._settle(end, streams, limits)  # (may restart the worker again)
        return compose_reply(outcome, out, err, time.monotonic() - started, end.cpu_s)

    def _send_job(self, request: dict) -> memoryview:
        """Start the call: a live worker (restarted if it died), the job frame queued on its control pipe;
        returns what could not be written at once (written as the worker reads, never blocking)."""
        if self.worker is None or self.worker.poll() is not None:
            self.restart_worker()
        self.clock = CpuClock(self.sweep, worker_only=self.only_worker)  # before the code gets its job
        self.call += 1
        code = request.get("code")
        job = {
            "code": code if isinstance(code, str) else "",
            "stateless": bool(request.get("stateless")),
            "echo": bool(request.get("echo")),
            "call": self.call,
            "reap": self.reap_next,
        }
        self.reap_next = []
        with contextlib.suppress(OSError):  # a thread of the code may have stopped it between calls
            os.kill(self.worker.pid, signal.SIGCONT)
        pending = memoryview(encode_frame(job))
        with contextlib.suppress(BlockingIOError, BrokenPipeError):  # most requests fit the pipe at once
            pending = pending[os.write(self.ctl_w, pending[: 1 << 16]) :]
        return pending

    def _wait_for_reply(
        self, pending: memoryview, streams: dict, limits: CallLimits, started: float
    ) -> CallEnd:
        """Until the worker replies: write the rest of the job, capture its output, and when the code has used
        its CPU time, reaches the wall-clock cap or the host cancels, interrupt it, then give up after the
        grace period. A worker that dies or writes to the control channel ends the wait at once."""
        call = CallEnd()
        reply_buf = bytearray()
        watch = [self.ctl_r, self.out_r, self.err_r]
        if not self.host.eof:
            watch.append(self.host.fd)  # a "cancel" from the host interrupts the call at once
        timer = CallTimer(limits, self.clock, started)
        while call.reply is None:
            now = time.monotonic()
            if not call.interrupted:
                reached = "cancel" if call.cancelled else timer.reached(now)
                if reached:
                    call.interrupted = True
                    if reached != "cancel":
                        call.limit = reached
                    with contextlib.suppress(OSError):
                        os.kill(self.worker.pid, signal.SIGINT)
                    timer.grace_until = time.monotonic() + self.grace_s
                    continue
            elif now >= timer.grace_until:
                call.hard_killed = True
                break
            wake = timer.grace_until if call.interrupted else timer.next_look()
            try:
                ready, writable, _ = select.select(
                    watch, [self.ctl_w] if pending else [], [], max(0.0, wake - time.monotonic())
                )
            except InterruptedError:
                continue
            if writable:
                try:
                    pending = pending[os.write(self.ctl_w, pending[: 1 << 16]) :]
                except BlockingIOError:
                    pass
                except OSError:  # the worker is gone
                    call.died = True
                    break
            for fd in ready:
                if fd == self.host.fd:
                    self.host.fill()
                    while (frame := self.host.pop(self.key)) is not None:
                        if frame.get("op") == "cancel":
                            call.cancelled = True
                        else:
                            self.deferred.append(frame)
                    if self.host.eof:  # the host went away: nobody waits for this call
                        call.cancelled = True
                        watch.remove(fd)
                    continue
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if fd == self.ctl_r:
                    if not data:
                        call.died = True
                        break
                    reply_buf += data
                    try:
                        call.reply = _worker_reply(reply_buf, self.call)
                    except _Violation as exc:
                        call.violation = str(exc)
                        break
                elif data:
                    streams[fd].feed(data)
                else:
                    watch.remove(fd)
            if call.died or call.violation:
                break
        call.cpu_s = self.clock.used()
        return call

    def _settle(self, end: CallEnd, streams: dict, limits: CallLimits) -> Outcome:
        """Act on the call's outcome: an interpreter to restart is killed with everything it started, its
        output drained and a fresh one started; otherwise the code's stray processes are reaped (locally only
        after a timeout) before the output pipes are drained, so that a background writer cannot keep the
        call open."""
        exit_code = None
        if end.died and self.worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                exit_code = self.worker.wait(timeout=2)
        outcome = call_outcome(end, limits, exit_code, self.memory_hint)
        swept = True
        if outcome.restart:
            self.kill_code()
        elif outcome.status == "timeout" or self.mode == "docker":
            self.reap_next = self.sweep.kill_strays()
        else:  # locally, what the code started may run on into its next call
            swept = False
        self.only_worker = swept and self.sweep.clean
        self._drain(streams)
        if outcome.restart:
            self.restart_worker()
        return outcome

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

    # -- the host's requests
    def info(self) -> dict:
        return {
            "status": "ok",
            "stdout": 0,
            "stderr": 0,
            "uid": os.getuid(),
            "python": sys.version.split()[0],
            "denied": self.denied,
            **({"isolation": self.isolation} if self.isolation is not None else {}),
        }

    def _send(self, header: dict, out: bytes = b"", err: bytes = b"") -> None:
        frame = encode_frame({**header, "stdout": len(out), "stderr": len(err)}, out, err)
        _write_all(1, self.key.seal(ChannelKey.SUPERVISOR, frame) if self.key is not None else frame)

    def serve(self) -> None:
        try:
            self._serve()
        except (BrokenPipeError, ConnectionResetError, HostGone):  # the host went away: nobody to answer
            pass
        except Tampered as exc:  # the code broke into the channel: end this container, say why if we can
            self.stop_worker()
            with contextlib.suppress(OSError):
                self._send({"status": "error", "tampered": str(exc)[:200]})
        finally:
            self.stop_worker()
            self.stop_template()
            if self.remove_workdir:  # local backend: the host made it for us; gone with us, however we end
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _serve(self) -> None:
        hello = self.host.wait(None)  # before anything of the code can run
        key = hello.get("key")
        if hello.get("op") != "hello" or not isinstance(key, str) or len(key) != 64:
            raise Tampered("the first frame is not the host's hello")
        self.key = ChannelKey(bytes.fromhex(key))
        self.start_template()
        self.spawn_worker()
        self._send(self.info())
        while True:
            request = self.deferred.pop(0) if self.deferred else self.host.wait(self.key)
            op = request.get("op")
            if op == "cancel":  # for a call that has ended already
                continue
            out = err = b""
            if op == "run":
                header, out, err = self._run_guarded(request)
            elif op == "reset":
                problem = self.reset()
                header = {"status": "error", "error": problem} if problem else {"status": "ok"}
            elif op == "ping":
                header = {"status": "ok"}
            else:
                header = {"status": "error", "error": f"unknown op {str(op)[:50]!r}"}
            self._send(header, out, err)

    def _run_guarded(self, request: dict) -> tuple[dict, bytes, bytes]:
        """`run`, but a failure of the supervisor's own (never the code's doing) becomes the call's error
        instead of ending the container: the worker is restarted and the session goes on."""
        started = time.monotonic()
        try:
            return self.run(request)
        except (Tampered, HostGone, BrokenPipeError, ConnectionResetError):
            raise
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.restart_worker()
            message = (
                f"SandboxError: the sandbox runner failed ({exc!r}); the interpreter was restarted and "
                f"this session's variables were lost\n"
            ).encode()
            header = {
                "status": "error",
                "truncated": False,
                "duration_s": time.monotonic() - started,
                "cpu_s": 0.0,
            }
            return header, b"", message


class _HostInput:
    """The host's frames on a non-blocking stdin, buffered: reading never blocks a call in progress."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False
        with contextlib.suppress(OSError):
            os.set_blocking(fd, False)

    def fill(self) -> None:
        while not self.eof:
            try:
                data = os.read(self.fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                self.eof = True
                return
            self.buffer += data

    def pop(self, key: ChannelKey | None) -> dict | None:
        """The next complete frame (checked with `key`; the first frame, unsigned, with None)."""
        if len(self.buffer) < 4:
            return None
        (size,) = _LEN.unpack_from(self.buffer)
        if size > MAX_FRAME:
            raise Tampered(f"a frame of {size} bytes")
        end = 4 + size + (MAC_BYTES if key is not None else 0)
        if len(self.buffer) < end:
            return None
        frame, mac = bytes(self.buffer[: 4 + size]), bytes(self.buffer[4 + size : end])
        del self.buffer[:end]
        if key is not None and not key.verify(ChannelKey.HOST, frame, mac):
            raise Tampered("a frame with a wrong signature")
        try:
            request = json.loads(frame[4:])
        except ValueError as exc:
            raise Tampered("a frame that is not JSON") from exc
        if not isinstance(request, dict):
            raise Tampered("a frame that is not an object")
        return request

    def wait(self, key: ChannelKey | None) -> dict:
        while True:
            request = self.pop(key)
            if request is not None:
                return request
            if self.eof:
                raise HostGone
            with contextlib.suppress(InterruptedError):
                select.select([self.fd], [], [])
            self.fill()


class _Violation(Exception):
    """The worker's control channel carried something the worker never writes: the code forged it."""


WORKER_STATUSES = ("ok", "error", "interrupted")
MAX_WORKER_REPLY = 1024


def _worker_reply(buffer: bytearray, call: int) -> dict | None:
    """The worker's reply to call number `call` once complete (None before); _Violation if it is not
    exactly what the worker writes: {"status": one of WORKER_STATUSES, "threads": int >= 1, "call": call}."""
    if len(buffer) < 4:
        return None
    (size,) = _LEN.unpack_from(buffer)
    if size > MAX_WORKER_REPLY:
        raise _Violation(f"a reply frame of {size} bytes")
    if len(buffer) < 4 + size:
        return None
    if len(buffer) > 4 + size:
        raise _Violation(f"{len(buffer) - 4 - size} bytes after the reply")
    try:
        reply = json.loads(bytes(buffer[4 : 4 + size]))
    except ValueError as exc:
        raise _Violation("a reply that is not JSON") from exc
    if not isinstance(reply, dict) or sorted(reply) != ["call", "status", "threads"]:
        raise _Violation("a reply without exactly the fields status, threads and call")
    if reply["status"] not in WORKER_STATUSES:
        raise _Violation(f"the status {str(reply['status'])[:40]!r}")
    if type(reply["threads"]) is not int or not 1 <= reply["threads"] <= 1_000_000:
        raise _Violation(f"the thread count {str(reply['threads'])[:40]!r}")
    if reply["call"] != call or type(reply["call"]) is not int:
        raise _Violation(f"a reply to call {str(reply['call'])[:40]}, not to call {call}")
    return reply


# One python call's limits, for the host and the runner alike (the host imports them from here: this file ships
# alone into the container). `timeout_s` is CPU time: the seconds of CPU the code uses, in its interpreter and in
# every process it starts, so that a busy machine (a slower share of a core) never fails an honest program.
# `wall_timeout_s` caps the wall-clock time of a call whose code sleeps or waits and so uses no CPU; by default
# WALL_FACTOR times the CPU limit (a program that gets a quarter of a core still uses its whole CPU limit).
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 3600.0
WALL_FACTOR = 4.0


def default_wall_timeout(timeout_s: float) -> float:
    """The wall-clock cap of a call whose CPU limit is `timeout_s` when none is given: WALL_FACTOR times it,
    at most MAX_TIMEOUT_S."""
    return min(MAX_TIMEOUT_S, WALL_FACTOR * timeout_s)


def bounded_timeout(value: object) -> float:
    """A call's time limit as the supervisor applies it: the host validates it (finite, > 0, <= MAX_TIMEOUT_S);
    anything else that reaches here becomes DEFAULT_TIMEOUT_S rather than an exception."""
    if type(value) in (int, float) and 0 < value <= MAX_TIMEOUT_S:
        return float(value)
    return DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class CallLimits:
    """One call's limits: `cpu_s`, the CPU seconds its code may use (its interpreter and every process it starts,
    threads included), and `wall_s` (>= cpu_s), the wall-clock cap for code that sleeps or waits."""

    cpu_s: float = DEFAULT_TIMEOUT_S
    wall_s: float = WALL_FACTOR * DEFAULT_TIMEOUT_S

    @classmethod
    def from_request(cls, request: dict) -> CallLimits:
        """The limits a request asks for as the supervisor applies them: the host validates both (see
        channel.check_limits); anything else that reaches here becomes the defaults rather than an exception."""
        cpu_s = bounded_timeout(request.get("timeout_s"))
        wall = request.get("wall_timeout_s")
        valid = type(wall) in (int, float) and cpu_s <= wall <= MAX_TIMEOUT_S
        return cls(cpu_s, float(wall) if valid else default_wall_timeout(cpu_s))


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
    parser.add_argument(
        "--drop-to", default="", help="uid:gid to become before anything runs (local, as root)"
    )
    parser.add_argument(
        "--hide",
        action="append",
        default=[],
        help="a folder to cover in the runner's mount namespace (local)",
    )
    parser.add_argument(
        "--cgroup",
        action="append",
        default=[],
        help="a cgroup folder to join before anything else (local, as root: its pids and memory limits)",
    )
    parser.add_argument(
        "--pids", type=int, default=0, help="processes and threads at most (local, non-root: RLIMIT_NPROC)"
    )
    parser.add_argument("--isolated", default=None, help=argparse.SUPPRESS)  # set by the runner itself
    args = parser.parse_args(argv)
    covered: list[str] = []
    if args.mode == "local":  # no container around us: make the parts of one that matter first
        covered = _isolate_local(args, argv)
    try:  # first of all, so that every process in the container has it
        denied = install_syscall_filter(
            block_ipc=args.mode == "docker" and sysv_ids("shm") is None,
            block_mqueue=args.mode == "docker" and not os.path.isdir("/dev/mqueue"),
        )
    except OSError as exc:
        if args.mode == "docker":
            raise SystemExit(f"sandbox runner: cannot install the syscall filter: {exc}") from exc
        denied = []  # LocalSandbox is no security boundary; where seccomp is missing it runs without
    if args.mode == "local":  # the template and the workers confine their writes (_confine_from_env)
        problems = isolation_problems(args.workdir, covered)
        if landlock_abi() < 1:
            problems.append("Landlock is not available here, so writes cannot be confined")
        if problems:
            refuse_to_start("; ".join(problems))
    supervisor = Supervisor(
        args.mode,
        args.python,
        args.workdir,
        args.max_output,
        min(10.0, max(0.1, args.grace)),  # the host's GRACE_RANGE_S: a runner never waits longer
        args.memory_hint,
        args.memory_bytes,
        tuple(name for name in args.preimport.split(",") if name),
        args.remove_workdir,
    )
    supervisor.denied = denied
    if args.mode == "local":
        abi = landlock_abi()
        supervisor.isolation = {
            "namespaces": ["mount", "pid", "network", "ipc", *(["user"] if args.drop_to == "" else [])],
            "read_only": "/",
            "covered": [path for path in covered if os.path.isdir(path)],
            "sockets_covered": sum(not os.path.isdir(path) for path in covered),
            "pids": args.pids or None,
            "landlock_scopes": [*LANDLOCK_SCOPES.values()] if abi >= LANDLOCK_SCOPES_SINCE else [],
        }
    supervisor.serve()


def _isolate_local(args, argv: list[str]) -> list[str]:
    """The runner's namespaces and mounts (see `isolate`), made before anything of the code exists; returns
    the folders covered. The first run of this file unshares, forks and sets up the mounts, then the child
    (PID 1 of the new namespaces, no longer root) runs this file again with --isolated."""
    if args.isolated is not None:
        return json.loads(args.isolated)
    for folder in args.cgroup:  # first: every process of the runner, and of the code, is counted there
        try:
            with open(os.path.join(folder, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:
            refuse_to_start(f"cannot join the cgroup {folder} that bounds its processes and memory: {exc}")
    unix_sockets = listening_unix_sockets()  # this network namespace's, before the runner leaves it
    drop = None
    if os.geteuid() == 0:
        if not args.drop_to:
            refuse_to_start("started as root without --drop-to: refusing to run model-written code as root")
        uid, gid = (int(part) for part in args.drop_to.split(":"))
        drop = (uid, gid)
    try:
        child = enter_namespaces()
    except OSError as exc:
        refuse_to_start(
            f"cannot make the namespaces the local sandbox needs (user, mount, PID, network, IPC) here: {exc}; "
            "without them it would run with this host's network and processes in reach, so it does not run"
        )
    if child:
        wait_outside(child, args.workdir if args.remove_workdir else None)
    if args.pids > 0 and drop is None:  # counted in the runner's own user namespace: its processes only
        import resource

        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (args.pids, args.pids))
        except (OSError, ValueError) as exc:
            refuse_to_start(f"cannot bound its processes to {args.pids} (RLIMIT_NPROC): {exc}")
    needed = [sys.base_prefix, sys.prefix, os.path.abspath(__file__), os.path.realpath(sys.executable)]
    try:
        covered = isolate(args.workdir, args.hide, needed, other_user=drop is not None, sockets=unix_sockets)
        if drop is not None:
            become(*drop)
    except OSError as exc:
        refuse_to_start(f"cannot set up the local sandbox's mount namespace here: {exc}")
    script = os.path.abspath(__file__)
    os.execv(sys.executable, [sys.executable, "-I", script, *argv, "--isolated", json.dumps(covered)])


def refuse_to_start(reason: str) -> None:
    """Answer the host's hello with `reason` (signed: no code has run yet, so the key is still secret) and
    exit: the host raises it as a SandboxError instead of a runner that merely went away."""
    os.write(2, f"sandbox runner: {reason}\n".encode())
    with contextlib.suppress(Exception):
        hello = _HostInput(0).wait(None)
        key = hello.get("key")
        if hello.get("op") == "hello" and isinstance(key, str) and len(key) == 64:
            frame = encode_frame({"status": "error", "error": reason[:2000], "stdout": 0, "stderr": 0})
            _write_all(1, ChannelKey(bytes.fromhex(key)).seal(ChannelKey.SUPERVISOR, frame))
    os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
