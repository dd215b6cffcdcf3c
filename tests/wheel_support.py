"""The package as users install it: a wheel built from this checkout, installed into a folder of its own, run from a
folder outside the checkout with only that folder (and the venv's dependencies) to import from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    target: Path  # `pip install --target`: the package and its console script (bin/stare-agents)

    @property
    def console_script(self) -> Path:
        return self.target / "bin" / "stare-agents"

    def env(self) -> dict[str, str]:
        """The environment of a command run from the wheel: the target first on the path, nothing of the checkout
        (the venv's editable install resolves after it), one thread."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
        return {**env, "PYTHONPATH": str(self.target), "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}

    def run(self, args: list[str], cwd: Path, timeout: float, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            args, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout, **kwargs
        )


def source_tree(folder: Path) -> Path:
    """The checkout's files as a clean clone has them (tracked, or untracked and not ignored), copied into `folder`:
    a wheel built in the checkout itself would also carry whatever setuptools left in its build/ folder (a recipe
    renamed since the last build, say). Outside a git checkout (an unpacked sdist): the checkout itself."""
    if not (REPO / ".git").exists():
        return REPO
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet staged is listed too
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def build_and_install(folder: Path) -> InstalledWheel:
    """`pip wheel --no-deps` of the checkout's files (`source_tree`), then `pip install --no-deps --target` of that
    wheel."""
    wheels, target = folder / "wheels", folder / "site"
    source = source_tree(folder / "source")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = wheels.glob("stare_agents-*.whl")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return InstalledWheel(wheel, target)
