"""No message or comment still says that the sandbox falls back to the local backend (issue 30, item 7): the
sandbox fails closed, so without Docker a job refuses to start and says why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the project's own text: scripts, sources, docs (the virtual environment and tests' own fixtures aside)
SOURCES = ["scripts", "stare_agents", "envs", "sandbox", "train", "docs", "examples", "README.md"]
SUFFIXES = {".sh", ".py", ".md", ".yaml", ".toml", ""}
# "will fall back to the local backend", "falls back to the host", "else the local backend": a promise of a
# fallback that does not exist (a sentence saying it never happens is fine)
FALLBACK = re.compile(
    r"(?<!never )(?<!not )\bfall(s|ing)? back to (the )?(local|host)\b|\belse (to )?the local backend\b",
    re.IGNORECASE,
)


def project_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return files


def test_no_text_promises_a_fallback_to_the_local_backend():
    assert any(p.name == "run.sh" for p in project_files())
    wrong = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in project_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").split("\n"), 1)
        if FALLBACK.search(line)
    ]
    assert wrong == []


def test_run_sh_says_the_job_refuses_to_start_without_docker():
    text = (ROOT / "scripts" / "run.sh").read_text(encoding="utf-8")
    assert "refuses to start" in text and "stare-agents sandbox doctor" in text
