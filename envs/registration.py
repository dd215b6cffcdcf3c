"""Registration of the built-in environments under `stare_agents/<Name>-v<N>` (runs on `import stare_agents.envs`)."""

from __future__ import annotations

import gymnasium as gym

NAMESPACE = "stare_agents"

# id -> (entry point, one-line description). Versions bump when behaviour changes incompatibly.
ENVIRONMENTS: dict[str, tuple[str, str]] = {
    f"{NAMESPACE}/MathTIR-v0": (
        "stare_agents.envs.math_envs:MathTIREnv",
        "multi-turn math with a stateful Python sandbox session per episode (SimpleTIR/ToRL style)",
    ),
    f"{NAMESPACE}/MathCoT-v0": (
        "stare_agents.envs.math_envs:MathCoTEnv",
        "single-turn chain-of-thought math (cot='short' or 'long')",
    ),
    f"{NAMESPACE}/ArithmeticTIR-v0": (
        "stare_agents.envs.arithmetic:ArithmeticTIREnv",
        "seeded, offline integer problems that need the Python tool",
    ),
    f"{NAMESPACE}/PythonUnitTest-v0": (
        "stare_agents.envs.python_unittest:PythonUnitTestEnv",
        "write a function; reward = fraction of hidden unit tests passing in the sandbox",
    ),
}


def register_envs() -> None:
    """Register every built-in environment with gymnasium (idempotent)."""
    for env_id, (entry_point, _) in ENVIRONMENTS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)


def env_class(env_id: str) -> type:
    """The class (or creator) registered under `env_id`."""
    entry_point = gym.spec(env_id).entry_point
    return entry_point if callable(entry_point) else gym.envs.registration.load_env_creator(entry_point)


def split_kwargs(env_id: str, kwargs: dict, split: str) -> dict:
    """`kwargs` for drawing tasks of `split` ("train" or "heldout"): environments whose constructor takes a
    `split` keyword (e.g. ArithmeticTIR-v0) get it, unless `kwargs` already sets one; others are returned as
    they are (their held-out tasks come from seeds, or from a benchmark file)."""
    import inspect

    if "split" in kwargs:
        return dict(kwargs)
    try:
        takes_split = "split" in inspect.signature(env_class(env_id)).parameters
    except (TypeError, ValueError):
        takes_split = False
    return {**kwargs, "split": split} if takes_split else dict(kwargs)
