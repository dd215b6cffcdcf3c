"""A test environment whose reward random text earns half the time, so that GRPO groups have variance
and a tiny random model actually learns (imported by the trainer tests and by their subprocesses)."""

from __future__ import annotations

import gymnasium as gym

from stare_agents.envs import Score, Task, TextEnv


class CoinEnv(TextEnv):
    """Single turn; reward 1 when the response has an even number of characters."""

    def sample_task(self) -> Task:
        n = int(self.np_random.integers(100))
        return Task(problem=f"Say something ({n}).", answer="even", id=f"coin-{n}")

    def score(self, task: Task, response: str) -> Score:
        even = len(response) % 2 == 0
        return Score(float(even), "correct" if even else "wrong", even, str(len(response)))


if "tests/Coin-v0" not in gym.registry:
    gym.register("tests/Coin-v0", entry_point=CoinEnv)
