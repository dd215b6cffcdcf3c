"""A new environment in 28 lines: find the n-th prime with the Python tool (registered as my_envs/NthPrime-v0)."""

import gymnasium as gym
import sympy

from stare_agents.envs import Score, Task, ToolEnv, check_env, extract_boxed


class NthPrimeEnv(ToolEnv):
    """Multi-turn: the policy may run Python, then answers in \\boxed{}. The base class does the rest."""

    default_max_turns = 3

    def sample_task(self) -> Task:  # seeded by reset(seed=...) through self.np_random
        n = int(self.np_random.integers(1_000, 100_000))
        return Task(problem=f"What is the {n}-th prime number?", answer=str(sympy.prime(n)), id=f"prime-{n}")

    def score(self, task: Task, response: str) -> Score:  # exact match; the default would use math-verify
        answer = extract_boxed(response)
        correct = answer is not None and answer.strip() == task.answer
        return Score(float(correct), "correct" if correct else "wrong", correct, answer)


gym.register("my_envs/NthPrime-v0", entry_point=NthPrimeEnv)

if __name__ == "__main__":
    check_env(gym.make("my_envs/NthPrime-v0"))
    print("my_envs/NthPrime-v0 passes check_env")
