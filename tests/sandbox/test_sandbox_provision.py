"""The image build and the provisioning script fail closed: debootstrap must verify the Debian archive's
signatures, and the provisioning lock cannot be redirected by another user (no world-writable /var/lock)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stare_agents.sandbox import SandboxError
from stare_agents.sandbox import image as image_module

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "provision_docker.sh"


def test_debootstrap_checks_signatures_and_never_skips_them(tmp_path):
    keyring = tmp_path / "keyring.gpg"
    with pytest.raises(SandboxError, match="debian-archive-keyring"):
        image_module.debootstrap_command("debootstrap", tmp_path / "root", "http://mirror", keyring)
    keyring.write_bytes(b"k")
    command = image_module.debootstrap_command("debootstrap", tmp_path / "root", "http://mirror", keyring)
    assert "--force-check-gpg" in command and f"--keyring={keyring}" in command
    assert "--no-check-gpg" not in command
    assert Path("/usr/share/keyrings/debian-archive-keyring.gpg") == image_module.DEBIAN_KEYRING


def test_provisioning_installs_the_keyring_and_locks_outside_var_lock():
    text = SCRIPT.read_text()
    for script in (SCRIPT, SCRIPT.with_name("provision_browser.sh"), SCRIPT.with_name("_lock.sh")):
        assert "/var/lock" not in script.read_text().replace("world-writable /var/lock", ""), script
    assert "debian-archive-keyring" in text and "gpgv" in text


def run_script(lock_dir: Path, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    env = {**os.environ, "STARE_LOCK_DIR": str(lock_dir)}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "script", [SCRIPT, SCRIPT.with_name("provision_browser.sh")], ids=["docker", "browser"]
)
@pytest.mark.parametrize("kind", ["symlink", "foreign", "world-writable"])
def test_a_planted_lock_folder_is_refused_before_anything_runs(tmp_path, kind, script):
    target = tmp_path / "victim"
    target.mkdir()
    lock_dir = tmp_path / "lock"
    if kind == "symlink":  # another user points the lock at a file root would truncate
        lock_dir.symlink_to(target)
    elif kind == "foreign":
        if os.geteuid() != 0:
            pytest.skip("needs root to make a folder owned by someone else")
        lock_dir.mkdir()
        os.chown(lock_dir, 65534, 65534)
    else:
        lock_dir.mkdir()
        lock_dir.chmod(0o777)
    done = run_script(lock_dir, script)
    assert done.returncode == 1 and "refusing the lock folder" in done.stdout, done
    assert "installing" not in done.stdout and "engine" not in done.stdout  # stopped before step 1
    assert list(target.iterdir()) == []
