"""Gymnasium conventions: the turn limit is `spec.max_episode_steps`, a TimeLimit (from `gym.make` or by
hand) ends an episode graded and closed, `ResetNeeded`, a sane `sample()`, `render_fps`, vector envs."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit

from stare_agents.envs import ENVIRONMENTS, MathTIREnv, UnicodeText

PINNED = {"problem": "What is 6 times 7?", "answer": "42"}
CODE = "```python\nprint({})\n```"


def test_max_turns_is_the_specs_max_episode_steps() -> None:
    assert gym.make("stare_agents/MathTIR-v0").spec.max_episode_steps == 4
    assert gym.make("stare_agents/ArithmeticTIR-v0", max_turns=6).spec.max_episode_steps == 6
    assert gym.make("stare_agents/MathCoT-v0").spec.max_episode_steps == 1
    assert MathTIREnv().spec is None  # not made by gymnasium.make: no spec at all


@pytest.mark.parametrize("how", ["make", "wrapper"])
def test_a_time_limit_grades_the_episode_and_closes_the_session(local_sandbox, how: str) -> None:
    if how == "make":
        env = gym.make("stare_agents/MathTIR-v0", sandbox=local_sandbox, max_episode_steps=2)
        assert env.spec.max_episode_steps == 2
    else:
        env = TimeLimit(MathTIREnv(sandbox=local_sandbox), max_episode_steps=2)
    env.reset(seed=0, options=PINNED)
    _, _, terminated, truncated, info = env.step(CODE.format(1))
    assert not terminated and not truncated and info["tool_calls"] == 1
    obs, reward, terminated, truncated, info = env.step(CODE.format(2))
    assert (obs, reward, terminated, truncated) == ([], 0.0, False, True)
    assert info["truncated"] and info["grade_reason"] == "no_answer" and info["tool_calls"] == 1
    assert env.unwrapped.tools()["python"]._session is None  # handed back at the limit
    # a longer limit than the environment's own changes nothing; the next episode starts afresh
    long = TimeLimit(MathTIREnv(sandbox=local_sandbox, max_turns=2), max_episode_steps=10)
    long.reset(seed=0, options=PINNED)
    long.step(CODE.format(1))
    assert long.step(CODE.format(2))[3] is True
    env.close()


def test_step_outside_an_episode_raises_reset_needed(local_sandbox) -> None:
    env = MathTIREnv(sandbox=local_sandbox)
    with pytest.raises(gym.error.ResetNeeded, match="before reset"):
        env.step("\\boxed{1}")
    env.reset(seed=0, options=PINNED)
    env.step("\\boxed{42}")
    with pytest.raises(gym.error.ResetNeeded, match="after the episode ended"):
        env.step("\\boxed{42}")


def test_action_space_samples_are_short_and_in_the_space() -> None:
    space = UnicodeText(max_length=16 * 1024 * 1024)
    space.seed(0)
    started = time.perf_counter()
    samples = [space.sample() for _ in range(1000)]
    assert time.perf_counter() - started < 2.0
    assert max(len(s) for s in samples) <= 256 and min(len(s) for s in samples) == 0
    assert all(s in space for s in samples)
    assert len(space.sample(mask=(1000, None))) == 1000  # an explicit length still works


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_metadata_declares_render_modes_and_fps(env_id: str) -> None:
    metadata = gym.spec(env_id).entry_point
    env_class = gym.envs.registration.load_env_creator(metadata)
    assert env_class.metadata == {"render_modes": ["ansi"], "render_fps": 1}


@pytest.mark.parametrize(("mode", "kwargs"), [("sync", {}), ("async", {"shared_memory": False})])
def test_vector_envs(mode: str, kwargs: dict) -> None:
    """Observations are lists of messages, which no shared-memory buffer holds: AsyncVectorEnv needs
    shared_memory=False (documented in envs/README.md)."""
    venv = gym.make_vec("stare_agents/MathCoT-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=kwargs)
    obs, info = venv.reset(seed=0, options={"problem": "What is 6 times 7?", "answer": "42"})
    assert len(obs) == 2 and all(o[-1]["content"].startswith("What is 6 times 7?") for o in obs)
    obs, reward, terminated, _, info = venv.step(("\\boxed{42}", "\\boxed{41}"))
    assert obs == ([], []) and list(reward) == [1.0, 0.0] and list(terminated) == [True, True]
    assert list(info["grade_reason"]) == ["correct", "wrong"]
    venv.close()


def test_async_vector_envs_share_memory_and_can_do_without() -> None:
    """Gymnasium's default (shared memory) and shared_memory=False give the same observations (the shared
    memory path for every registered env: tests/envs/test_user_env.py)."""
    observations = []
    for vector_kwargs in ({}, {"shared_memory": False}):
        vector = gym.make_vec(
            "stare_agents/MathCoT-v0", num_envs=2, vectorization_mode="async", vector_kwargs=vector_kwargs
        )
        try:
            observations.append(vector.reset(seed=3)[0])
        finally:
            vector.close()
    assert list(observations[0]) == list(observations[1]) and observations[0][0] != observations[0][1]


def test_gymnasium_checks_np_int_seeds_on_the_made_env() -> None:
    env = gym.make("stare_agents/MathCoT-v0")
    assert env.reset(seed=np.int64(5))[1]["task_id"] == env.reset(seed=5)[1]["task_id"]
