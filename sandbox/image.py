"""Building the sandbox image: from `sandbox/Dockerfile` with a registry, or offline with debootstrap.

Offline route (no registry, e.g. CI machines): debootstrap a minimal Debian with Python, numpy, sympy and
scipy from a Debian mirror, add the non-root `sandbox` user, strip setuid bits and caches, and
`docker import` the tree. Both routes give an image with `python3` on PATH, user 1000:1000 and /tmp as the
working directory; the runner itself is passed in by the host at container start.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from stare_agents.sandbox.docker_backend import DEFAULT_IMAGE
from stare_agents.sandbox.errors import SandboxError

DOCKERFILE = Path(__file__).with_name("Dockerfile")
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# The mirror is plain HTTP: what makes it safe is the archive's signature on the Release file (which holds
# every package's sha256), so debootstrap must check it and refuse to go on without it.
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
DEBIAN_PACKAGES = ("python3", "python3-numpy", "python3-sympy", "python3-scipy")
SANDBOX_UID = 1000
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    'LABEL org.opencontainers.image.title="stare-agents sandbox"',
    f"USER {SANDBOX_UID}:{SANDBOX_UID}",
    "WORKDIR /tmp",
    'CMD ["python3"]',
)

Log = Callable[[str], None]


def _docker_cli() -> str:
    docker = shutil.which("docker")
    if docker is None:
        raise SandboxError("the `docker` command is missing: install docker.io (apt-get install docker.io)")
    return docker


def image_exists(tag: str = DEFAULT_IMAGE) -> bool:
    probe = subprocess.run([_docker_cli(), "image", "inspect", tag], capture_output=True)
    return probe.returncode == 0


def build_from_dockerfile(tag: str = DEFAULT_IMAGE, log: Log = print) -> None:
    """`docker build` of sandbox/Dockerfile (needs a registry for python:3.11-slim and PyPI)."""
    log(f"building {tag} from {DOCKERFILE}")
    with open(DOCKERFILE, "rb") as dockerfile:  # no build context: the Dockerfile copies nothing in
        result = subprocess.run([_docker_cli(), "build", "--tag", tag, "-"], stdin=dockerfile)
    if result.returncode != 0:
        raise SandboxError(
            f"docker build of {tag} failed (exit {result.returncode}); without a registry use "
            f"`stare-agents sandbox build --offline`"
        )


def debootstrap_command(
    debootstrap: str, rootfs: Path, mirror: str, keyring: Path | None = None
) -> list[str]:
    """The debootstrap call: signatures checked against the Debian archive keyring, and never skipped
    (`--force-check-gpg`: a missing key or gpgv is an error, not a warning followed by unsigned packages,
    whose scripts would run as root)."""
    keyring = keyring or DEBIAN_KEYRING
    if not keyring.is_file():
        raise SandboxError(
            f"the offline build verifies the Debian archive's signature with {keyring}, which is missing: "
            "apt-get install debian-archive-keyring gpgv (scripts/provision_docker.sh does)"
        )
    if shutil.which("gpgv") is None:
        raise SandboxError(
            "the offline build verifies signatures with gpgv, which is missing: apt-get install gpgv"
        )
    return [
        debootstrap,
        "--variant=minbase",
        "--force-check-gpg",
        f"--keyring={keyring}",
        f"--include={','.join(DEBIAN_PACKAGES)}",
        DEBIAN_SUITE,
        str(rootfs),
        mirror,
    ]


def debootstrap_rootfs(rootfs: Path, mirror: str = DEBIAN_MIRROR, log: Log = print) -> None:
    """A minimal Debian with Python and the maths packages in `rootfs` (needs root and debootstrap)."""
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None
    )
    if debootstrap is None:
        raise SandboxError("the offline build needs debootstrap: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise SandboxError("the offline build runs debootstrap, which needs root: run it as root")
    command = debootstrap_command(debootstrap, rootfs, mirror)
    log(f"$ {' '.join(command)}   (about 90 s)")
    result = subprocess.run(command)
    if result.returncode != 0:
        raise SandboxError(f"debootstrap failed (exit {result.returncode}); see its output above")


def prepare_rootfs(rootfs: Path) -> None:
    """Add the sandbox user; remove setuid/setgid bits, package caches, docs and the compiler. Idempotent."""
    passwd, group = rootfs / "etc/passwd", rootfs / "etc/group"
    if f":{SANDBOX_UID}:" not in passwd.read_text():
        with passwd.open("a") as f:
            f.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/tmp:/usr/sbin/nologin\n")
    if f":{SANDBOX_UID}:" not in group.read_text():
        with group.open("a") as f:
            f.write(f"sandbox:x:{SANDBOX_UID}:\n")
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / folder).glob("*"):
            if path.is_file():
                path.unlink()
    # documentation, and the C compiler scipy's packages pull in (no compiling in the sandbox: ~300 MB)
    for path in (
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/include",
        "usr/lib/gcc",
        "usr/libexec/gcc",
    ):
        shutil.rmtree(rootfs / path, ignore_errors=True)
    for dirpath, _, filenames in os.walk(rootfs):
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))


def import_rootfs(rootfs: Path, tag: str, log: Log = print) -> None:
    """`tar -C rootfs -c . | docker import - tag` with the image settings."""
    docker = _docker_cli()
    command = [docker, "import"]
    for change in IMAGE_CHANGES:
        command += ["--change", change]
    command += ["-", tag]
    log(f"importing {rootfs} as {tag}")
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None
    result = subprocess.run(command, stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    tar_code = tar.wait()
    if tar_code != 0 or result.returncode != 0:
        raise SandboxError(f"importing the rootfs failed (tar exit {tar_code}): {result.stderr.strip()}")


def build_offline(
    tag: str = DEFAULT_IMAGE, *, mirror: str = DEBIAN_MIRROR, rootfs: Path | None = None, log: Log = print
) -> None:
    """The image from a Debian mirror only (no registry).

    rootfs: a folder to keep the debootstrapped tree in and to reuse on the next build (skips debootstrap
    when it already holds one); by default a temporary folder that is removed afterwards.
    """
    temporary = rootfs is None
    root = Path(tempfile.mkdtemp(prefix="stare-sandbox-rootfs-", dir="/var/tmp")) if temporary else rootfs
    try:
        if (root / "usr/bin/python3").exists():
            log(f"reusing the Debian tree in {root}")
        else:
            root.mkdir(parents=True, exist_ok=True)
            debootstrap_rootfs(root, mirror, log)
        check = subprocess.run(
            ["chroot", str(root), "python3", "-c", "import numpy, scipy, sympy"],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise SandboxError(f"the Debian tree in {root} lacks numpy/scipy/sympy: {check.stderr.strip()}")
        prepare_rootfs(root)
        import_rootfs(root, tag, log)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
    log(f"built {tag}")


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    offline: bool = False,
    mirror: str = DEBIAN_MIRROR,
    rootfs: Path | None = None,
    log: Log = print,
) -> None:
    if offline:
        build_offline(tag, mirror=mirror, rootfs=rootfs, log=log)
    else:
        build_from_dockerfile(tag, log=log)
