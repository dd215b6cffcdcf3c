"""The wheel carries every file a command reads: built from the checkout (`pip wheel --no-deps`), installed into a
folder outside it (`pip install --no-deps --target`) and run from another folder, it shows every recipe's config,
checks environments and takes the tiny recipe's first RL step. Issue 48, item 1."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
from support import require
from wheel_support import REPO

from stare_agents.train.config import recipe_names

pytestmark = pytest.mark.slow  # builds the wheel once per session (about 20 s)

PACKAGE_DIRS = {
    "stare_agents": "stare_agents",
    "envs": "stare_agents/envs",
    "sandbox": "stare_agents/sandbox",
}
PACKAGE_DIRS["train"] = "stare_agents/train"


def test_the_wheel_holds_every_file_of_the_package_folders(installed_wheel):
    """Every file the checkout tracks in the package folders is in the wheel (at its package path), but the
    folders' READMEs: recipes, prompts, the sandbox's build context, the viewer's assets, the code."""
    tracked = subprocess.run(
        ["git", "ls-files", *PACKAGE_DIRS], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    names = set(zipfile.ZipFile(installed_wheel.wheel).namelist())
    expected = {
        PACKAGE_DIRS[path.split("/", 1)[0]] + "/" + path.split("/", 1)[1]
        for path in tracked
        if not path.endswith("README.md") and (REPO / path).is_file()
    }
    assert expected - names == set()
    for must in ("stare_agents/train/recipes/tiny.yaml", "stare_agents/sandbox/Dockerfile"):
        assert must in names
    assert {f"stare_agents/train/recipes/{r}.yaml" for r in recipe_names()} <= names


DRIVER = r"""
import json, sys
from pathlib import Path
from typer.testing import CliRunner
import stare_agents, stare_agents.train, stare_agents.envs
from stare_agents.cli import app
from stare_agents.train.config import recipe_names

target = Path(sys.argv[1]).resolve()
where = {m.__name__: str(Path(m.__file__).resolve()) for m in (stare_agents, stare_agents.train, stare_agents.envs)}
assert all(p.startswith(str(target)) for p in where.values()), where
runner = CliRunner()
shown = {}
for recipe in recipe_names():
    done = runner.invoke(app, ["train", "--recipe", recipe, "--show-config"])
    shown[recipe] = [done.exit_code, done.output[:200] if done.exit_code else done.output.count("\n")]
checked = {}
for env_id in sys.argv[2:]:
    done = runner.invoke(app, ["envs", "check", env_id])
    checked[env_id] = [done.exit_code, done.output[-300:]]
missing = runner.invoke(app, ["train", "--recipe", "short-cot-qwen2.5-math-7b"])
print(json.dumps({"where": where, "recipes": recipe_names(), "shown": shown, "checked": checked,
                  "missing": [missing.exit_code, missing.output]}))
"""


def test_every_recipe_shows_its_config_and_the_environments_check_from_the_installed_wheel(
    installed_wheel, tmp_path
):
    from stare_agents.sandbox import docker_status

    require(*docker_status())  # ArithmeticTIR-v0 runs its checks in the Docker sandbox, as `envs check` does
    envs = ["stare_agents/MathCoT-v0", "stare_agents/ArithmeticTIR-v0"]
    done = installed_wheel.run(
        [sys.executable, "-c", DRIVER, str(installed_wheel.target), *envs], cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(report["recipes"]) == sorted(recipe_names())  # the wheel's recipes are the checkout's
    assert all(code == 0 and lines > 20 for code, lines in report["shown"].values()), report["shown"]
    assert all(code == 0 for code, _ in report["checked"].values()), report["checked"]
    code, output = report["missing"]  # a recipe naming a data file the package does not ship
    assert code == 2 and "env.kwargs.dataset='data/dapo_math_17k.jsonl': no such file" in output
    assert "stare-agents envs prepare-dapo-math --out data/dapo_math_17k.jsonl" in output


def test_the_tiny_recipe_takes_its_first_rl_step_from_the_installed_wheel(installed_wheel, tmp_path):
    run = tmp_path / "run"
    done = installed_wheel.run(
        [
            str(installed_wheel.console_script),
            "train",
            "--recipe",
            "tiny",
            "--out",
            str(run),
            "rl.steps=1",
            "sft.enabled=false",
            "rollout.sandbox=none",
            "eval.num_tasks=2",
        ],
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in records if r["kind"] == "rl"]
    assert step["step"] == 0 and step["learner/tokens"] > 0
    assert (
        "memory plan" in done.stderr and "rl memory plan" in done.stderr
    )  # planned before the learner loaded
