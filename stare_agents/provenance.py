"""Whether the code that runs is one tree's: stare_agents and the packages a checkout keeps beside it.

In a checkout, `train/`, `envs/` and `sandbox/` sit beside `stare_agents/` and an editable install maps them to
`stare_agents.train`, `.envs` and `.sandbox` by absolute path (in a wheel they are inside `stare_agents/`). Put
another checkout first on PYTHONPATH (a worktree at a fixed commit, run with the main checkout's virtual
environment) and `stare_agents` comes from that checkout while the three mapped packages still come from the
installed one: a run of mixed code that no config, log or commit shows. `mixed_tree()` says so, and
`stare-agents train` refuses to start on it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

BESIDE = ("train", "envs", "sandbox")  # the packages a checkout keeps beside stare_agents/


def package_dir(name: str) -> Path:
    """The folder the package `name` is imported from (not resolved: a link inside the tree counts as the tree)."""
    module = importlib.import_module(name)
    return Path(module.__file__).parent.absolute()  # type: ignore[arg-type]


def mixed_tree() -> str | None:
    """None when stare_agents.train, .envs and .sandbox come from stare_agents' own tree (inside its folder, as in
    a wheel, or beside it, as in a checkout); else a message naming each package's folder and the fix."""
    home = package_dir("stare_agents")
    elsewhere = {}
    for name in BESIDE:
        where = package_dir(f"stare_agents.{name}")
        if where not in (home / name, home.parent / name):
            elsewhere[name] = where
    if not elsewhere:
        return None
    listed = ", ".join(f"stare_agents.{name} from {where}" for name, where in elsewhere.items())
    return (
        f"mixed code: stare_agents is imported from {home} but {listed}. An editable install of another checkout "
        "maps these packages to its own folders, and PYTHONPATH puts this one's stare_agents first. Use this "
        f"checkout's own environment (bash scripts/setup.sh in {home.parent}), install it (pip install -e "
        f"{home.parent}), or link the packages into it (ln -s ../train {home / 'train'}, and so for envs and sandbox)"
    )
