"""`--import MODULE` and `env.imports` find a module in the folder the command runs from, as uvicorn and celery
find their app (issue 30, item 6): the console script `stare-agents` (which, unlike `python -m`, does not put
the current folder on the path) from a fresh temporary folder holding the module, with no PYTHONPATH. The
README's "Adding an environment" walk-through runs there as written, `eval` included (its class entry point)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import require

ROOT = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).with_name("stare-agents")

USER_MODULE = '''
import gymnasium as gym

from stare_agents.envs import Score, Task, TextEnv, extract_boxed
from stare_agents.eval.benchmarks import PROTOCOLS, Protocol


class EchoEnv(TextEnv):
    """Single turn: answer the number in the problem in \\\\boxed{}."""

    def sample_task(self) -> Task:
        n = int(self.np_random.integers(0, 100))
        return Task(problem=f"Write {n}.", answer=str(n), id=f"echo-{n}")

    def score(self, task: Task, response: str) -> Score:
        answer = extract_boxed(response)
        correct = answer is not None and answer.strip() == task.answer
        return Score(float(correct), "correct" if correct else "wrong", correct, answer)


gym.register("my_envs/Echo-v0", entry_point="my_envs:EchoEnv")
PROTOCOLS["echo"] = Protocol(name="echo", env_id="my_envs/Echo-v0", max_tokens_per_turn=8, max_total_tokens=8)
'''


def stare_agents(folder: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The console script in `folder`, as a user runs it there: no PYTHONPATH, nothing of the tests."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_CURRENT_TEST")}
    environment.update(OMP_NUM_THREADS="1", STARE_ALLOW_LOCAL_SANDBOX="1", COLUMNS="200")
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A fresh working folder with the user's module in it (and not importable from anywhere else)."""
    (tmp_path / "my_envs.py").write_text(USER_MODULE)
    return tmp_path


def test_envs_check_imports_a_module_of_the_current_folder(folder: Path):
    result = stare_agents(folder, "envs", "check", "my_envs/Echo-v0", "--import", "my_envs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok my_envs/Echo-v0 passed check_env" in result.stdout


def test_train_imports_a_module_of_the_current_folder_by_flag_and_by_config(folder: Path):
    """The environment is imported and checked before anything runs: a keyword it does not take is refused
    by name (not 'No module named my_envs')."""
    for imports in (["--import", "my_envs"], ["env.imports=[my_envs]"]):
        result = stare_agents(
            folder, "train", "--recipe", "tiny", *imports, "env.id=my_envs/Echo-v0", "env.kwargs={bogus: 1}"
        )
        output = result.stdout + result.stderr
        assert result.returncode == 2, output
        assert "No module named" not in output
        assert "env.kwargs.bogus=1: my_envs/Echo-v0 (EchoEnv) takes no keyword 'bogus'" in output


def test_rollout_and_eval_run_a_module_of_the_current_folder(folder: Path):
    """A real episode of the user's environment with the tiny model, in this process and in a Ray worker,
    and an evaluation with the protocol the module registers."""
    require(CONSOLE_SCRIPT.exists(), "the stare-agents console script", "pip install -e .")
    model = stare_agents(folder, "model", "tiny")
    assert model.returncode == 0, model.stderr
    for workers in ("0", "1"):
        out = folder / f"rollouts-{workers}.jsonl"
        result = stare_agents(
            folder,
            *(
                "rollout",
                "--env",
                "my_envs/Echo-v0",
                "--import",
                "my_envs",
                "--model",
                "tiny",
                "--engine",
                "hf",
            ),
            *(
                "--sandbox",
                "none",
                "--num-tasks",
                "1",
                "--max-tokens-per-turn",
                "4",
                "--max-total-tokens",
                "4",
            ),
            *("--workers", workers, "--out", str(out)),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        [trajectory] = [json.loads(line) for line in out.read_text().split("\n") if line]
        assert trajectory["env_id"] == "my_envs/Echo-v0" and not trajectory["error"]
    (folder / "bench.jsonl").write_text(json.dumps({"id": "a", "problem": "Write 7.", "answer": "7"}) + "\n")
    result = stare_agents(
        folder,
        *("eval", "--import", "my_envs", "--protocol", "echo", "--model", "tiny", "--engine", "hf"),
        *("--benchmark", "bench.jsonl", "--sandbox", "local", "--bootstrap", "0", "--out", "evaluation"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((folder / "evaluation" / "results.json").read_text())
    assert results["settings"]["protocol"]["env_id"] == "my_envs/Echo-v0"
    assert results["benchmarks"]["bench"]["samples_done"] == 1


@pytest.mark.parametrize("command", ["train", "rollout", "envs check", "eval"])
def test_help_says_the_current_folder_is_searched(command: str):
    """The console script's own help text, from the app it runs (in this process: the tests above start the
    console script itself; four more interpreters only to print help cost ~15 s of CPU)."""
    from typer.testing import CliRunner

    from stare_agents.cli import app

    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "current folder" in " ".join(result.output.split())


def test_the_readme_walk_through_runs_from_a_fresh_folder(tmp_path: Path):
    """README "Adding an environment": save its code block as custom_env.py, then run the command it gives,
    as written (the Docker sandbox, the default)."""
    from stare_agents.sandbox import docker_status

    available, reason = docker_status()
    require(available, "Docker and the sandbox image", reason)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Adding an environment", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None and "examples/custom_env.py" in section
    (tmp_path / "custom_env.py").write_text(code.group(1))
    commands = re.findall(r"`(stare-agents envs check [^`]+)`", section)
    assert commands == ["stare-agents envs check my_envs/NthPrime-v0 --import custom_env"]
    result = stare_agents(tmp_path, *commands[0].split()[1:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok my_envs/NthPrime-v0 passed check_env" in result.stdout
    # `eval` on the same registration (a class as the entry point, issue 49 item 2), with a protocol a module
    # adds as the section says, on the tiny model
    (tmp_path / "nth_protocol.py").write_text(
        "import custom_env  # noqa: F401 (registers my_envs/NthPrime-v0 with its class)\n"
        "from stare_agents.eval.benchmarks import PROTOCOLS, Protocol\n"
        'PROTOCOLS["nthprime"] = Protocol(name="nthprime", env_id="my_envs/NthPrime-v0", '
        "max_tokens_per_turn=8, max_total_tokens=16)\n"
    )
    (tmp_path / "bench.jsonl").write_text(
        json.dumps({"id": "p1", "problem": "What is the 1000-th prime number?", "answer": "7919"}) + "\n"
    )
    assert stare_agents(tmp_path, "model", "tiny").returncode == 0
    result = stare_agents(
        tmp_path,
        *("eval", "--import", "nth_protocol", "--protocol", "nthprime", "--model", "tiny", "--engine", "hf"),
        *("--benchmark", "bench.jsonl", "--sandbox", "local", "--bootstrap", "0", "--out", "evaluation"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "evaluation" / "results.json").read_text())
    assert results["settings"]["protocol"]["max_turns"] == 3  # NthPrimeEnv.default_max_turns
    assert results["benchmarks"]["bench"]["samples_done"] == 1
