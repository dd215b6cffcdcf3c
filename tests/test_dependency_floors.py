"""Version floors exclude releases with known holes, and what is installed meets them."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def floors() -> dict[str, Version]:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found = {}
    for spec in dependencies:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec.split(";")[0].strip())
        if match:
            found[match.group(1).lower()] = Version(match.group(2))
    return found


def test_floors_exclude_known_holes():
    floor = floors()
    assert floor["torch"] >= Version(
        "2.6"
    )  # torch.load(weights_only=True) bypass (CVE-2025-32434) before 2.6
    assert floor["ray"] >= Version("2.52")  # no token authentication before 2.52


@pytest.mark.parametrize("name", ["torch", "ray"])
def test_the_installed_version_meets_its_floor(name):
    installed = Version(importlib.metadata.version(name).split("+")[0])
    assert installed >= floors()[name], f"{name} {installed} is below the floor {floors()[name]}"


def test_the_docs_start_ray_with_token_auth():
    """The README's cluster example and docs/cluster.md's steps: no head node started without token auth."""
    root = PYPROJECT.parent
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "ray start --head" not in text.replace("RAY_AUTH_MODE=token ray start --head", ""), page
    for page in (root / "README.md", root / "docs" / "cluster.md"):
        assert "ray get-auth-token --generate" in page.read_text(), page
