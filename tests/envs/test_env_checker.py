"""check_env passes on every registered environment and on the README example, and catches broken ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from typer.testing import CliRunner

from stare_agents.envs import ENVIRONMENTS, EnvCheckError, Score, Task, TextEnv, check_env, message

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"


@pytest.fixture(
    params=["local", pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.timeout(180)])]
)
def sandbox(request: pytest.FixtureRequest):
    return request.getfixturevalue(f"{request.param}_sandbox")


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_every_registered_env_passes(env_id: str, sandbox) -> None:
    spec = gym.spec(env_id)
    module, _, name = str(spec.entry_point).partition(":")
    env_class = getattr(importlib.import_module(module), name)
    kwargs = {"sandbox": sandbox} if env_class.uses_sandbox else {}
    made = gym.make(env_id, **kwargs)
    check_env(made)
    # and gymnasium's own checker (random actions from the action space, space sampling, seeding), on the
    # env built by make: the checker re-makes it from its spec, deep-copying the kwargs, and a sandbox's
    # deep copy is the sandbox itself.
    gymnasium_check_env(made.unwrapped, skip_render_check=True)


def test_readme_example_is_short_and_passes(local_sandbox) -> None:
    source = EXAMPLE.read_text()
    assert len(source.splitlines()) <= 30
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    section = readme[readme.index("### Adding an environment") :]
    assert section[section.index("```python\n") + 10 :].startswith(source)  # the README shows this file
    spec = importlib.util.spec_from_file_location("custom_env_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers my_envs/NthPrime-v0
    env = gym.make("my_envs/NthPrime-v0", sandbox=local_sandbox)
    check_env(env)
    env = gym.make("my_envs/NthPrime-v0", sandbox=local_sandbox)
    env.reset(seed=7)
    task = env.unwrapped.task
    obs, *_ = env.step(f"```python\nimport sympy\nprint(sympy.prime({task.id.split('-')[1]}))\n```")
    _, reward, terminated, _, _ = env.step(f"\\boxed{{{obs[0]['content']}}}")
    assert (reward, terminated) == (1.0, True)
    env.close()


# -- broken environments the checker must reject ---------------------------------------------------------------
class Arith(TextEnv):
    def sample_task(self) -> Task:
        a = int(self.np_random.integers(100))
        return Task(problem=f"{a} + 1 = ?", answer=str(a + 1), id=str(a))

    def score(self, task: Task, response: str) -> Score:
        return Score(float(str(task.answer) in response), "checked")


class Unseeded(Arith):
    counter = 0

    def sample_task(self) -> Task:
        Unseeded.counter += 1
        return Task(problem=f"{Unseeded.counter} + 1 = ?", answer="0", id=str(Unseeded.counter))


class BadMessages(Arith):
    def prompt(self, task: Task) -> list[Any]:
        return [{"role": "user", "content": task.problem}]  # no "inline"


class BadRole(Arith):
    def prompt(self, task: Task) -> list[Any]:
        return [message("user", task.problem) | {"role": "robot"}]


class RewardOutOfRange(Arith):
    def score(self, task: Task, response: str) -> Score:
        return Score(5.0, "too much")


class NaNReward(Arith):
    def score(self, task: Task, response: str) -> Score:
        return Score(float("nan"), "nan")


class NeverEnds(Arith):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_turns=3, **kwargs)

    def step(self, action: str):  # ignores the turn limit
        return [], 0.0, False, False, self._info(void_turn=False, finished=False, truncated=False)


class IgnoresPinning(Arith):
    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)


class RandomFeedback(Arith):
    """Multi-turn with feedback drawn from an unseeded source: replay differs."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_turns=2, **kwargs)

    def respond(self, action: str):
        import random

        from stare_agents.envs.core import Turn

        return Turn(observation=[message("user", str(random.random()))])


@pytest.mark.parametrize(
    ("env_class", "match"),
    [
        (Unseeded, "not seeded"),
        (BadMessages, "exactly the keys"),
        (BadRole, "role 'robot'"),
        (RewardOutOfRange, "outside reward_range"),
        (NaNReward, "finite number"),
        (NeverEnds, "did not end within max_turns"),
        (IgnoresPinning, "pins|pinned|did not put"),
        (RandomFeedback, "not deterministic"),
    ],
)
def test_checker_rejects_broken_envs(env_class: type, match: str) -> None:
    with pytest.raises(EnvCheckError, match=match):
        check_env(env_class())


def test_checker_accepts_a_minimal_text_env() -> None:
    check_env(Arith())


def test_cli_list_and_check() -> None:
    from stare_agents.envs.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0
    assert "MathTIR-v0" in listed.output
    refused = runner.invoke(app, ["check", "stare_agents/ArithmeticTIR-v0", "--backend", "local"])
    assert refused.exit_code != 0 and "STARE_ALLOW_LOCAL_SANDBOX" in str(
        refused.exception
    )  # not acknowledged
    checked = runner.invoke(
        app,
        ["check", "stare_agents/ArithmeticTIR-v0", "--backend", "local"],
        env={"STARE_ALLOW_LOCAL_SANDBOX": "1"},
    )
    assert checked.exit_code == 0, checked.output
    assert "passed check_env" in checked.output
    unknown = runner.invoke(app, ["check", "stare_agents/Nope-v0"])
    assert unknown.exit_code == 2
