"""`check_env`: catch a broken text environment before training does.

In the spirit of `gymnasium.utils.env_checker.check_env`, for environments whose actions are text and whose
observations are lists of messages. It checks:

* the spaces: the action space contains text (including non-ASCII), the observation space contains lists;
* `reset`: returns (observation, info) of the right types, every message has exactly role/content/inline
  strings with a known role, the observation is in the observation space, `info` has the standard keys;
* seeding: the same seed gives the same prompt and info; `options={"problem", "answer"}` pins the task;
* `step`: returns a 5-tuple of (messages, finite float reward within `reward_range`, bool, bool, dict);
  an episode ends within `max_turns` steps; the final observation is `[]` and the final info has the
  `FINAL_INFO_KEYS` with no `reward_violation`; `step` after the end raises `gymnasium.error.ResetNeeded`;
  the same seed and actions replay the same transitions;
* `close()`: works, twice.

Scripted actions cover an empty string, a wrong boxed answer, odd Unicode and a tool call; the checker never
needs a model.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import data_equivalence

from stare_agents.envs.core import FINAL_INFO_KEYS, INFO_KEYS, ROLES, is_finite_number

PROBE_ACTIONS: tuple[str, ...] = (
    "",
    "I think the answer is \\boxed{0}.",
    "Ünïcödé ✓ 𝔸𝕟𝕤𝕨𝕖𝕣 — 答案 \u200b\ufeff \\boxed{-1}",
    "Let me compute.\n```python\nprint(6 * 7)\n```",
)


class EnvCheckError(AssertionError):
    """Raised by `check_env` with a message that names the failed check."""


def _fail(message: str) -> None:
    raise EnvCheckError(message)


def check_messages(observation: Any, where: str) -> None:
    """Every observation is a list of {"role", "content", "inline"} string dicts with a known role."""
    if not isinstance(observation, list):
        _fail(f"{where}: the observation must be a list of messages, got {type(observation).__name__}")
    for index, item in enumerate(observation):
        if not isinstance(item, dict):
            _fail(f"{where}: message {index} must be a dict, got {type(item).__name__}")
        if set(item) != {"role", "content", "inline"}:
            _fail(
                f"{where}: message {index} must have exactly the keys role, content, inline; got {sorted(item)}"
            )
        if item["role"] not in ROLES:
            _fail(f"{where}: message {index} has role {item['role']!r}; expected one of {ROLES}")
        for key in ("content", "inline"):
            if not isinstance(item[key], str):
                _fail(f"{where}: message {index} {key} must be str, got {type(item[key]).__name__}")


def _check_info(info: Any, where: str) -> None:
    if not isinstance(info, dict):
        _fail(f"{where}: info must be a dict, got {type(info).__name__}")
    missing = [key for key in INFO_KEYS if key not in info]
    if missing:
        _fail(f"{where}: info lacks the standard keys {missing}")


def _check_reset(env: gym.Env, seed: int, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
    result = env.reset(seed=seed, options=options)
    if not (isinstance(result, tuple) and len(result) == 2):
        _fail(f"reset() must return (observation, info), got {type(result).__name__}")
    observation, info = result
    check_messages(observation, "reset()")
    if not observation:
        _fail("reset() returned no messages: the first observation is the prompt")
    if observation not in env.observation_space:
        _fail("reset(): the observation is not in env.observation_space")
    _check_info(info, "reset()")
    return observation, info


def _run_episode(env: gym.Env, seed: int, actions: list[str]) -> list[tuple[Any, ...]]:
    """Reset with `seed`, then step with `actions` (cycled) until the episode ends; return the transitions."""
    unwrapped = env.unwrapped
    max_turns = int(getattr(unwrapped, "max_turns", 16))
    reward_range = getattr(unwrapped, "reward_range", (-float("inf"), float("inf")))
    _check_reset(env, seed)
    transitions = []
    for turn in range(max_turns + 1):
        if turn == max_turns:
            _fail(f"the episode did not end within max_turns={max_turns} steps")
        action = actions[turn % len(actions)]
        if action not in env.action_space:
            _fail(f"the action space does not contain the probe action {action[:40]!r}")
        result = env.step(action)
        if not (isinstance(result, tuple) and len(result) == 5):
            _fail("step() must return (observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = result
        where = f"step {turn + 1} ({action[:30]!r})"
        check_messages(observation, where)
        if observation not in env.observation_space:
            _fail(f"{where}: the observation is not in env.observation_space")
        if not is_finite_number(reward):
            _fail(f"{where}: the reward must be a finite number, got {reward!r}")
        if not reward_range[0] <= float(reward) <= reward_range[1]:
            _fail(f"{where}: reward {reward} is outside reward_range {reward_range}")
        if not isinstance(terminated, bool) or not isinstance(truncated, bool):
            _fail(
                f"{where}: terminated and truncated must be bool, got {type(terminated)}, {type(truncated)}"
            )
        _check_info(info, where)
        transitions.append((observation, float(reward), terminated, truncated, _comparable(info)))
        if terminated or truncated:
            missing = [key for key in FINAL_INFO_KEYS if key not in info]
            if missing:
                _fail(f"{where}: the info of the episode's last step lacks {missing}")
            if info["reward_violation"] is not None:
                _fail(f"{where}: {info['reward_violation']} (reward_range is {reward_range})")
            if observation != []:
                _fail(
                    f"{where}: the observation after the episode's end must be [], got {observation!r:.200}"
                )
            try:
                env.step(actions[0])
            except gym.error.ResetNeeded:
                pass
            except Exception as error:
                _fail(
                    f"step() after the episode ended must raise gymnasium.error.ResetNeeded, not {error!r:.100}"
                )
            else:
                _fail(
                    "step() after the episode ended must raise gymnasium.error.ResetNeeded (call reset() first)"
                )
            return transitions
        if reward != 0.0:
            _fail(f"{where}: rewards come at the end of the episode; got {reward} mid-episode")
    return transitions


def _comparable(info: dict) -> dict:
    """info without timing fields, for replay comparison."""
    return {key: value for key, value in info.items() if "duration" not in key and key != "score_details"}


def check_env(
    env: gym.Env, *, seed: int = 0, actions: list[str] | None = None, check_pinning: bool = True
) -> None:
    """Check that `env` follows the text-environment contract; raise `EnvCheckError` naming the failure.

    Args:
        env: an environment, bare or from `gymnasium.make` (wrappers are fine).
        seed: the seed used for the determinism checks.
        actions: scripted policy texts for the step checks (default: `PROBE_ACTIONS`, each as its own episode).
        check_pinning: also check that `reset(options=...)` pins the task (with the environment's
            `example_task_options`, whose problem text the checker replaces with its own).
    """
    if not isinstance(env, gym.Env):
        _fail(f"check_env expects a gymnasium.Env, got {type(env).__name__}")
    if "ünïcode ✓ 答案" not in env.action_space:
        _fail(f"the action space {env.action_space} must contain any Unicode text")
    if [] not in env.observation_space:
        _fail(f"the observation space {env.observation_space} must contain lists of messages")

    first, first_info = _check_reset(env, seed)
    again, again_info = _check_reset(env, seed)
    if not data_equivalence(first, again):
        _fail(f"reset(seed={seed}) twice gave different observations: the task sampling is not seeded")
    if first_info.get("task_id") != again_info.get("task_id"):
        _fail(
            f"reset(seed={seed}) twice gave different tasks ({first_info.get('task_id')} vs {again_info.get('task_id')})"
        )

    if check_pinning:
        problem = "What is 2 + 3? (pinned by check_env)"
        pin = dict(getattr(env.unwrapped, "example_task_options", {"answer": "5"}), problem=problem)
        observation, _ = _check_reset(env, seed, options=pin)
        if not any(problem in item["content"] for item in observation):
            _fail("reset(options={'problem': ...}) did not put the given problem in the prompt")

    for action in actions or list(PROBE_ACTIONS):
        run = _run_episode(env, seed, [action])
        replay = _run_episode(env, seed, [action])
        if not data_equivalence(run, replay):
            _fail(
                f"the same seed and actions ({action[:40]!r}) gave different transitions: step is not deterministic"
            )

    env.close()
    env.close()
