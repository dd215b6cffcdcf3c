"""A run is one tree's code: `stare-agents train` refuses a stare_agents from one checkout with train/, envs/ and
sandbox/ from another (an editable install's mapping under a PYTHONPATH that points elsewhere), naming both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _other_checkout(tmp_path: Path) -> Path:
    """A second tree that holds stare_agents/ only, as a worktree run with this checkout's environment sees it."""
    tree = tmp_path / "worktree"
    shutil.copytree(ROOT / "stare_agents", tree / "stare_agents", ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _run(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


def test_this_checkout_is_one_tree():
    from stare_agents.provenance import mixed_tree

    assert mixed_tree() is None


def test_train_refuses_mixed_code_and_writes_nothing(tmp_path):
    tree = _other_checkout(tmp_path)
    probe = "import stare_agents.provenance as p; print(p.mixed_tree())"
    said = _run(tree, "-c", probe).stdout
    assert f"stare_agents is imported from {tree / 'stare_agents'}" in said
    assert f"stare_agents.train from {ROOT / 'train'}" in said and "stare_agents.envs from" in said
    out = tmp_path / "run"
    result = _run(tree, "-m", "stare_agents.cli", "train", "--recipe", "tiny", "--out", str(out))
    assert result.returncode == 2 and "mixed code" in result.stderr and not out.exists()
    # linked into the tree, the packages are the tree's own: nothing to say
    for name in ("train", "envs", "sandbox"):
        (tree / "stare_agents" / name).symlink_to(ROOT / name, target_is_directory=True)
    assert _run(tree, "-c", probe).stdout.strip() == "None"
