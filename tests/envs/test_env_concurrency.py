"""Environments stepped concurrently the way the rollout layer does it (`asyncio.to_thread`, one env per
trajectory), sharing one sandbox and one grader pool: every episode gets exactly its own results."""

from __future__ import annotations

import asyncio

import gymnasium as gym

from stare_agents.envs import MathGrader

CODE = "```python\n{}\n```"


def episode(env_id: str, env: gym.Env, index: int) -> list[tuple]:
    """Three episodes whose tool output depends on the episode: a mixed-up session or grade shows."""
    results = []
    for episode_index in range(3):
        secret = index * 100 + episode_index
        if env_id == "stare_agents/PythonUnitTest-v0":
            env.reset(options={"problem": "p", "tests": [f"assert f() == {secret}"]})
            _, reward, terminated, _, info = env.step(CODE.format(f"def f():\n    return {secret}"))
            results.append((reward, terminated, info["tool_calls"]))
            continue
        env.reset(seed=secret, options={"problem": f"What is {secret} + 1?", "answer": str(secret + 1)})
        if env.unwrapped.tool_format == "hermes":
            action = f'<tool_call>{{"name": "python", "arguments": {{"code": "v = {secret}\\nprint(v + 1)"}}}}</tool_call>'
        else:
            action = CODE.format(f"v = {secret}\nprint(v + 1)")
        obs, *_ = env.step(action)
        assert obs[0]["content"] == str(secret + 1), (index, obs)
        obs, *_ = env.step(
            action.replace(f"v = {secret}\\n", "").replace(f"v = {secret}\n", "").replace("v + 1", "v")
        )
        assert obs[0]["content"] == str(secret), (index, obs)  # the episode's own session kept v
        _, reward, terminated, _, info = env.step(f"\\boxed{{{secret + 1}}}")
        results.append((reward, terminated, info["tool_calls"]))
    return results


def test_eight_envs_in_threads_share_one_sandbox_and_one_grader(local_sandbox) -> None:
    ids = [
        "stare_agents/ArithmeticTIR-v0",
        "stare_agents/MathTIR-v0",
        "stare_agents/MathTIR-v0",
        "stare_agents/PythonUnitTest-v0",
    ] * 2
    with MathGrader(timeout_s=10.0, workers=2) as grader:
        envs = []
        for index, env_id in enumerate(ids):
            kwargs = {"tool_format": "hermes"} if index == 2 else {}
            envs.append(gym.make(env_id, sandbox=local_sandbox, grader=grader, **kwargs))

        async def main() -> list[list[tuple]]:
            return await asyncio.gather(
                *(
                    asyncio.to_thread(episode, env_id, env, i)
                    for i, (env_id, env) in enumerate(zip(ids, envs, strict=True))
                )
            )

        results = asyncio.run(main())
        for env_id, result in zip(ids, results, strict=True):
            if "UnitTest" in env_id:
                assert result == [(1.0, True, 1)] * 3
            else:
                assert result == [(1.0, True, 2)] * 3, (env_id, result)
        assert grader.stats.timeouts == 0
        for env in envs:
            env.close()
