"""Tasks and options are validated at reset, with errors that carry the value and the remedy; a failed
reset or step leaves the environment as it was."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest

from stare_agents.envs import MathTIREnv, Score, Task, TextEnv, Tool, ToolOutput
from stare_agents.sandbox import SandboxError

PINNED = {"problem": "What is 6 times 7?", "answer": "42"}
CODE = "```python\n{}\n```"


@pytest.mark.parametrize(
    ("env_id", "options", "error", "match"),
    [
        ("stare_agents/MathCoT-v0", {"problem": "1+1?"}, ValueError, "has no reference answer"),
        (
            "stare_agents/MathCoT-v0",
            {"problem": "1+1?", "answer": "  "},
            ValueError,
            "has no reference answer",
        ),
        ("stare_agents/ArithmeticTIR-v0", {"problem": "p", "answer": "3.5"}, ValueError, "integer string"),
        ("stare_agents/ArithmeticTIR-v0", {"problem": "p", "answer": "x"}, ValueError, "integer string"),
        ("stare_agents/ArithmeticTIR-v1", {"problem": "p", "answer": "1e3"}, ValueError, "integer string"),
        (
            "stare_agents/ArithmeticTIR-v1",
            {"problem": "p", "answer": "9" * 4001},
            ValueError,
            "integer string",
        ),
        (
            "stare_agents/MathCoT-v0",
            {"index": None},
            TypeError,
            r"options\['index'\] must be an integer in \[0, 20\), got None",
        ),
        (
            "stare_agents/MathCoT-v0",
            {"index": 10**9},
            IndexError,
            r"index'\]=1000000000 is out of range: .* 20 rows \(0..19\)",
        ),
        ("stare_agents/MathCoT-v0", {"index": -1}, IndexError, "out of range"),
        ("stare_agents/MathCoT-v0", {"index": True}, TypeError, "must be an integer"),
        ("stare_agents/MathCoT-v0", {"index": "3"}, TypeError, "must be an integer"),
        (
            "stare_agents/MathCoT-v0",
            {"answer": "5"},
            ValueError,
            r"options \{'answer'\} must pick the task one way",
        ),
        ("stare_agents/MathCoT-v0", {"problem": "p", "index": 1}, ValueError, "one way"),
        ("stare_agents/MathCoT-v0", {"index": 0, "answer": "5"}, ValueError, "'index' takes no other keys"),
        ("stare_agents/MathCoT-v0", {"task": "What is 1+1?"}, TypeError, r"options\['task'\] must be a Task"),
        (
            "stare_agents/MathCoT-v0",
            {"problem": ["p"], "answer": "1"},
            TypeError,
            r"options\['problem'\] must be a str",
        ),
        (
            "stare_agents/MathCoT-v0",
            {"problem": "p", "answer": {"x": 1}},
            TypeError,
            r"options\['answer'\] must be a str",
        ),
        ("stare_agents/PythonUnitTest-v0", {"problem": "p", "answer": "5"}, ValueError, "needs 'tests'"),
    ],
)
def test_bad_tasks_and_options_fail_at_reset(env_id: str, options: dict, error: type, match: str) -> None:
    env = gym.make(env_id)
    with pytest.raises(error, match=match):
        env.reset(seed=0, options=options)


def test_dataset_rows_without_answers_fail_at_reset() -> None:
    env = gym.make("stare_agents/MathCoT-v0", dataset=[{"problem": "1+1?"}])
    with pytest.raises(ValueError, match=r"no reference answer.*override validate_task"):
        env.reset(seed=0)


def test_numpy_seeds_and_indices_are_integers() -> None:
    env = gym.make("stare_agents/MathCoT-v0")
    by_int, _ = env.reset(seed=3)
    by_numpy, _ = env.reset(seed=np.int64(3))
    assert by_int == by_numpy
    assert env.reset(options={"index": np.int32(4)})[1]["task_id"] == "demo-4"
    with pytest.raises(TypeError, match="seed must be an integer"):
        env.reset(seed=3.0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        env.reset(seed=-1)


def test_a_failed_reset_leaves_the_episode_running(local_sandbox) -> None:
    env = MathTIREnv(sandbox=local_sandbox)
    env.reset(seed=0, options=PINNED)
    env.step(CODE.format("x = 41"))
    with pytest.raises(ValueError, match="no reference answer"):
        env.reset(options={"problem": "unanswerable"})
    obs, *_ = env.step(CODE.format("print(x + 1)"))  # same episode, same session
    assert obs[0]["content"] == "42" and env.turn == 2
    env.close()


class FlakyScore(TextEnv):
    """Its score fails once (a bug outside the policy's reach), then works."""

    failures: ClassVar[list[int]] = [1]

    def sample_task(self) -> Task:
        return Task(problem="p", answer="1", id="t")

    def score(self, task: Task, response: str) -> Score:
        if self.failures:
            self.failures.pop()
            raise RuntimeError("grader backend unavailable")
        return Score(1.0, "correct", True)


def test_a_failed_step_leaves_the_state_as_it_was() -> None:
    env = FlakyScore(max_turns=1)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="grader backend unavailable"):
        env.step("answer")
    assert (env.turn, env.responses, env.stats.tool_calls, env.final_score) == (0, [], 0, None)
    _, reward, terminated, _, info = env.step("answer")  # the retry is the episode's first turn
    assert (reward, terminated, info["turn"]) == (1.0, True, 1)


def test_a_sandbox_failure_is_raised_not_shown_to_the_policy() -> None:
    def broken(arguments: dict) -> ToolOutput:
        raise SandboxError("no local interpreters left")

    class Env(MathTIREnv):
        def tools(self) -> dict[str, Tool]:
            return {"python": Tool("python", "run", {"type": "object"}, broken)}

    env = Env()
    env.reset(seed=0, options=PINNED)
    with pytest.raises(SandboxError, match="no local interpreters left"):
        env.step(CODE.format("print(1)"))
    assert (env.turn, env.stats.tool_calls, env.responses) == (0, 0, [])
