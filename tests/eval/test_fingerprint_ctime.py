"""The weight fingerprint cache is keyed on the ctime too (issue 32, item 8): a weight file rewritten in place
with its size kept and its mtime set back (`os.utime`, `touch -d`, `cp -p`) is hashed again, not answered
from the cache with the old file's sha256."""

from __future__ import annotations

import hashlib
import os
import time

from stare_agents.models import file_sha256


def test_a_file_rewritten_in_place_with_its_old_mtime_is_hashed_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    first = os.stat(weights)
    assert file_sha256(weights) == hashlib.sha256(b"a" * 4096).hexdigest()
    time.sleep(0.05)  # past the file system's timestamp granularity
    with open(weights, "r+b") as handle:  # same inode, same size, other content
        handle.write(b"b" * 4096)
    os.utime(weights, ns=(first.st_atime_ns, first.st_mtime_ns))  # the old mtime back
    again = os.stat(weights)
    assert (again.st_ino, again.st_size, again.st_mtime_ns) == (
        first.st_ino,
        first.st_size,
        first.st_mtime_ns,
    )
    assert again.st_ctime_ns != first.st_ctime_ns  # what nobody can set back
    assert file_sha256(weights) == hashlib.sha256(b"b" * 4096).hexdigest()
